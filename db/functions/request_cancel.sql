-- awp.request_cancel(run_id): records the durable intent to cancel a run (cancel_requested_at).
-- A run with nothing leased is converged at once (dispatches, tasks and the run canceled);
-- otherwise the coordinator converges it (awp.converge_cancellations). A terminal run is returned
-- unchanged. Raises AWNTF for an unknown run.
-- Locks: the run row, then its live dispatches (fixed order Run, then Dispatch).
CREATE OR REPLACE FUNCTION awp.request_cancel(p_run_id text)
RETURNS TABLE (run_id text, status text, cancel_requested_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r awp.runs;
BEGIN
  SELECT * INTO r FROM awp.runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
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
  PERFORM awp._log_flush();
  RETURN QUERY SELECT x.run_id, x.status, x.cancel_requested_at FROM awp.runs x WHERE x.run_id = p_run_id;
END $$;
COMMENT ON FUNCTION awp.request_cancel(text) IS 'Requests cancellation of a run (durable intent; converged at once when nothing is leased, else by the coordinator); AWNTF when unknown.';
