-- awp.claim_tasks(worker_id, session_token, slots): hands up to `slots` pending dispatches to a
-- worker, oldest first. For each: attempt N+1 is created (`running`), the task becomes `running`,
-- the dispatch `leased` with a new random lease token (only its SHA-256 stored),
-- attempt_deadline = now + timeout, lease_expires_at = least(now + lease, deadline) and a strictly
-- increasing fencing token; revision and events in the same transaction. Each lease carries the
-- run's input (`run_input`) and `upstream`: {dependency task key: its output} of the task's direct
-- dependencies ({} for a root; awp._upstream). Lease payload limit: `upstream` is at most 1 MiB
-- (1,048,576 bytes as jsonb text; input and run_input are at most 64 KiB each by their own checks).
-- A task whose upstream is larger is not handed out: its attempt fails at once with error_code
-- `lease_payload_too_large` (permanent; dependants skipped), see docs/data-flow.md.
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
               lease_remaining_ms bigint, fencing_token bigint, run_input jsonb, upstream jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  w      awp.workers := awp._session(p_worker_id, p_session_token, true);
  v_free integer;
BEGIN
  IF w.status = 'draining' THEN
    RAISE EXCEPTION 'worker is draining' USING ERRCODE = 'AWDRN',
      DETAIL = 'a draining worker completes its leases but claims nothing new';
  END IF;
  IF p_slots IS NULL OR p_slots < 1 THEN
    PERFORM awp._bad_request('invalid slots', 'slots must be at least 1');
  END IF;
  v_free := awp._free_slots(w);
  IF p_slots > v_free THEN
    RAISE EXCEPTION 'worker capacity exceeded' USING ERRCODE = 'AWCAP',
      DETAIL = format('asked for %s slots, %s of %s free', p_slots, v_free, w.max_concurrency);
  END IF;
  RETURN QUERY SELECT * FROM awp._claim(w, p_slots, true);
  PERFORM awp._log_flush();
END $$;
COMMENT ON FUNCTION awp.claim_tasks(text, text, integer) IS 'Leases up to slots pending dispatches to a worker (attempt, lease token, fencing token); AWSES/AWDRN/AWCAP/AWREQ.';

-- awp._free_slots(worker): the worker's max_concurrency less its leases. Locks: none.
CREATE OR REPLACE FUNCTION awp._free_slots(w awp.workers) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = '' AS $$
BEGIN
  RETURN w.max_concurrency - (SELECT count(*) FROM awp.dispatches d WHERE d.worker_id = w.worker_id AND d.status = 'leased');
END $$;
COMMENT ON FUNCTION awp._free_slots(awp.workers) IS 'Free slots of a worker: max_concurrency less its leases.';

-- awp._claim(worker, slots, may_wait): the leasing part of awp.claim_tasks for a worker whose
-- session, status and free capacity the caller has checked (holding the worker row's lock). With
-- may_wait false (a completion that claims: it holds a run already) it never waits for a busy run.
CREATE OR REPLACE FUNCTION awp._claim(w awp.workers, p_slots integer, p_may_wait boolean)
RETURNS TABLE (dispatch_id text, lease_token text, workflow_id text, workflow_version integer,
               run_id text, task_key text, executor_kind text, action text, input jsonb,
               attempt integer, attempt_deadline timestamptz, lease_expires_at timestamptz,
               lease_remaining_ms bigint, fencing_token bigint, run_input jsonb, upstream jsonb)
LANGUAGE plpgsql SET search_path = '' AS $$
#variable_conflict use_column
DECLARE
  s       awp.settings := awp._settings();
  v_worker_id text := w.worker_id;
  v_now   timestamptz := awp._now();
  v_ids    text[];
  v_busy   text;
  v_id     text;
  v_i      integer;
  v_run    text[];
  v_key    text[];
  v_kind   text[];
  v_action text[];
  v_input  jsonb[];
  v_wf     text[];
  v_wfv    integer[];
  v_rin    jsonb[];
  v_att    integer[];
  v_dl     timestamptz[];
  v_exp    timestamptz[];
  v_ndeps  integer[];
  v_up     jsonb[];
  v_tok    text[];
  v_fence  bigint[];
BEGIN
  -- A claim is a sign of life too (written at most every half heartbeat interval: one row write less per task).
  IF w.last_heartbeat_at < v_now - make_interval(secs => s.heartbeat_interval_ms / 2000.0) THEN
    UPDATE awp.workers x SET last_heartbeat_at = v_now WHERE x.worker_id = v_worker_id;
  END IF;

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
    IF v_busy IS NOT NULL AND p_may_wait THEN
      -- On the row itself, not behind the run's queue of completions (their advisory lock, see
      -- awp._complete_task): a claim holds its worker's row while it waits, and a long wait there
      -- would hold that worker's heartbeats back too.
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

  v_now := awp._now();   -- after a possible wait for a busy run's lock
  -- Set-based: all leases of this call with one statement per table, from parallel arrays in claim
  -- order (the candidates are locked). upstream is read before any attempt of this call is written.
  SELECT array_agg(d.run_id ORDER BY u.o), array_agg(d.task_key ORDER BY u.o), array_agg(d.executor_kind ORDER BY u.o),
         array_agg(t.action ORDER BY u.o), array_agg(t.input ORDER BY u.o), array_agg(r.workflow_id ORDER BY u.o),
         array_agg(r.workflow_version ORDER BY u.o), array_agg(r.input ORDER BY u.o), array_agg(t.attempts + 1 ORDER BY u.o),
         array_agg(v_now + make_interval(secs => t.timeout_ms / 1000.0) ORDER BY u.o),
         array_agg(cardinality(t.depends_on) ORDER BY u.o),
         array_agg(CASE WHEN cardinality(t.depends_on) = 0 THEN '{}'::jsonb ELSE awp._upstream(d.run_id, t.depends_on) END
                   ORDER BY u.o),
         array_agg(awp._token() ORDER BY u.o)
    INTO v_run, v_key, v_kind, v_action, v_input, v_wf, v_wfv, v_rin, v_att, v_dl, v_ndeps, v_up, v_tok
    FROM unnest(v_ids) WITH ORDINALITY AS u(id, o)
    JOIN awp.dispatches d ON d.dispatch_id = u.id
    JOIN awp.tasks t ON t.run_id = d.run_id AND t.task_key = d.task_key
    JOIN awp.runs r ON r.run_id = d.run_id;
  v_fence := ARRAY(SELECT nextval('awp.fencing_token_seq') FROM generate_series(1, cardinality(v_ids)));
  v_exp := ARRAY(SELECT least(v_now + make_interval(secs => s.lease_duration_ms / 1000.0), x.dl)
                   FROM unnest(v_dl) WITH ORDINALITY AS x(dl, o) ORDER BY x.o);
  UPDATE awp.dispatches d
     SET status = 'leased', worker_id = v_worker_id, lease_token_hash = awp._hash(c.tok), attempt = c.att,
         fencing_token = c.fence, leased_at = v_now, lease_expires_at = c.exp, attempt_deadline = c.dl
    FROM unnest(v_ids, v_tok, v_att, v_fence, v_exp, v_dl) AS c(id, tok, att, fence, exp, dl)
   WHERE d.dispatch_id = c.id;
  INSERT INTO awp.attempts (run_id, task_key, attempt, dispatch_id, worker_id, fencing_token, started_at, deadline)
  SELECT c.run, c.key, c.att, c.id, v_worker_id, c.fence, v_now, c.dl
    FROM unnest(v_run, v_key, v_att, v_ids, v_fence, v_dl) WITH ORDINALITY AS c(run, key, att, id, fence, dl, o)
   ORDER BY c.o;
  UPDATE awp.tasks t SET status = 'running', attempts = c.att, updated_at = v_now
    FROM unnest(v_run, v_key, v_att) AS c(run, key, att)
   WHERE t.run_id = c.run AND t.task_key = c.key;
  -- Events per run (usually one), in claim order: dispatch leased, task running, attempt running.
  FOR v_id IN SELECT x.run FROM unnest(v_run) WITH ORDINALITY AS x(run, o) GROUP BY x.run ORDER BY min(x.o) LOOP
    PERFORM awp._logn(v_id, array_agg(e.t ORDER BY e.i, e.j), array_agg(e.k ORDER BY e.i, e.j),
                      array_agg(e.f ORDER BY e.i, e.j), array_agg(e.s ORDER BY e.i, e.j), array_agg(e.r ORDER BY e.i, e.j))
      FROM (SELECT x.i, y.j, y.t, y.k, y.f, y.s, y.r
              FROM generate_subscripts(v_run, 1) AS x(i),
                   LATERAL (VALUES (1, 'dispatch'::text, v_ids[x.i], 'pending'::text, 'leased'::text, 'claimed by ' || v_worker_id),
                                   (2, 'task', v_key[x.i], 'queued', 'running', 'attempt ' || v_att[x.i] || ' started'),
                                   (3, 'attempt', v_key[x.i] || '#' || v_att[x.i], NULL, 'running', 'claimed by ' || v_worker_id))
                           AS y(j, t, k, f, s, r)
             WHERE v_run[x.i] = v_id) e;
  END LOOP;
  FOR v_i IN 1 .. cardinality(v_ids) LOOP
    -- Each output is at most 64 KiB, so only a task with many dependencies can pass the limit.
    IF v_ndeps[v_i] > 8 AND octet_length(v_up[v_i]::text) > 1048576 THEN
      PERFORM awp._fail_oversize_lease(v_run[v_i], v_key[v_i], v_ids[v_i], v_att[v_i], octet_length(v_up[v_i]::text));
      CONTINUE;
    END IF;
    RETURN QUERY SELECT v_ids[v_i], v_tok[v_i], v_wf[v_i], v_wfv[v_i], v_run[v_i], v_key[v_i], v_kind[v_i], v_action[v_i],
                        v_input[v_i], v_att[v_i], v_dl[v_i], v_exp[v_i], awp._ms(v_exp[v_i] - v_now), v_fence[v_i],
                        v_rin[v_i], v_up[v_i];
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._claim(awp.workers, integer, boolean) IS 'Leases up to slots pending dispatches to a checked worker (the body of claim_tasks).';

-- awp._upstream(run, depends_on): {dependency key: output of its succeeded attempt} (JSON null when
-- that attempt had no output). Called only for tasks that are being leased, so every dependency has
-- succeeded and its last attempt (tasks.attempts) is the succeeded one. Locks: none.
CREATE OR REPLACE FUNCTION awp._upstream(p_run_id text, p_depends_on text[]) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = '' AS $$
  SELECT coalesce(jsonb_object_agg(u.task_key, a.output), '{}'::jsonb)
    FROM unnest(p_depends_on) AS u(task_key)
    JOIN awp.tasks t ON t.run_id = p_run_id AND t.task_key = u.task_key
    LEFT JOIN awp.attempts a ON a.run_id = p_run_id AND a.task_key = u.task_key AND a.attempt = t.attempts
                            AND a.status = 'succeeded'
$$;
COMMENT ON FUNCTION awp._upstream(text, text[]) IS 'The outputs of a task''s direct dependencies, keyed by task key.';

-- awp._fail_oversize_lease(run, task, dispatch, attempt, bytes): settles an attempt that claim_tasks
-- just started but cannot hand out because its upstream is over the lease payload limit: the
-- dispatch is completed with a permanent failure (error_code lease_payload_too_large) as if its
-- worker had reported it, and the task fails (dependants skipped, run settled). Locks: the caller
-- holds the run and the dispatch.
CREATE OR REPLACE FUNCTION awp._fail_oversize_lease(p_run_id text, p_task_key text, p_dispatch_id text,
                                                    p_attempt integer, p_bytes integer) RETURNS void
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  v_msg text := format('the outputs of this task''s dependencies are %s bytes, over the 1048576-byte lease payload limit',
                       p_bytes);
BEGIN
  UPDATE awp.dispatches d
     SET status = 'completed', finished_at = awp._now(),
         result_hash = sha256(convert_to(jsonb_build_object(
           'kind', 'permanent_failure', 'output', NULL, 'error_code', 'lease_payload_too_large',
           'error_message', v_msg)::text, 'UTF8'))
   WHERE d.dispatch_id = p_dispatch_id;
  PERFORM awp._log1(p_run_id, 'dispatch', p_dispatch_id, 'leased', 'completed', 'upstream over the lease payload limit');
  PERFORM awp._end_attempt(p_run_id, p_task_key, p_attempt, 'failed', false, NULL,
                           'lease_payload_too_large', v_msg, 'upstream over the lease payload limit');
  PERFORM awp._wake('awp_coordinator', 'completed');
END $$;
COMMENT ON FUNCTION awp._fail_oversize_lease(text, text, text, integer, integer) IS 'Fails an attempt whose upstream outputs are over the lease payload limit, before it is handed out.';
