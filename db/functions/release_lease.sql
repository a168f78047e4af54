-- Drain without loss (docs/protocol.md, Drain; AWP issue 41): a worker that gives up a lease it cannot finish
-- (its shutdown timeout passed) releases it, so the task goes back to the queue at once, its attempt not counted
-- against max_attempts; an operator asks a worker to drain (POST /workers/{id}/drain with the operator token,
-- `awp worker drain`), which the worker sees at its next heartbeat (awp.worker_status).

-- awp.release_lease(worker_id, session_token, dispatch_id, lease_token, reason): gives a lease back. Fenced like
-- awp.complete_task, checks in this order:
--   1. session (AWSES); reason one of awp._release_reasons() (AWREQ)
--   2. unknown dispatch, another worker's, or a wrong lease token                      -> AWLST
--   3. not leased (completed, expired, canceled), lease expired, attempt deadline passed,
--      run canceled, cancel requested or not running                                   -> AWLST
-- Then the dispatch expires with its attempt: attempt interrupted with error_code = the reason (worker_shutdown),
-- not counted against max_attempts (attempts.counted false, like a lease lost to an outage: awp._end_attempt, at
-- most 100 such attempts per task), the task waiting_retry due now, and the coordinator is woken to make it ready
-- and dispatch it again at once. Events: dispatch leased -> expired, attempt running -> interrupted, task
-- running -> waiting_retry, each with the reason "released by its worker (worker_shutdown)".
-- Returns the task's new status (waiting_retry; failed only past the uncounted-attempt cap with no attempt left).
-- Locks: as awp.complete_task: the run's transaction advisory lock, then Run, then Dispatch, then the task row.
CREATE OR REPLACE FUNCTION awp.release_lease(p_worker_id text, p_session_token text, p_dispatch_id text,
                                             p_lease_token text, p_reason text)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r        awp.runs;
  d        awp.dispatches;
  v_now    timestamptz;
  v_why    text;
  v_to     text;
BEGIN
  PERFORM awp._session(p_worker_id, p_session_token, false);   -- AWSES first
  IF p_reason IS NULL OR p_reason <> ALL (awp._release_reasons()) THEN
    PERFORM awp._raise_invalid_request('invalid reason',
      format('reason must be one of: %s', array_to_string(awp._release_reasons(), ', ')));
  END IF;
  d := awp._lock_held_lease(p_worker_id, p_dispatch_id, p_lease_token);   -- as a completion
  SELECT * INTO r FROM awp.runs x WHERE x.run_id = d.run_id;   -- locked by awp._lock_held_lease
  v_now := awp._now();
  PERFORM awp._check_lease_live(r, d, v_now);
  v_why := format('released by its worker (%s)', p_reason);
  PERFORM awp._append_event(r.run_id, 'dispatch', d.dispatch_id, 'leased', 'expired', v_why);
  v_to := awp._end_attempt(r.run_id, d.task_key, d.attempt, 'interrupted', true, NULL, p_reason,
                           'its worker released the lease without a result (' || p_reason || ')',
                           v_why, false, 'expired', NULL);
  PERFORM awp._log_flush();
  PERFORM awp._wake('awp_coordinator', 'lease_released');   -- the retry, due now, is made ready at once
  RETURN v_to;
END $$;
COMMENT ON FUNCTION awp.release_lease(text, text, text, text, text) IS 'Gives back a lease its worker cannot finish (fenced): the attempt interrupted and not counted, the task due again at once; AWSES/AWREQ/AWLST.';

-- awp._release_reasons(): the reasons a worker may give awp.release_lease. Locks: none.
CREATE OR REPLACE FUNCTION awp._release_reasons() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT ARRAY['worker_shutdown']
$$;
COMMENT ON FUNCTION awp._release_reasons() IS 'The reasons awp.release_lease accepts.';

-- awp.request_drain(worker_id): an operator's drain of a worker session: active -> draining (it claims nothing
-- new; its process sees the status at its next heartbeat, drains as on SIGTERM and ends stopped with its own
-- awp.drain_worker). A draining, stopped or offline worker is left as it is (a repeat changes nothing).
-- Returns the worker summary row (as awp.get_worker). Raises AWNTF for an unknown worker.
-- Locks: the worker row.
CREATE OR REPLACE FUNCTION awp.request_drain(p_worker_id text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[],
               max_concurrency integer, active_leases integer, last_heartbeat_at timestamptz,
               registered_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_status text;
BEGIN
  SELECT w.status INTO v_status FROM awp.workers w WHERE w.worker_id = p_worker_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('worker not found', format('no worker %s', p_worker_id));
  END IF;
  IF v_status = 'active' THEN
    UPDATE awp.workers x SET status = 'draining', draining_at = awp._now() WHERE x.worker_id = p_worker_id;
    PERFORM awp._wake('awp_coordinator', 'worker_draining');
  END IF;
  RETURN QUERY SELECT * FROM awp._worker_rows(p_worker_id);
END $$;
COMMENT ON FUNCTION awp.request_drain(text) IS 'An operator''s drain: an active worker becomes draining (its process drains at its next heartbeat); returns its summary; AWNTF.';

-- awp.worker_status(worker_id): a worker session's status (active, draining, stopped, offline), NULL when unknown.
-- Read with each heartbeat (the gateway answers it as worker_status), so a worker drained by an operator
-- notices within a heartbeat interval. Locks: none.
CREATE OR REPLACE FUNCTION awp.worker_status(p_worker_id text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT w.status FROM awp.workers w WHERE w.worker_id = p_worker_id
$$;
COMMENT ON FUNCTION awp.worker_status(text) IS 'A worker session''s status (NULL when unknown); answered with each heartbeat.';
