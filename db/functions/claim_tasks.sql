-- awp.claim_tasks(worker_id, session_token, slots): hands up to `slots` pending dispatches to a
-- worker, oldest first. For each: attempt N+1 is created (`running`), the task becomes `running`,
-- the dispatch `leased` with a new random lease token (only its SHA-256 stored),
-- attempt_deadline = now + timeout, lease_expires_at = least(now + lease, deadline) and a strictly
-- increasing fencing token; revision and events in the same transaction.
-- Raises AWSES (session, checked first), AWDRN (worker draining), AWREQ (slots < 1),
-- AWCAP (slots above the worker's free capacity, computed here from its leases).
-- Locks: the worker row, then Run and Dispatch together with
-- `FOR UPDATE OF r, d SKIP LOCKED`. When every candidate is locked by someone else it waits for
-- the oldest candidate's run row (and only that row) instead of answering empty: a busy run is a
-- hot row, not an idle queue.
CREATE OR REPLACE FUNCTION awp.claim_tasks(p_worker_id text, p_session_token text, p_slots integer)
RETURNS TABLE (dispatch_id text, lease_token text, workflow_id text, workflow_version integer,
               run_id text, task_key text, executor_kind text, action text, input jsonb,
               attempt integer, attempt_deadline timestamptz, lease_expires_at timestamptz,
               lease_remaining_ms bigint, fencing_token bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
#variable_conflict use_column
DECLARE
  w       awp.workers := awp._session(p_worker_id, p_session_token, true);
  s       awp.settings := awp._settings();
  v_now   timestamptz;
  v_free  integer;
  v_ids   text[];
  c       record;
  v_token text;
  v_att   integer;
  v_dl    timestamptz;
  v_exp   timestamptz;
  v_fence bigint;
  v_busy  text;
  v_id    text;
BEGIN
  IF w.status = 'draining' THEN
    RAISE EXCEPTION 'worker is draining' USING ERRCODE = 'AWDRN',
      DETAIL = 'a draining worker completes its leases but claims nothing new';
  END IF;
  IF p_slots IS NULL OR p_slots < 1 THEN
    PERFORM awp._bad_request('invalid slots', 'slots must be at least 1');
  END IF;
  SELECT w.max_concurrency - count(*) INTO v_free
    FROM awp.dispatches d WHERE d.worker_id = p_worker_id AND d.status = 'leased';
  IF p_slots > v_free THEN
    RAISE EXCEPTION 'worker capacity exceeded' USING ERRCODE = 'AWCAP',
      DETAIL = format('asked for %s slots, %s of %s free', p_slots, v_free, w.max_concurrency);
  END IF;
  -- A claim is a sign of life too (written at most every half heartbeat interval: one row write less per task).
  UPDATE awp.workers x SET last_heartbeat_at = awp._now()
   WHERE x.worker_id = p_worker_id
     AND x.last_heartbeat_at < awp._now() - make_interval(secs => s.heartbeat_interval_ms / 2000.0);

  SELECT array_agg(q.dispatch_id ORDER BY q.created_at, q.dispatch_id) INTO v_ids FROM (
    SELECT d.dispatch_id, d.created_at
      FROM awp.dispatches d JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.status = 'pending' AND d.executor_kind = ANY (w.executor_kinds)
       AND r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
     ORDER BY d.created_at, d.dispatch_id
     LIMIT p_slots
     FOR UPDATE OF r, d SKIP LOCKED) q;
  IF v_ids IS NULL THEN
    -- Every candidate was locked: the oldest one's run is busy (a claim or complete holds it for
    -- a moment). Wait for that run's lock alone (Run first, as everywhere), then take from it.
    -- Waiting on the run row only keeps the lock order; a blocking multi-row lock would keep
    -- locks on rows that failed their re-check and could deadlock with a complete.
    SELECT d.run_id INTO v_busy
      FROM awp.dispatches d JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.status = 'pending' AND d.executor_kind = ANY (w.executor_kinds)
       AND r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
     ORDER BY d.created_at, d.dispatch_id
     LIMIT 1;
    IF v_busy IS NOT NULL THEN
      PERFORM 1 FROM awp.runs r WHERE r.run_id = v_busy FOR UPDATE;
      SELECT array_agg(q.dispatch_id ORDER BY q.created_at, q.dispatch_id) INTO v_ids FROM (
        SELECT d.dispatch_id, d.created_at
          FROM awp.dispatches d JOIN awp.runs r ON r.run_id = d.run_id
         WHERE r.run_id = v_busy AND d.status = 'pending' AND d.executor_kind = ANY (w.executor_kinds)
           AND r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
         ORDER BY d.created_at, d.dispatch_id
         LIMIT p_slots
         FOR UPDATE OF r, d SKIP LOCKED) q;
    END IF;
  END IF;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  v_now := awp._now();
  FOREACH v_id IN ARRAY v_ids LOOP
    SELECT d.dispatch_id, d.run_id, d.task_key, d.executor_kind, t.action, t.input, t.attempts,
           t.timeout_ms, r.workflow_id, r.workflow_version
      INTO c
      FROM awp.dispatches d
      JOIN awp.tasks t ON t.run_id = d.run_id AND t.task_key = d.task_key
      JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.dispatch_id = v_id;
    v_token := awp._token();
    v_att := c.attempts + 1;
    v_dl := v_now + make_interval(secs => c.timeout_ms / 1000.0);
    v_exp := least(v_now + make_interval(secs => s.lease_duration_ms / 1000.0), v_dl);
    v_fence := nextval('awp.fencing_token_seq');
    UPDATE awp.dispatches d
       SET status = 'leased', worker_id = p_worker_id, lease_token_hash = awp._hash(v_token),
           attempt = v_att, fencing_token = v_fence, leased_at = v_now,
           lease_expires_at = v_exp, attempt_deadline = v_dl
     WHERE d.dispatch_id = c.dispatch_id;
    INSERT INTO awp.attempts (run_id, task_key, attempt, dispatch_id, worker_id, fencing_token,
                              started_at, deadline)
    VALUES (c.run_id, c.task_key, v_att, c.dispatch_id, p_worker_id, v_fence, v_now, v_dl);
    UPDATE awp.tasks t SET status = 'running', attempts = v_att, updated_at = v_now
     WHERE t.run_id = c.run_id AND t.task_key = c.task_key;
    PERFORM awp._logn(c.run_id, '{dispatch,task,attempt}', ARRAY[c.dispatch_id, c.task_key, c.task_key || '#' || v_att],
                      ARRAY['pending', 'queued', NULL], '{leased,running,running}',
                      ARRAY['claimed by ' || p_worker_id, 'attempt ' || v_att || ' started', 'claimed by ' || p_worker_id]);
    RETURN QUERY SELECT c.dispatch_id, v_token, c.workflow_id, c.workflow_version, c.run_id, c.task_key,
                        c.executor_kind, c.action, c.input, v_att, v_dl, v_exp, awp._ms(v_exp - v_now), v_fence;
  END LOOP;
END $$;
COMMENT ON FUNCTION awp.claim_tasks(text, text, integer) IS 'Leases up to slots pending dispatches to a worker (attempt, lease token, fencing token); AWSES/AWDRN/AWCAP/AWREQ.';
