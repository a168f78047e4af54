-- awp.request_cancel(run_id): records the durable intent to cancel a run (cancel_requested_at).
-- A run with nothing leased is converged at once (dispatches, tasks and the run canceled);
-- otherwise the coordinator converges it (awp.converge_cancellations). A terminal run is returned
-- unchanged. Raises AWNTF for an unknown run.
-- Locks: the run row, then its live dispatches (fixed order Run, then Dispatch).
CREATE OR REPLACE FUNCTION awp.request_cancel(p_run_id text)
RETURNS TABLE (run_id text, status text, cancel_requested_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  IF NOT awp._request_cancel(p_run_id) THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
  PERFORM awp._log_flush();
  RETURN QUERY SELECT x.run_id, x.status, x.cancel_requested_at FROM awp.runs x WHERE x.run_id = p_run_id;
END $$;
COMMENT ON FUNCTION awp.request_cancel(text) IS 'Requests cancellation of a run (durable intent; converged at once when nothing is leased, else by the coordinator); AWNTF when unknown.';

-- awp._request_cancel(run): the body of awp.request_cancel, also for a parent run's cancel that cancels its running
-- children (awp._converge_cancel; docs/dynamic.md). False when the run does not exist. Locks: as awp.request_cancel.
CREATE OR REPLACE FUNCTION awp._request_cancel(p_run_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r awp.runs;
BEGIN
  SELECT * INTO r FROM awp.runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF r.status IN ('pending', 'running') THEN
    IF r.cancel_requested_at IS NULL THEN
      UPDATE awp.runs x SET cancel_requested_at = awp._now() WHERE x.run_id = p_run_id;
      PERFORM awp._append_event(p_run_id, 'run', p_run_id, r.status, r.status, 'cancel requested');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM awp.dispatches d
                    WHERE d.run_id = p_run_id AND d.status = 'leased') THEN
      PERFORM awp._converge_cancel(p_run_id);
    ELSE
      PERFORM awp._wake('awp_coordinator', 'cancel_requested');
    END IF;
  END IF;
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._request_cancel(text) IS 'Records a run''s cancellation (converged at once when nothing is leased); false when unknown.';

-- awp.cancel_waiting_runs(executor_kind, limit): prunes a backlog that no worker serves: requests cancellation
-- (as awp.request_cancel, each run converged at once when nothing of it is leased) of up to `limit` (1-1000) live
-- runs that have a ready task of `executor_kind`, oldest first; returns how many. The backlog shows in
-- awp.executor_stats() (`ready` of a kind with no free slot) and in the runs' wait reasons (docs/limits.md).
-- Raises AWREQ for a limit out of range. Locks: each run's row with SKIP LOCKED (a run busy elsewhere is left
-- for the next call), then as awp.request_cancel.
CREATE OR REPLACE FUNCTION awp.cancel_waiting_runs(p_executor_kind text, p_limit integer DEFAULT 1000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run text;
  v_n   integer := 0;
BEGIN
  IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND awp._limit_page_rows() THEN
    PERFORM awp._raise_invalid_request('invalid limit', format('limit must be 1-%s', awp._limit_page_rows()));
  END IF;
  FOR v_run IN
    SELECT r.run_id FROM awp.runs r
     WHERE r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
       AND EXISTS (SELECT 1 FROM awp.tasks t
                    WHERE t.run_id = r.run_id AND t.status = 'ready' AND t.executor = p_executor_kind)
     ORDER BY r.created_at, r.run_id
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED
  LOOP
    PERFORM awp.request_cancel(v_run);
    v_n := v_n + 1;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.cancel_waiting_runs(text, integer) IS 'Requests cancellation of up to limit live runs with a ready task of an executor kind (oldest first); returns the count.';
