-- awp.drain_worker(worker_id, session_token): graceful shutdown of a session.
-- active -> draining (claims nothing new; still heartbeats and completes), or straight to
-- stopped when it holds no lease; draining with no lease left -> stopped (stopped_at).
-- Returns the worker summary row (as awp.get_worker). Raises AWSES (offline/stopped/unknown).
-- Locks: the worker row.
CREATE OR REPLACE FUNCTION awp.drain_worker(p_worker_id text, p_session_token text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[],
               max_concurrency integer, active_leases integer, last_heartbeat_at timestamptz,
               registered_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  w     awp.workers := awp._session(p_worker_id, p_session_token, true);
  v_now timestamptz := awp._now();
BEGIN
  IF NOT EXISTS (SELECT 1 FROM awp.dispatches d WHERE d.worker_id = p_worker_id AND d.status = 'leased') THEN
    UPDATE awp.workers x SET status = 'stopped', stopped_at = v_now, last_heartbeat_at = v_now,
                             draining_at = coalesce(x.draining_at, v_now)
     WHERE x.worker_id = p_worker_id;
  ELSIF w.status = 'active' THEN
    UPDATE awp.workers x SET status = 'draining', draining_at = v_now, last_heartbeat_at = v_now
     WHERE x.worker_id = p_worker_id;
  END IF;
  PERFORM awp._wake('awp_coordinator', 'worker_draining');
  RETURN QUERY SELECT * FROM awp._worker_rows(p_worker_id);
END $$;
COMMENT ON FUNCTION awp.drain_worker(text, text) IS 'Drains a worker session: draining while it holds leases, then stopped; returns its summary; AWSES.';
