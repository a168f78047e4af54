-- awp.complete_task(worker_id, session_token, dispatch_id, lease_token, result): reports the
-- result of a leased attempt. Fenced and idempotent (docs/protocol.md, rule 7), checks in this order:
--   1. session (AWSES); result shape and size limits (AWREQ)
--   2. unknown dispatch, another worker's, or a wrong lease token         -> AWLST
--   3. already completed: same result hash -> true again (no state change); different -> AWCNF
--   4. not leased, lease expired, attempt deadline passed, run canceled/cancel requested or
--      not running, attempt mismatch                                        -> AWLST
-- Then settles dispatch (completed + result hash), attempt, task, dependants and run, and refills the
-- slot the lease frees (awp._refill_slot: limits and fairness rule hold; docs/protocol.md, Refill and claim
-- on complete).
-- Result: {"kind": success|temporary_failure|permanent_failure, "output": any,
--          "error_code": text <= 128, "error_message": text <= 8 KiB}, output <= 64 KiB.
-- Check 2 runs twice: first on a plain read of the dispatch, before any lock (an early reject: a wrong
-- lease token never queues behind a busy or stuck run), then again under the locks (authoritative).
-- Locks: the run's transaction advisory lock (hashtextextended(run_id, 0): completions of one run
-- queue there), then Run, then Dispatch, then the task rows of that run.
CREATE OR REPLACE FUNCTION awp._complete_task(w awp.workers, p_dispatch_id text, p_lease_token text,
                                              p_result jsonb, p_refill boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  p_worker_id text := w.worker_id;
  v_kind   text;
  v_hash   bytea;
  r        awp.runs;
  d        awp.dispatches;
  v_now    timestamptz;
  v_current boolean;
  v_seqscan text := current_setting('enable_seqscan');
BEGIN
  PERFORM awp._check_result(p_result);
  v_kind := p_result->>'kind';
  v_hash := awp._result_hash(p_result);

  d := awp._lock_held_lease(p_worker_id, p_dispatch_id, p_lease_token);
  SELECT * INTO r FROM awp.runs x WHERE x.run_id = d.run_id;   -- locked by awp._lock_held_lease
  v_now := awp._now();
  IF d.status = 'completed' THEN
    IF d.result_hash = v_hash THEN
      RETURN true;
    END IF;
    PERFORM awp._raise_result_conflict('this lease was already completed with a different result');
  END IF;
  PERFORM awp._check_lease_live(r, d, v_now);
  -- The attempt and its task by key, each (as a join, every running task was read: see awp._claim), planned with
  -- enable_seqscan off (set around it) so a plan made while the tables were small probes too.
  PERFORM set_config('enable_seqscan', 'off', true);
  v_current := EXISTS (SELECT 1 FROM awp.attempts a
                        CROSS JOIN LATERAL (SELECT 1 FROM awp.tasks t WHERE t.run_id = a.run_id AND t.task_key = a.task_key
                                               AND t.attempts = d.attempt AND t.status = 'running' LIMIT 1) t
                        WHERE a.dispatch_id = d.dispatch_id AND a.status = 'running' AND a.attempt = d.attempt);
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF NOT v_current THEN
    PERFORM awp._raise_lease_lost('the attempt is no longer current');
  END IF;

  PERFORM awp._append_event(r.run_id, 'dispatch', d.dispatch_id, 'leased', 'completed', 'completed by ' || p_worker_id);
  PERFORM awp._end_attempt(r.run_id, d.task_key, d.attempt,   -- the dispatch completed with its attempt
                           CASE v_kind WHEN 'success' THEN 'succeeded' ELSE 'failed' END,
                           v_kind = 'temporary_failure',
                           p_result->'output', p_result->>'error_code', p_result->>'error_message',
                           v_kind, true, 'completed', v_hash, p_result->>'error_detail');
  -- Refill: the slot this completion frees gets a dispatch at once, for the next run in fairness order
  -- (awp._refill_slot). The coordinator is woken when that was not possible, or
  -- when a success unlocked dependants while some worker still has room (a fan-out: more new work
  -- than the one refilled slot): not on every completion of a busy run, where a pass finds nothing
  -- to do. (Other new work, such as a retry falling due, waits for the coordinator's next pass.)
  IF NOT p_refill THEN
    RETURN true;   -- the caller refills the freed slots itself (awp.complete_tasks, awp.complete_and_claim)
  END IF;
  IF NOT awp._refill_slot(w) THEN
    PERFORM awp._wake('awp_coordinator', 'completed');
  ELSE
    PERFORM awp._wake_for_fan_out(r.run_id, d.task_key, v_kind);
  END IF;
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._complete_task(awp.workers, text, text, jsonb, boolean) IS 'awp.complete_task for a checked worker session, without the final NOTIFY; p_refill false leaves the freed slot to the caller.';

-- awp._wake_for_fan_out(run, task, kind): after a completion whose freed slot was refilled, wakes the
-- coordinator when that completion was a success that unlocked dependants while some worker still has room
-- (a fan-out: more new work than the one refilled slot). Not on every completion of a busy run, where a pass
-- finds nothing to do. Locks: none.
CREATE OR REPLACE FUNCTION awp._wake_for_fan_out(p_run_id text, p_task_key text, p_kind text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_kind = 'success'
     AND (SELECT cardinality(t.dependants) FROM awp.tasks t
           WHERE t.run_id = p_run_id AND t.task_key = p_task_key AND t.mapped_task IS NULL) > 0   -- not an instance
     AND (SELECT t.ordinal FROM awp.tasks t WHERE t.run_id = p_run_id AND t.status = 'ready' ORDER BY t.ordinal LIMIT 1) IS NOT NULL
     AND (awp._dispatch_budget()).worker_free > 0 THEN
    PERFORM awp._wake('awp_coordinator', 'completed');
  END IF;
END $$;
COMMENT ON FUNCTION awp._wake_for_fan_out(text, text, text) IS 'Wakes the coordinator after a refilled completion that unlocked more work than one slot.';

-- awp.complete_task(worker_id, session_token, dispatch_id, lease_token, result, live_output DEFAULT NULL): as
-- above; live_output, the lease's last progress writes (docs/progress.md), is written first, after the run's
-- advisory lock (the lock the completion takes first anyway; every completion takes it before the run's counter row
-- in awp.run_outputs, so no two wait for each other there: docs/architecture.md, Lock order) and before any other
-- lock of the completion, fenced per write (a refused one is dropped) by awp._write_lease_output (AWREQ when
-- malformed).
CREATE OR REPLACE FUNCTION awp.complete_task(p_worker_id text, p_session_token text, p_dispatch_id text,
                                             p_lease_token text, p_result jsonb, p_live_output jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w         awp.workers := awp._session(p_worker_id, p_session_token, false);   -- AWSES first
  v_applied boolean;
BEGIN
  IF p_live_output IS NOT NULL THEN   -- after the run's advisory lock, as every completion writes it (see above)
    PERFORM awp._queue_for_runs(p_worker_id, ARRAY[p_dispatch_id], ARRAY[p_lease_token]);
    PERFORM awp._write_lease_output(p_worker_id, p_session_token, p_dispatch_id, p_lease_token, p_live_output,
                                    'invalid live_output', true);
  END IF;
  v_applied := awp._complete_task(w, p_dispatch_id, p_lease_token, p_result);
  PERFORM awp._notify_pending();
  RETURN v_applied;
END $$;
COMMENT ON FUNCTION awp.complete_task(text, text, text, text, jsonb, jsonb) IS 'Reports a lease''s result (fenced, idempotent): true when applied; AWSES/AWREQ/AWLST/AWCNF.';

-- awp._result_hash(result): the SHA-256 stored as dispatches.result_hash: of the result's kind, output, error_code
-- and error_message (a missing one as JSON null), so a repeat with the same result is recognised (idempotent
-- complete) whichever path settled it. The one definition, for awp._complete_task, the hot path
-- (awp._complete_and_refill) and awp._fail_oversize_lease. Locks: none.
CREATE OR REPLACE FUNCTION awp._result_hash(p jsonb) RETURNS bytea
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN sha256(convert_to(jsonb_build_object('kind', p->>'kind', 'output', p->'output', 'error_code', p->'error_code',
                                              'error_message', p->'error_message')::text, 'UTF8'));
END $$;
COMMENT ON FUNCTION awp._result_hash(jsonb) IS 'The hash of a result that an idempotent repeat is compared with.';

-- awp._lock_held_lease(worker_id, dispatch_id, lease_token): the dispatch of a lease this worker holds with this
-- lease token, locked with its run, for a call that settles it (a completion: awp._complete_task; a release:
-- awp.release_lease). AWLST for an unknown dispatch, another worker's or a wrong lease token: checked first on a
-- plain read of the dispatch, before any lock (an early reject: a wrong lease token never queues behind a busy or
-- stuck run), then again under the locks (authoritative).
-- Locks: the run's transaction advisory lock (hashtextextended(run_id, 0): completions of one run queue there),
-- then Run, then Dispatch.
CREATE OR REPLACE FUNCTION awp._lock_held_lease(p_worker_id text, p_dispatch_id text, p_lease_token text)
RETURNS awp.dispatches
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run_id text;
  v_holds  boolean;
  d        awp.dispatches;
BEGIN
  SELECT x.run_id, awp._holds_lease(x, p_worker_id, p_lease_token) INTO v_run_id, v_holds
    FROM awp.dispatches x WHERE x.dispatch_id = p_dispatch_id;
  IF NOT FOUND THEN
    PERFORM awp._raise_lease_lost(format('no dispatch %s', p_dispatch_id));
  END IF;
  -- Early reject, without waiting for the run: a dispatch's worker and lease token hash are written once,
  -- when it is leased (a dispatch is never leased twice), and the caller's token comes from that committed
  -- claim, so a mismatch here is final. The same test under the locks below stays the authoritative one.
  IF NOT v_holds THEN
    PERFORM awp._raise_lease_lost('the dispatch is not leased to this worker with this lease token');
  END IF;
  -- Completions of one run queue on a transaction advisory lock before the run row: the lock
  -- manager wakes one waiter per release, where waiters on the row itself all wake on each commit
  -- and re-check it (a thundering herd that made 16 workers slower than 4 on one run).
  PERFORM pg_advisory_xact_lock(hashtextextended(v_run_id, 0));
  PERFORM 1 FROM awp.runs x WHERE x.run_id = v_run_id FOR UPDATE;
  SELECT * INTO d FROM awp.dispatches x WHERE x.dispatch_id = p_dispatch_id FOR UPDATE;
  IF NOT awp._holds_lease(d, p_worker_id, p_lease_token) THEN
    PERFORM awp._raise_lease_lost('the dispatch is not leased to this worker with this lease token');
  END IF;
  RETURN d;
END $$;
COMMENT ON FUNCTION awp._lock_held_lease(text, text, text) IS 'Locks the run and the dispatch of a lease the worker holds with this token and returns the dispatch (AWLST otherwise, early and under the locks).';

-- awp._check_lease_live(run, dispatch, now): AWLST unless the dispatch is leased, before its attempt deadline and
-- its lease's expiry, in a run that runs with no cancellation requested: the checks a completion
-- (awp._complete_task) and a release (awp.release_lease) make under the run's and the dispatch's locks. Locks: none.
CREATE OR REPLACE FUNCTION awp._check_lease_live(r awp.runs, d awp.dispatches, p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF d.status <> 'leased' THEN
    PERFORM awp._raise_lease_lost(format('the dispatch is %s', d.status));
  ELSIF p_now >= d.attempt_deadline THEN
    PERFORM awp._raise_lease_lost('the attempt deadline has passed');
  ELSIF p_now >= d.lease_expires_at THEN
    PERFORM awp._raise_lease_lost('the lease has expired');
  ELSIF r.cancel_requested_at IS NOT NULL OR r.status <> 'running' THEN
    PERFORM awp._raise_lease_lost(format('the run is %s%s', r.status,
                                         CASE WHEN r.cancel_requested_at IS NOT NULL THEN ' (cancel requested)' ELSE '' END));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_lease_live(awp.runs, awp.dispatches, timestamptz) IS 'AWLST unless a lease is live (leased, not expired nor past its deadline, its run running with no cancel requested).';

-- awp._holds_lease(dispatch, worker_id, lease_token): whether the dispatch is leased to this worker with
-- this lease token (its worker and the SHA-256 of the token). The one ownership test of a completion,
-- run by awp._complete_task before the run lock (early reject) and under it (authoritative). Locks: none.
CREATE OR REPLACE FUNCTION awp._holds_lease(d awp.dispatches, p_worker_id text, p_lease_token text)
RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN d.worker_id IS NOT DISTINCT FROM p_worker_id AND d.lease_token_hash IS NOT DISTINCT FROM awp._hash(p_lease_token);
END $$;
COMMENT ON FUNCTION awp._holds_lease(awp.dispatches, text, text) IS 'Whether a dispatch is leased to this worker with this lease token.';

-- awp._queue_for_runs(worker_id, dispatch_ids, lease_tokens): for a completion that locks its worker's
-- row (complete_and_claim, complete_tasks), queues on the advisory lock of each run it completes for
-- (hashtextextended(run_id, 0), the lock awp._complete_task takes first) BEFORE that row is locked: while
-- a completion waits for a busy or stuck run it then holds nothing of its worker, so the worker's
-- heartbeats, drain and claims are not held back (a lock_timeout ends the wait). Only dispatches this
-- worker holds with these tokens count (awp._holds_lease; the others are refused without waiting).
-- Locks: those advisory locks, in run_id order (as complete_tasks settles its items), nothing else.
CREATE OR REPLACE FUNCTION awp._queue_for_runs(p_worker_id text, p_dispatch_ids text[], p_lease_tokens text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run text;
BEGIN
  IF cardinality(p_dispatch_ids) = 1 THEN   -- complete_and_claim: one primary-key read (no join to plan)
    SELECT d.run_id INTO v_run FROM awp.dispatches d
     WHERE d.dispatch_id = p_dispatch_ids[1] AND awp._holds_lease(d, p_worker_id, p_lease_tokens[1]);
    IF FOUND THEN
      PERFORM pg_advisory_xact_lock(hashtextextended(v_run, 0));
    END IF;
    RETURN;
  END IF;
  FOR v_run IN   -- one primary-key probe per dispatch, as in awp.complete_and_claim_many
    SELECT DISTINCT x.run_id
      FROM unnest(p_dispatch_ids, p_lease_tokens) AS u(dispatch_id, lease_token)
     CROSS JOIN LATERAL (SELECT d.run_id FROM awp.dispatches d
                          WHERE d.dispatch_id = u.dispatch_id AND awp._holds_lease(d, p_worker_id, u.lease_token)
                          LIMIT 1) x
     ORDER BY x.run_id
  LOOP
    PERFORM pg_advisory_xact_lock(hashtextextended(v_run, 0));
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._queue_for_runs(text, text[], text[]) IS 'Takes the advisory locks of the runs a worker completes for, before its worker row is locked.';

-- awp._check_result(result): AWREQ unless result is a valid, size-limited result object.
CREATE OR REPLACE FUNCTION awp._check_result(p jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_bad text;
BEGIN
  IF p IS NULL OR jsonb_typeof(p) <> 'object' THEN
    PERFORM awp._raise_invalid_request('invalid result', 'result must be a JSON object');
  END IF;
  IF p - '{kind,output,error_code,error_message,error_detail}'::text[] <> '{}'::jsonb THEN   -- an expression, no query per call
    SELECT string_agg(k, ', ' ORDER BY k) INTO v_bad FROM jsonb_object_keys(p) k
     WHERE k NOT IN ('kind', 'output', 'error_code', 'error_message', 'error_detail');
    PERFORM awp._raise_invalid_request('invalid result', 'result has unknown fields: ' || v_bad);
  END IF;
  IF jsonb_typeof(p->'kind') IS DISTINCT FROM 'string'
     OR p->>'kind' NOT IN ('success', 'temporary_failure', 'permanent_failure') THEN
    PERFORM awp._raise_invalid_request('invalid result',
      'result.kind must be one of success, temporary_failure, permanent_failure');
  END IF;
  IF p ? 'output' AND octet_length((p->'output')::text) > awp._limit_output_bytes() THEN
    PERFORM awp._raise_invalid_request('result output too large',
      format('output is %s bytes, over the %s-byte limit', octet_length((p->'output')::text), awp._limit_output_bytes()));
  END IF;
  IF p ? 'error_code' AND jsonb_typeof(p->'error_code') <> 'null'
     AND (jsonb_typeof(p->'error_code') <> 'string' OR length(p->>'error_code') > awp._limit_error_code_chars()) THEN
    PERFORM awp._raise_invalid_request('invalid result',
      format('error_code must be a string of at most %s characters', awp._limit_error_code_chars()));
  END IF;
  IF p ? 'error_message' AND jsonb_typeof(p->'error_message') <> 'null'
     AND (jsonb_typeof(p->'error_message') <> 'string' OR octet_length(p->>'error_message') > awp._limit_error_message_bytes()) THEN
    PERFORM awp._raise_invalid_request('invalid result',
      format('error_message must be a string of at most %s bytes', awp._limit_error_message_bytes()));
  END IF;
  IF p ? 'error_detail' AND jsonb_typeof(p->'error_detail') <> 'null'   -- a traceback (migration 0018): as a message
     AND (jsonb_typeof(p->'error_detail') <> 'string' OR octet_length(p->>'error_detail') > awp._limit_error_message_bytes()) THEN
    PERFORM awp._raise_invalid_request('invalid result',
      format('error_detail must be a string of at most %s bytes', awp._limit_error_message_bytes()));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_result(jsonb) IS 'Validates a result object (AWREQ).';

-- awp.complete_and_claim(worker_id, session_token, dispatch_id, lease_token, result, slots, claim_seq):
-- claim on complete (docs/protocol.md, Refill and claim on complete: a busy worker needs one round trip per
-- task): complete_task, then claim_tasks for up to `slots` leases (claim_seq as there), in one transaction.
-- The slot the completion frees is refilled straight to this worker (awp._lease_refill: created leased, the
-- same rows and events as a refill then a claim) unless pending dispatches wait to be claimed; the claim part
-- takes the rest. It asks only for what is free and claims nothing for a draining worker; errors of the
-- complete part are raised as by complete_task.
-- Returns the new leases (rows of awp.lease, as awp.claim_tasks). Locks: the run's advisory lock (queued for
-- before the worker row: awp._queue_for_runs), then the worker row (so the free slots it computes
-- cannot be taken by a concurrent claim), then as complete_task, then as claim_tasks. The queuing raises nothing
-- and waits only for the run of a dispatch leased to this worker with this lease token, so the session check
-- under the worker row's lock still comes first among the checks (AWSES, then AWREQ, AWLST, AWCNF).
-- live_output: as in awp.complete_task, written first after the run's advisory lock (before the worker row).
CREATE OR REPLACE FUNCTION awp.complete_and_claim(p_worker_id text, p_session_token text, p_dispatch_id text,
                                                  p_lease_token text, p_result jsonb, p_slots integer,
                                                  p_claim_seq bigint DEFAULT NULL, p_live_output jsonb DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w awp.workers;
BEGIN
  PERFORM awp._queue_for_runs(p_worker_id, ARRAY[p_dispatch_id], ARRAY[p_lease_token]);
  IF p_live_output IS NOT NULL THEN   -- after the run's advisory lock (see awp.complete_task)
    PERFORM awp._session(p_worker_id, p_session_token, false);   -- AWSES first, before the output is looked at
    PERFORM awp._write_lease_output(p_worker_id, p_session_token, p_dispatch_id, p_lease_token, p_live_output,
                                    'invalid live_output', true);
  END IF;
  w := awp._session(p_worker_id, p_session_token, true);   -- AWSES first
  PERFORM awp._check_claim_seq(p_claim_seq);
  RETURN QUERY SELECT * FROM awp._complete_and_claim(w, p_dispatch_id, p_lease_token, p_result, p_slots, p_claim_seq);
  PERFORM awp._notify_pending();   -- only for what this call created and did not lease itself
END $$;
COMMENT ON FUNCTION awp.complete_and_claim(text, text, text, text, jsonb, integer, bigint, jsonb) IS 'complete_task, then claim_tasks for up to slots free leases, in one transaction; returns the new leases.';

-- awp._complete_and_claim(worker, dispatch_id, lease_token, result, slots, claim_seq): the body of
-- awp.complete_and_claim for a worker whose session the caller checked and whose row it locked (after queuing
-- for the run: awp._queue_for_runs), without the final NOTIFY. Shared with awp.complete_and_claim_many.
CREATE OR REPLACE FUNCTION awp._complete_and_claim(w awp.workers, p_dispatch_id text, p_lease_token text,
                                                   p_result jsonb, p_slots integer, p_claim_seq bigint)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_free     integer;
  v_n        integer;
  v_refilled boolean;
  d          record;
  f          record;
BEGIN
  IF p_slots IS NULL OR p_slots < 1 OR w.status <> 'active' THEN
    PERFORM awp._complete_task(w, p_dispatch_id, p_lease_token, p_result);
    RETURN;
  END IF;
  -- The freed slot is this worker's and it asks for it back: refill it straight to the worker
  -- (awp._lease_refill); when that is not possible, refill it as complete_task does. The common case takes
  -- the hot path, awp._complete_and_refill; anything else (and every refusal) the general path.
  f := awp._complete_and_refill(w, p_dispatch_id, p_lease_token, p_result, p_claim_seq);
  IF f.outcome = 'skipped' THEN
    PERFORM awp._complete_task(w, p_dispatch_id, p_lease_token, p_result, false);
    RETURN QUERY SELECT * FROM awp._lease_refill(w, p_claim_seq);
    GET DIAGNOSTICS v_n = ROW_COUNT;
  ELSIF f.outcome = 'leased' THEN
    RETURN NEXT f.lease;
    v_n := 1;
  ELSE
    v_n := 0;
  END IF;
  v_refilled := v_n > 0;
  IF NOT v_refilled THEN
    v_refilled := awp._refill_slot(w);
  END IF;
  IF v_refilled THEN   -- the coordinator is woken as by complete_task (awp._complete_task)
    IF f.outcome = 'skipped' OR f.fan_out THEN
      SELECT x.run_id, x.task_key INTO d FROM awp.dispatches x WHERE x.dispatch_id = p_dispatch_id;
      PERFORM awp._wake_for_fan_out(d.run_id, d.task_key, p_result->>'kind');
    END IF;
  ELSE
    PERFORM awp._wake('awp_coordinator', 'completed');
  END IF;
  IF p_slots > v_n THEN
    v_free := awp._free_slots(w);
    IF v_free >= 1 THEN
      RETURN QUERY SELECT * FROM awp._claim(w, least(p_slots - v_n, v_free), false, p_claim_seq);
    END IF;
  END IF;
END $$;
COMMENT ON FUNCTION awp._complete_and_claim(awp.workers, text, text, jsonb, integer, bigint) IS 'The body of complete_and_claim for a checked, locked worker (no NOTIFY).';

-- awp._complete_and_refill(worker, dispatch_id, lease_token, result, claim_seq): the hot path of
-- awp._complete_and_claim (docs/protocol.md, Refill and claim on complete): a success whose lease is held and
-- current, in a running run, then the refill of the freed slot leased straight to the completing
-- worker (awp._lease_refill). It writes the same rows and events as awp._complete_task followed by
-- awp._lease_refill, with fewer statements:
--   - the checks of awp._complete_task in one read, under the run's lock: the dispatch leased to this worker with
--     this token, before its lease expiry and attempt deadline, its attempt and task current (the run's status
--     and cancel request are tested where its row is locked);
--   - the completed dispatch is written with the refill's (awp._lease_refill: one MERGE, where an UPDATE and an
--     INSERT each paid a write's fixed cost on the table with the most constraints; measured, backend CPU per
--     completion, two databases alternating: -2% to -8% in four runs), the completed task's row with the
--     refilled one, and each run's row once with all its events (awp._write_log), not step by step through
--     awp.log_state.
-- When any check fails it writes nothing and answers 'skipped': the caller then takes the general path, which
-- raises the exact error (AWLST, AWCNF) or answers an idempotent repeat. So does a temporary or permanent failure.
-- An invalid result raises AWREQ here, as there. The run's last unfinished task takes this path too (a run of one
-- task, the last of a run): once the refill is written, its run settles (awp._settle_run: the run's event after
-- its task's, as on the general path; AWP issue 46: each one-task run paid the general path, 0.5 ms more per run).
-- Outcomes: 'leased' (lease set), 'completed' (no refill leased to the worker: the caller refills as after
-- awp._lease_refill), 'skipped'. fan_out: the task has dependants (see awp._wake_for_fan_out).
-- The caller holds the worker row. Locks: the run's advisory lock and Run (as awp._complete_task), the dependants
-- made ready, then as awp._lease_refill (which writes the completed dispatch after the refilled task: the
-- exception to the lock order in docs/architecture.md, safe under the run's lock).
CREATE OR REPLACE FUNCTION awp._complete_and_refill(w awp.workers, p_dispatch_id text, p_lease_token text,
                                                    p_result jsonb, p_claim_seq bigint,
                                                    OUT outcome text, OUT lease awp.lease, OUT fan_out boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run   text;
  v_hash  bytea;
  v_now   timestamptz;
  d       record;   -- the completed dispatch and its task's dependants
  v_ready text[];
  v_n     integer;
  v_last  boolean;   -- the completed task is the run's last unfinished one
  v_live  boolean;   -- its run is running, no cancellation requested, with an unfinished task
  v_seqscan text;    -- the session's enable_seqscan, restored after the read of the run
  v_resolve boolean := false;   -- a dynamic task waits for awp._resolve_run (awp._unlock_dependants)
  v_countdown text;   -- the mapped task counted down (see below)
  e_type  text[];
  e_key   text[];
  e_from  text[];
  e_to    text[];
  e_why   text[];
BEGIN
  outcome := 'skipped';
  fan_out := false;
  IF w.status <> 'active' OR jsonb_typeof(p_result) IS DISTINCT FROM 'object' OR p_result->>'kind' IS DISTINCT FROM 'success' THEN
    RETURN;
  END IF;
  PERFORM awp._check_result(p_result);
  v_hash := awp._result_hash(p_result);   -- before the run's queue: needs no lock
  SELECT x.run_id INTO v_run FROM awp.dispatches x
   WHERE x.dispatch_id = p_dispatch_id AND x.status = 'leased' AND awp._holds_lease(x, w.worker_id, p_lease_token);
  IF NOT FOUND THEN
    RETURN;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended(v_run, 0));
  IF coalesce(current_setting('awp.log_state', true), '') <> '' THEN
    PERFORM awp._log_flush();   -- an earlier item of this transaction (complete_and_claim_many): its rows first
  END IF;
  -- The run's row by its key, then its state: with `status = 'running'` in the WHERE, a plan made while the runs
  -- were few read every live run through runs_live_idx (40 buffers at 3,000 live runs). Planned with enable_seqscan
  -- off (set around it, as the reads of awp._lease_refill), so such a plan probes the key too.
  v_seqscan := current_setting('enable_seqscan');
  PERFORM set_config('enable_seqscan', 'off', true);
  SELECT x.unfinished_tasks = 1, x.status = 'running' AND x.cancel_requested_at IS NULL AND x.unfinished_tasks >= 1
    INTO v_last, v_live FROM awp.runs x WHERE x.run_id = v_run FOR UPDATE;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF v_live IS NULL OR NOT v_live THEN   -- (NULL: no such run)
    RETURN;
  END IF;
  v_now := awp._now();
  -- The completion's checks, read: the dispatch is written by awp._lease_refill together with the refill's (one
  -- MERGE). Under the locks held here nothing else writes this dispatch or its task: the run's (the reaper, a
  -- cancel, another completion), the worker's (its heartbeats).
  -- countdown: the task is an instance of a for_each task that waits for other instances too (docs/dynamic.md): its
  -- count goes down in awp._lease_refill's tasks UPDATE instead of a statement of its own (awp._unlock_dependants).
  SELECT x.task_key, x.attempt, y.dependants, y.mapped_task,
         coalesce(m.status = 'waiting_dependencies' AND m.pending_deps > 1, false) AS countdown
    INTO d
    FROM awp.dispatches x JOIN awp.tasks y ON y.run_id = x.run_id AND y.task_key = x.task_key
    LEFT JOIN awp.tasks m ON m.run_id = y.run_id AND m.task_key = y.mapped_task
   WHERE x.dispatch_id = p_dispatch_id AND x.status = 'leased' AND awp._holds_lease(x, w.worker_id, p_lease_token)
     AND v_now < x.attempt_deadline AND v_now < x.lease_expires_at AND x.attempt_status = 'running'
     AND y.attempts = x.attempt AND y.status = 'running'
     AND y.limit_buckets IS NULL;   -- a task with rate limits: the general path frees its buckets before the refill
  IF NOT FOUND THEN
    RETURN;
  END IF;

  e_type := '{dispatch,attempt,task}';
  e_key := ARRAY[p_dispatch_id, d.task_key || '#' || d.attempt, d.task_key];
  e_from := '{leased,running,running}';
  e_to := '{completed,succeeded,succeeded}';
  e_why := ARRAY['completed by ' || w.worker_id, 'success', 'success'];
  IF d.countdown THEN
    v_countdown := d.mapped_task;
  ELSIF cardinality(d.dependants) > 0 THEN
    SELECT u.ready, u.resolve INTO v_ready, v_resolve FROM awp._unlock_dependants(v_run, d.dependants, v_now) u;
    v_n := coalesce(cardinality(v_ready), 0);
    -- A fan-out only when dependants became ready: an instance of a for_each task counts down its mapped task and
    -- unlocks nothing (a wake-up per instance kept the coordinator passing back to back; docs/dynamic.md).
    fan_out := v_n > 0;
    e_type := e_type || array_fill('task'::text, ARRAY[v_n]);
    e_key := e_key || coalesce(v_ready, '{}');
    e_from := e_from || array_fill('waiting_dependencies'::text, ARRAY[v_n]);
    e_to := e_to || array_fill('ready'::text, ARRAY[v_n]);
    e_why := e_why || array_fill('dependencies succeeded'::text, ARRAY[v_n]);
  END IF;

  SELECT * INTO lease FROM awp._lease_refill(w, p_claim_seq, v_now, v_run, d.task_key, e_type, e_key, e_from, e_to, e_why,
                                             p_dispatch_id, v_hash, p_result, v_countdown);
  outcome := CASE WHEN FOUND THEN 'leased' ELSE 'completed' END;
  IF v_resolve THEN   -- after the completion's own events: a condition, a for_each (docs/dynamic.md)
    PERFORM awp._resolve_run(v_run);
    PERFORM awp._log_flush();
  END IF;
  IF v_last THEN   -- the run's last unfinished task (it has no dependants then): the run settles, as on the general path
    PERFORM awp._settle_run(v_run);
    PERFORM awp._log_flush();
  END IF;
END $$;
COMMENT ON FUNCTION awp._complete_and_refill(awp.workers, text, text, jsonb, bigint) IS 'The hot path of complete_and_claim (a current success, then the refill leased to the worker); skipped (nothing written) otherwise.';

-- awp._task_rows(runs, keys): the current row versions (ctid) of some tasks (runs[i], keys[i]), by one primary-key
-- probe per task (LIMIT 1 keeps it a probe). For the group path's reads and writes of a few known tasks of runs whose
-- locks the caller holds: WHERE ctid = ANY (ctids) read by TID, where key = ANY (keys) was planned as a scan of the
-- whole run (measured: every task of a 1,000-task run filtered per statement) and a join of unnest(keys) as a hash
-- join. (The ctids held in a variable, a parameter of a generic plan, the planner prefers a sequential scan while
-- the table is small, and the cached plan keeps it as the table grows: the callers plan such statements with
-- enable_seqscan off.) PL/pgSQL, not SQL: a SQL function that is not inlined
-- plans its body again in every statement that calls it. The ctids come in the order of the pairs (a task not
-- found is left out). Locks: none.
CREATE OR REPLACE FUNCTION awp._task_rows(p_runs text[], p_keys text[]) RETURNS tid[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN ARRAY(SELECT p.ctid FROM unnest(p_runs, p_keys) WITH ORDINALITY AS u(run_id, task_key, o)
               CROSS JOIN LATERAL (SELECT x.ctid FROM awp.tasks x
                                    WHERE x.run_id = u.run_id AND x.task_key = u.task_key LIMIT 1) p
               ORDER BY u.o);
END $$;
COMMENT ON FUNCTION awp._task_rows(text[], text[]) IS 'The row versions (ctid) of some tasks (run, key pairs), by primary-key probes.';

-- awp._group_path_kinds(items): the first test of the group path (awp._complete_and_refill_group), without locks
-- and without raising: complete_and_claim_many asks it before it opens the group's subtransaction, so a group of
-- another shape neither locks nor raises. The executor kinds of the items' workers (read unlocked; the group path
-- compares them with the locked rows) when the items are >= 2 one-slot successes of distinct workers (valid
-- claim_seq) and every refill would be leased straight to its worker: no pending dispatch of those kinds waits to
-- be claimed (claims take the oldest first), and each item's live_output, if any, is one write without a progress
-- value (the form the group path writes itself: awp._write_group_output). NULL otherwise.
-- p_one_worker: the items are one worker's batch (awp.complete_tasks): >= 1 of them, all of that worker, which
-- gets back as many slots as it frees (where a group's workers are distinct, each freeing its one slot).
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._group_path_kinds(p_items jsonb, p_one_worker boolean DEFAULT false) RETURNS text[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_kinds text[];
BEGIN
  IF (SELECT count(*) < (CASE WHEN p_one_worker THEN 1 ELSE 2 END)
             OR NOT bool_and(coalesce((e->'slots') = '1'
                                      AND (coalesce(jsonb_typeof(e->'claim_seq'), 'null') = 'null'
                                           OR awp._int_ok(e->'claim_seq', 1, 9223372036854775807))
                                      AND jsonb_typeof(e->'result') = 'object'
                                      AND e->'result'->>'kind' = 'success'
                                      AND coalesce(CASE WHEN jsonb_typeof(e->'live_output') = 'array'   -- its output
                                                        THEN jsonb_array_length(e->'live_output') <= 1  -- one write
                                                             AND NOT coalesce((e->'live_output'->0) ? 'progress', false)
                                                   END, e->'live_output' IS NULL), false))
             OR count(DISTINCT e->>'worker_id') <> (CASE WHEN p_one_worker THEN 1 ELSE count(*) END)
        FROM jsonb_array_elements(p_items) e) THEN   -- one pass over the items
    RETURN NULL;
  END IF;
  v_kinds := ARRAY(SELECT DISTINCT k.kind
                     FROM jsonb_array_elements(p_items) e
                     CROSS JOIN LATERAL (SELECT y.executor_kinds FROM awp.workers y WHERE y.worker_id = e->>'worker_id'
                                          LIMIT 1) y
                     CROSS JOIN LATERAL unnest(y.executor_kinds) AS k(kind)
                    ORDER BY 1);
  IF cardinality(v_kinds) = 0 OR awp._pending_waits(v_kinds) THEN
    RETURN NULL;
  END IF;
  RETURN v_kinds;
END $$;
COMMENT ON FUNCTION awp._group_path_kinds(jsonb, boolean) IS 'The executor kinds of a group the group path may settle, or NULL; no locks, no errors.';

-- awp._complete_and_refill_group(items[, kinds]): the group path of awp.complete_and_claim_many (AWP issue 11): the
-- common group, where every item is a hot-path call (awp._complete_and_refill) of a worker asking for one slot back,
-- is settled set-based (and so is the common batch of awp.complete_tasks, one worker's successes asking for every
-- freed slot back: its items then name that one worker, each freeing a slot and getting it back refilled): one
-- statement per table for the whole group where the item loop runs one per item (each write statement costs a
-- fixed part -- executor start, the table's indexes opened and its CHECK constraints read
-- again, its foreign-key checks -- that a group of k items pays once instead of k times). The dispatches get one
-- MERGE: the completions (matched, updated) and the refills (not matched, inserted) in one statement, where an
-- UPDATE and an INSERT paid that part twice on the table with the most constraints (measured, backend CPU per
-- item, two databases alternating: -5% to -7% at 2 and 4 items per group before its plan was pinned as below;
-- about even with the UPDATE and INSERT after).
-- The items may be of several runs (the gateway groups the completions of every run that arrive while one call is
-- in flight), and each refill goes where the item loop would send it: the first run in fairness order
-- (awp._fairness_order, runs refilled earlier in this group moved behind the others in the order of their refills,
-- as their last_dispatch_seq will be) that is taken without waiting (awp._try_run), running, with room under its
-- concurrency (counting this group's completions and refills so far) and a ready task of the worker's kinds.
-- It writes exactly what the item loop writes, items taken in its order (worker_id, then position): per item the
-- completion (dispatch completed, attempt and task succeeded), its dependants made ready (awp._unlock_dependants),
-- then the refill leased straight to the item's worker (awp._lease_refill: the first ready task of the chosen run
-- in definition order of the worker's kinds, not yet refilled in this group); the events of each run in that order,
-- each run's row written once (awp._write_log), one revision per run. It applies only when that sequential outcome
-- is plain:
--   - awp._group_path_kinds names the kinds (>= 2 one-slot successes of distinct workers, nothing pending to claim);
--     the caller passes its answer as p_kinds (a direct call, without it, asks it here);
--   - each item for a dispatch its worker holds with that lease token;
--   - each item's live_output (docs/progress.md) none, or of the common form awp._write_group_output writes after
--     the MERGE (one write of lines and chunks, the attempt without a counters row, ...);
--   - each worker active with a valid session and the kinds read there; each result valid (AWREQ otherwise, as
--     its own call);
--   - each completed run running, no cancel requested (a run whose unfinished tasks are all items of the group ends
--     with it: it is settled after the group's writes, awp._settle_run, as the item loop settles it after its last
--     item; AWP issue 46: with many one-task runs every group was refused and paid its rollback, about 0.6 ms);
--   - every lease current (as the hot path's dispatch UPDATE), every item gets a refill (a refill that starts a
--     pending run writes the run's start first, as awp._lease_refill), no lease over the payload limit.
-- Otherwise it raises (AWGRP, or the error an item's own call raises): the caller rolls the group back (a
-- subtransaction) and settles the items one by one, which gives every item its exact answer. AWGRP never
-- leaves the database. Returns (item position, lease) per item. The caller holds the advisory locks of the
-- completed runs.
-- plan_cache_mode = force_generic_plan: for the statements that read by TID, a custom plan looks cheaper than the
-- generic one (the planner evaluates the ctid functions' arrays), so the plan cache would plan them again on every
-- call; measured at 2 items per group, that took the saving from 4% to 18% of the backend's CPU per item.
-- The MERGE reads awp.dispatches by primary key only (its ON clause names the completed dispatches' ids), and is
-- planned with enable_seqscan off: with the table small (a fresh database, or one analyzed while small) the planner
-- preferred to scan all of it (hashed, materialized or filtered), and the generic plan kept that scan as the table
-- grew. The setting is the MERGE's alone (set around it): on the whole function it reached the statements that
-- must scan (the settings row), whose forced plans then cost more than jit_above_cost and were compiled on every
-- call (measured: 5 ms per call). (A join on ctid is no TID scan in a MERGE: it filters.) The two statements that read
-- tasks by TID are planned with enable_seqscan off too, each alone: planned while the table was small, their generic
-- plans scanned every task (measured: 1 run x 1,000 tasks on 4 workers, PostgreSQL CPU per task 1.8 -> 2.8 ms over
-- four runs in a row until an ANALYZE; flat with the setting).
-- Locks: the worker rows in worker_id order (awp._session), the completed runs' rows in run_id order, then per item
-- in order the dependants made ready, the run refilled (awp._try_run: without waiting) and its task
-- (awp._first_ready); then the dispatch rows (the MERGE: the completed ones with their attempts, and the refills'),
-- then the items' runs' counter rows in awp.run_outputs in run_id order (their live output: awp._write_group_output;
-- whoever else holds one, a lone progress write, waits for nothing), then the tasks. Every run whose rows are
-- written is held (its advisory lock and row), so no other transaction that waits for a row of these can hold one
-- we wait for (heartbeats, the only writers of a leased dispatch without its run, take that dispatch alone and skip
-- it when it is locked).
CREATE OR REPLACE FUNCTION awp._complete_and_refill_group(p_items jsonb, p_kinds text[] DEFAULT NULL)
RETURNS TABLE (item integer, lease awp.lease)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  v_n     integer := jsonb_array_length(p_items);
  v_now   timestamptz;
  s       awp.settings;
  x       record;
  t       record;
  w       awp.workers;
  v_kinds text[];
  v_pos   integer[] := '{}';   -- per item, in the item loop's order: its position in p_items
  v_wid   text[] := '{}';      --   its worker
  v_did   text[] := '{}';      --   its dispatch and lease token
  v_ltok  text[] := '{}';
  v_hash  bytea[] := '{}';     --   its result hash, output, error code and message
  v_res   jsonb[] := '{}';
  v_cseq  bigint[] := '{}';    --   its claim_seq
  v_wrow  awp.workers[] := '{}';
  v_live  jsonb[] := '{}';     --   its live output (docs/progress.md; NULL for none)
  v_tok   text;                -- the session token w was checked with (a batch's items are one worker's)
  c_run   text[] := '{}';      -- per item (as v_pos): the run and task completed, its attempt, its dependants
  c_key   text[] := '{}';
  c_att   integer[] := '{}';
  c_deps  text[];              --   its dependants, each text[] as text (an array of arrays must be rectangular)
  f_run   text[] := '{}';      -- per item: the run and task refilled (its executor, action and input) and its lease
  f_key   text[] := '{}';
  f_exec  text[] := '{}';
  f_act   text[] := '{}';
  f_in    jsonb[] := '{}';
  f_id    text[] := '{}';
  f_tok   text[] := '{}';
  f_att   integer[] := '{}';
  f_at    timestamptz[] := '{}';   --   its time (as awp._lease_refill's: v_now in a completed run, else read then)
  f_dl    timestamptz[] := '{}';
  f_exp   timestamptz[] := '{}';
  f_fence bigint[] := '{}';
  f_up    jsonb[] := '{}';
  f_item  jsonb[] := '{}';     --   its item and item_index (an instance of a for_each task, docs/dynamic.md)
  f_idx   integer[] := '{}';
  f_deps  text[] := '{}';      --   the refilled task's dependencies (text[] as text); its upstream is read after the MERGE
  g_run   text[] := '{}';      -- the runs met (completed or considered for a refill), each read once:
  g_ok    boolean[] := '{}';   --   held, pending or running, no cancel requested
  g_pend  boolean[] := '{}';   --   pending (never dispatched)
  g_conc  integer[] := '{}';   --   its concurrency and its queued + running tasks, as the item loop counts them
  g_busy  integer[] := '{}';   --   before the current item's completion is written
  g_wf    text[] := '{}';      --   its workflow, version and input (the leases' fields)
  g_ver   integer[] := '{}';
  g_in    jsonb[] := '{}';
  g_at    timestamptz[] := '{}';   --   the time of its last refill in this group (f_at)
  v_order text[] := '{}';      -- the runs refilled in this group, the last refilled last (their new fairness places)
  v_cand  text;
  v_tail  integer;
  c       refcursor;
  v_run   text;
  v_g     integer;
  v_ready text[];
  v_resolve boolean;
  v_resolve_runs text[] := '{}';   -- runs whose dynamic tasks wait for awp._resolve_run (awp._unlock_dependants)
  v_end_runs text[] := '{}';   -- the completed runs whose last unfinished tasks are in this group (they end with it)
  c_fan   integer[] := '{}';   -- the items whose completion made dependants ready (a fan-out)
  c_mapped text[];             -- per item: the mapped task of an instance of a for_each task (docs/dynamic.md)
  d_run   text[] := '{}';      -- the mapped tasks to count down (run, key), one entry per instance completed
  d_key   text[] := '{}';
  d_left  integer;
  v_k     integer;
  v_at    timestamptz;
  v_dl    timestamptz;
  v_exp   timestamptz;
  v_fence bigint;
  v_up    jsonb;
  v_ctid  tid[];
  v_ftid  tid[];
  v_cpair text[];            -- run_id chr(31) task_key of each completed task, of each refill: ctids are per partition
  v_fpair text[];
  e_run   text[] := '{}';      -- the events, each of its run
  e_type  text[] := '{}';
  e_key   text[] := '{}';
  e_from  text[] := '{}';
  e_to    text[] := '{}';
  e_why   text[] := '{}';
  l_type  text[];              -- one run's events (awp._write_log)
  l_key   text[];
  l_from  text[];
  l_to    text[];
  l_why   text[];
  v_seqscan text := current_setting('enable_seqscan');
BEGIN
  v_kinds := coalesce(p_kinds, awp._group_path_kinds(p_items));   -- a direct call: the caller's test, here
  IF v_kinds IS NULL THEN
    PERFORM awp._raise_group_not_applicable('not a group of hot-path items whose refills are leased straight back');
  END IF;
  FOR x IN
    SELECT o::integer AS o, e->>'worker_id' AS worker_id, e->>'session_token' AS session_token,
           e->>'dispatch_id' AS dispatch_id, e->>'lease_token' AS lease_token, e->'result' AS result,
           (e->>'claim_seq')::bigint AS claim_seq, e->'live_output' AS live
      FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, o)
     ORDER BY e->>'worker_id', o
  LOOP
    IF w.worker_id IS DISTINCT FROM x.worker_id OR x.session_token IS DISTINCT FROM v_tok THEN   -- once per worker
      w := awp._session(x.worker_id, x.session_token, true);   -- AWSES as its own call
      v_tok := x.session_token;
    END IF;
    IF w.status <> 'active' THEN
      PERFORM awp._raise_group_not_applicable('a worker that is not active');
    END IF;
    PERFORM awp._check_result(x.result);                      -- AWREQ as its own call
    SELECT d.run_id, d.task_key, d.attempt INTO t FROM awp.dispatches d
     WHERE d.dispatch_id = x.dispatch_id AND d.status = 'leased' AND awp._holds_lease(d, x.worker_id, x.lease_token);
    IF NOT FOUND THEN
      PERFORM awp._raise_group_not_applicable('a dispatch not held with that token');
    END IF;
    c_run := c_run || t.run_id;
    c_key := c_key || t.task_key;
    c_att := c_att || t.attempt;
    v_pos := v_pos || x.o;
    v_wid := v_wid || x.worker_id;
    v_did := v_did || x.dispatch_id;
    v_ltok := v_ltok || x.lease_token;
    v_hash := v_hash || awp._result_hash(x.result);
    v_res := v_res || x.result;
    v_cseq := v_cseq || x.claim_seq;
    v_wrow := v_wrow || w;
    v_live := v_live || x.live;
    IF NOT w.executor_kinds <@ v_kinds THEN   -- not the kinds read above
      PERFORM awp._raise_group_not_applicable('a worker''s executor kinds changed');
    END IF;
  END LOOP;
  -- The completed runs, in run_id order: each running; one whose unfinished tasks are all in this group ends with it
  -- (settled after the group's writes, below).
  FOR x IN
    SELECT y.run_id, y.concurrency, y.workflow_id, y.workflow_version, y.input,
           (SELECT count(*) FROM awp.tasks z WHERE z.run_id = y.run_id AND z.status IN ('queued', 'running'))::integer AS busy,
           y.unfinished_tasks = k.n AS ends
      FROM awp.runs y
     CROSS JOIN LATERAL (SELECT count(*) AS n FROM unnest(c_run) u WHERE u = y.run_id) k   -- its items in the group
     WHERE y.run_id = ANY (c_run) AND y.status = 'running' AND y.cancel_requested_at IS NULL AND y.unfinished_tasks >= k.n
     ORDER BY y.run_id
       FOR UPDATE OF y
  LOOP
    IF x.ends THEN
      v_end_runs := v_end_runs || x.run_id;
    END IF;
    g_run := g_run || x.run_id;
    g_ok := g_ok || true;
    g_pend := g_pend || false;
    g_conc := g_conc || x.concurrency;
    g_busy := g_busy || x.busy;
    g_wf := g_wf || x.workflow_id;
    g_ver := g_ver || x.workflow_version;
    g_in := g_in || x.input;
  END LOOP;
  IF cardinality(g_run) <> (SELECT count(DISTINCT u) FROM unnest(c_run) u) THEN
    PERFORM awp._raise_group_not_applicable('a run not running');
  END IF;

  -- The completions' tasks current: each running its dispatch's attempt (the dispatches' own checks are the MERGE's
  -- below). Their rows are read by TID (awp._task_rows): joined, the planner probed the tables through their
  -- indexes in its own order, filtering every unfinished task of the run. The status is tested with IS NOT
  -- DISTINCT FROM, in a WHERE the same as =, so that no index on it (every unfinished task of the run) looks
  -- cheaper than the TID scan. A row that fails makes the count fall short: a lease not current, whose item's own
  -- call says why.
  v_now := awp._now();
  -- awp.tasks is partitioned (migration 0023) and a ctid names a row only within its partition: each row read by TID
  -- must also be the item's task (run and key, v_cpair), or the same ctid in another partition would pass.
  v_ctid := awp._task_rows(c_run, c_key);
  v_cpair := ARRAY(SELECT u.r || chr(31) || u.k FROM unnest(c_run, c_key) WITH ORDINALITY AS u(r, k, o) ORDER BY u.o);
  PERFORM set_config('enable_seqscan', 'off', true);   -- planned as a TID scan (see above)
  SELECT array_agg(y.dependants::text ORDER BY array_position(v_cpair, y.run_id || chr(31) || y.task_key)),
         array_agg(y.mapped_task ORDER BY array_position(v_cpair, y.run_id || chr(31) || y.task_key))
    INTO c_deps, c_mapped
    FROM awp.tasks y
   WHERE y.ctid = ANY (v_ctid) AND y.run_id || chr(31) || y.task_key = ANY (v_cpair)
     AND y.status IS NOT DISTINCT FROM 'running'
     AND y.attempts = c_att[array_position(v_cpair, y.run_id || chr(31) || y.task_key)]
     AND y.limit_buckets IS NULL;   -- a task with rate limits: the general path (awp._complete_and_refill)
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF cardinality(v_ctid) <> v_n OR coalesce(cardinality(c_deps), 0) <> v_n THEN
    PERFORM awp._raise_group_not_applicable('a task not current, or one with rate limits');
  END IF;

  -- Per item, in order: its dependants made ready, then its refill (as awp._lease_refill chooses it).
  s := awp._settings();
  FOR v_k IN 1 .. v_n LOOP
    w := v_wrow[v_k];
    e_run := e_run || array_fill(c_run[v_k], ARRAY[3]);
    e_type := e_type || '{dispatch,attempt,task}'::text[];
    e_key := e_key || ARRAY[v_did[v_k], c_key[v_k] || '#' || c_att[v_k], c_key[v_k]];
    e_from := e_from || '{leased,running,running}'::text[];
    e_to := e_to || '{completed,succeeded,succeeded}'::text[];
    e_why := e_why || ARRAY['completed by ' || w.worker_id, 'success', 'success'];
    v_g := array_position(g_run, c_run[v_k]);
    g_busy[v_g] := g_busy[v_g] - 1;   -- its completion counts out
    IF c_mapped[v_k] IS NOT NULL THEN   -- an instance: its mapped task is counted down once for the group, below
      d_run := d_run || c_run[v_k];
      d_key := d_key || c_mapped[v_k];
    ELSIF c_deps[v_k] <> '{}' THEN
      SELECT coalesce(u.ready, '{}'), u.resolve INTO v_ready, v_resolve
        FROM awp._unlock_dependants(c_run[v_k], c_deps[v_k]::text[], v_now) u;
      IF cardinality(v_ready) > 0 THEN   -- a fan-out (see awp._complete_and_refill)
        c_fan := c_fan || v_k;
      END IF;
      IF v_resolve AND NOT c_run[v_k] = ANY (v_resolve_runs) THEN
        v_resolve_runs := v_resolve_runs || c_run[v_k];
      END IF;
      e_run := e_run || array_fill(c_run[v_k], ARRAY[cardinality(v_ready)]);
      e_type := e_type || array_fill('task'::text, ARRAY[cardinality(v_ready)]);
      e_key := e_key || v_ready;
      e_from := e_from || array_fill('waiting_dependencies'::text, ARRAY[cardinality(v_ready)]);
      e_to := e_to || array_fill('ready'::text, ARRAY[cardinality(v_ready)]);
      e_why := e_why || array_fill('dependencies succeeded'::text, ARRAY[cardinality(v_ready)]);
    END IF;
    v_run := NULL;
    -- The candidates, read as needed: the fairness order without the runs refilled in this group, then those
    -- (v_order). Read lazily: with many live runs, listing them all per item cost 1.4 ms (AWP issue 46).
    c := awp._fairness_order(w.executor_kinds);
    v_tail := 0;   -- 0 while the cursor lasts, then the place in v_order
    LOOP
      IF v_tail = 0 THEN
        FETCH c INTO v_cand;
        IF NOT FOUND THEN
          v_tail := 1;
        ELSIF v_cand = ANY (v_order) THEN
          CONTINUE;
        END IF;
      END IF;
      IF v_tail > 0 THEN
        EXIT WHEN v_tail > cardinality(v_order);
        v_cand := v_order[v_tail];
        v_tail := v_tail + 1;
      END IF;
      v_g := array_position(g_run, v_cand);
      IF v_g IS NULL THEN   -- a run met first here: taken without waiting, as awp._lease_refill takes it
        g_run := g_run || v_cand;
        v_g := cardinality(g_run);
        g_ok[v_g] := false;   -- taken elsewhere (skipped, as awp._lease_refill skips it), ended or canceling
        g_pend[v_g] := false;
        IF awp._try_run(v_cand) THEN
          SELECT y.status, y.concurrency, y.workflow_id, y.workflow_version, y.input,
                 (SELECT count(*) FROM awp.tasks z WHERE z.run_id = y.run_id AND z.status IN ('queued', 'running'))::integer AS busy
            INTO x FROM awp.runs y
           WHERE y.run_id = v_cand AND y.status IN ('pending', 'running') AND y.cancel_requested_at IS NULL;
          IF FOUND THEN
            g_ok[v_g] := true;
            g_pend[v_g] := x.status = 'pending';
            g_conc[v_g] := x.concurrency;
            g_busy[v_g] := x.busy;
            g_wf[v_g] := x.workflow_id;
            g_ver[v_g] := x.workflow_version;
            g_in[v_g] := x.input;
          END IF;
        END IF;
      END IF;
      CONTINUE WHEN NOT g_ok[v_g] OR g_busy[v_g] >= g_conc[v_g];
      t := awp._first_ready(v_cand, w.executor_kinds,
                            ARRAY(SELECT f_key[i] FROM generate_subscripts(f_run, 1) i WHERE f_run[i] = v_cand), w.actions);
      CONTINUE WHEN t.task_key IS NULL;
      v_run := v_cand;
      EXIT;
    END LOOP;
    CLOSE c;
    IF v_run IS NULL THEN
      PERFORM awp._raise_group_not_applicable('no refill for an item');
    END IF;
    IF g_pend[v_g] THEN   -- the run's first dispatch: it starts (its event first, as awp._lease_refill writes it)
      e_run := e_run || v_run;
      e_type := e_type || '{run}'::text[];
      e_key := e_key || v_run;
      e_from := e_from || '{pending}'::text[];
      e_to := e_to || '{running}'::text[];
      e_why := e_why || '{"first dispatch"}'::text[];
      g_pend[v_g] := false;
    END IF;
    g_busy[v_g] := g_busy[v_g] + 1;
    v_order := array_remove(v_order, v_run) || v_run;
    IF v_k = 1 OR v_wid[v_k] <> v_wid[v_k - 1] THEN   -- once per worker (a batch's items are one worker's)
      PERFORM awp._claim_is_alive(w, s, v_now);
    END IF;
    -- The refill's time, as in awp._lease_refill: v_now in a run completed in this group (held since before it),
    -- else the clock read after the task was seen ready (its dependencies may have finished after v_now).
    v_at := CASE WHEN v_run = ANY (c_run) THEN v_now ELSE awp._now() END;
    SELECT * INTO v_dl, v_exp, v_fence FROM awp._lease_terms(s, v_at, t.timeout_ms);
    f_at := f_at || v_at;
    g_at[v_g] := v_at;
    f_run := f_run || v_run;
    f_key := f_key || t.task_key;
    f_exec := f_exec || t.executor;
    f_act := f_act || t.action;
    f_in := f_in || t.input;
    f_id := f_id || awp._new_dispatch_id(v_run);
    f_tok := f_tok || awp._token();
    f_att := f_att || (t.attempts + 1);
    f_dl := f_dl || v_dl;
    f_exp := f_exp || v_exp;
    f_fence := f_fence || v_fence;
    f_deps := f_deps || t.depends_on::text;
    f_item := f_item || t.item;
    f_idx := f_idx || t.item_index;
    e_run := e_run || array_fill(v_run, ARRAY[5]);
    e_type := e_type || '{task,dispatch,dispatch,task,attempt}'::text[];
    e_key := e_key || ARRAY[t.task_key, f_id[v_k], f_id[v_k], t.task_key, t.task_key || '#' || f_att[v_k]];
    e_from := e_from || '{ready,NULL,pending,queued,NULL}'::text[];
    e_to := e_to || '{queued,pending,leased,running,running}'::text[];
    e_why := e_why || ARRAY['dispatch created', 'dispatch created', 'claimed by ' || w.worker_id,
                            'attempt ' || f_att[v_k] || ' started', 'claimed by ' || w.worker_id];
  END LOOP;

  -- The dispatches in one MERGE: each completion (matched by its id: the checks of the hot path's dispatch UPDATE,
  -- awp._complete_and_refill) completed with its attempt, each refill (not matched: a new id) inserted leased.
  -- Every source row is written or the count falls short: a lease not current, whose item's own call says why.
  PERFORM set_config('enable_seqscan', 'off', true);   -- for planning the MERGE (see above)
  MERGE INTO awp.dispatches d
  USING (SELECT true AS done, c.id, c.run, c.worker_id, c.tok, c.hash, c.res, c.task_key, c.att, NULL::text AS exec,
                NULL::bigint AS fence, NULL::timestamptz AS exp, NULL::timestamptz AS dl, NULL::bigint AS cseq,
                NULL::timestamptz AS at
           FROM unnest(v_did, c_run, v_wid, v_ltok, v_hash, v_res, c_key, c_att)
                AS c(id, run, worker_id, tok, hash, res, task_key, att)
         UNION ALL
         SELECT false, u.id, u.run, u.worker_id, u.tok, NULL, NULL, u.task_key, u.att, u.exec, u.fence, u.exp, u.dl,
                u.cseq, u.at
           FROM unnest(f_id, f_run, v_wid, f_tok, f_key, f_att, f_exec, f_fence, f_exp, f_dl, v_cseq, f_at)
                AS u(id, run, worker_id, tok, task_key, att, exec, fence, exp, dl, cseq, at)) m
     ON d.dispatch_id = m.id AND d.dispatch_id = ANY (v_did)
  WHEN MATCHED AND m.done AND d.status IS NOT DISTINCT FROM 'leased' AND awp._holds_lease(d, m.worker_id, m.tok)
       AND v_now < d.attempt_deadline AND v_now < d.lease_expires_at
       AND d.attempt_status IS NOT DISTINCT FROM 'running'
       AND d.run_id IS NOT DISTINCT FROM m.run AND d.task_key = m.task_key AND d.attempt = m.att THEN
    UPDATE SET status = 'completed', result_hash = m.hash, finished_at = v_now, attempt_status = 'succeeded',
               attempt_finished_at = v_now, output = m.res->'output', error_code = m.res->>'error_code',
               error_message = m.res->>'error_message', counted = true
  WHEN NOT MATCHED AND NOT m.done THEN
    INSERT (dispatch_id, run_id, task_key, executor_kind, created_at, status, worker_id, lease_token_hash, attempt,
            fencing_token, leased_at, lease_expires_at, attempt_deadline, claim_seq, attempt_status)
    VALUES (m.id, m.run, m.task_key, m.exec, m.at, 'leased', m.worker_id, awp._hash(m.tok), m.att, m.fence,
            m.at, m.exp, m.dl, m.cseq, 'running');
  GET DIAGNOSTICS v_k = ROW_COUNT;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF v_k <> 2 * v_n THEN
    PERFORM awp._raise_group_not_applicable('a lease not current');
  END IF;
  IF cardinality(array_remove(v_live, NULL)) > 0 THEN
    PERFORM awp._write_group_output(c_run, c_key, c_att, v_did, v_live, v_now);   -- the items' last output
  END IF;
  -- Each refill's upstream, now that this group's completions are written (a refilled task may depend on one).
  FOR v_k IN 1 .. v_n LOOP
    IF f_deps[v_k] = '{}' THEN
      f_up := f_up || '{}'::jsonb;
    ELSE
      v_up := awp._upstream(f_run[v_k], f_deps[v_k]::text[]);
      IF cardinality(f_deps[v_k]::text[]) > 8 AND octet_length(v_up::text) > awp._limit_lease_payload_bytes() THEN
        PERFORM awp._raise_group_not_applicable('a lease over the payload limit');
      END IF;
      f_up := f_up || v_up;
    END IF;
  END LOOP;

  -- Then the tasks (completed and refilled: one UPDATE; the completed ones at the row versions read above, which
  -- nothing since has written, the refilled ones read now), then each run's row and events once: the runs not
  -- refilled, then the refilled ones in the order of their last refill (awp._write_log takes each one's next place
  -- in the fairness order).
  v_ftid := awp._task_rows(f_run, f_key);
  v_fpair := ARRAY(SELECT u.r || chr(31) || u.k FROM unnest(f_run, f_key) WITH ORDINALITY AS u(r, k, o) ORDER BY u.o);
  PERFORM set_config('enable_seqscan', 'off', true);   -- planned as a TID scan (see above)
  UPDATE awp.tasks y   -- by TID, each row also its task's (run and key): ctids are per partition (see above)
     SET status = CASE WHEN y.run_id || chr(31) || y.task_key = ANY (v_cpair) THEN 'succeeded' ELSE 'running' END,
         attempts = CASE WHEN y.run_id || chr(31) || y.task_key = ANY (v_cpair) THEN y.attempts
                         ELSE f_att[array_position(v_fpair, y.run_id || chr(31) || y.task_key)] END,
         updated_at = CASE WHEN y.run_id || chr(31) || y.task_key = ANY (v_cpair) THEN v_now
                           ELSE f_at[array_position(v_fpair, y.run_id || chr(31) || y.task_key)] END,
         ready_at = NULL,
         finished_at = CASE WHEN y.run_id || chr(31) || y.task_key = ANY (v_cpair) THEN v_now END
   WHERE y.ctid = ANY (v_ctid || v_ftid) AND y.run_id || chr(31) || y.task_key = ANY (v_cpair || v_fpair);
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  FOREACH v_cand IN ARRAY ARRAY(SELECT u FROM unnest(g_run) u WHERE u <> ALL (v_order) AND u = ANY (e_run)) || v_order LOOP
    SELECT array_agg(e_type[i] ORDER BY i), array_agg(e_key[i] ORDER BY i), array_agg(e_from[i] ORDER BY i),
           array_agg(e_to[i] ORDER BY i), array_agg(e_why[i] ORDER BY i)
      INTO l_type, l_key, l_from, l_to, l_why
      FROM generate_subscripts(e_run, 1) i WHERE e_run[i] = v_cand;
    PERFORM awp._write_log(v_cand, l_type, l_key, l_from, l_to, l_why,
                           -(SELECT count(*) FROM unnest(c_run) u WHERE u = v_cand)::integer, v_cand = ANY (v_order),
                           CASE WHEN v_cand = ANY (c_run) THEN v_now   -- a run only refilled: its last refill's time
                                ELSE g_at[array_position(g_run, v_cand)] END);
  END LOOP;
  -- The mapped tasks of the instances completed, each counted down by its instances in one UPDATE (by key); one that
  -- reaches 0 (its last instance) is resolved with the runs below.
  FOR x IN SELECT u.r, u.k, count(*)::integer AS n FROM unnest(d_run, d_key) AS u(r, k) GROUP BY u.r, u.k ORDER BY u.r, u.k LOOP
    UPDATE awp.tasks y SET pending_deps = y.pending_deps - x.n, updated_at = v_now
     WHERE y.run_id = x.r AND y.task_key = x.k AND y.status = 'waiting_dependencies'
    RETURNING y.pending_deps INTO d_left;
    IF d_left = 0 AND NOT x.r = ANY (v_resolve_runs) THEN
      v_resolve_runs := v_resolve_runs || x.r;
    END IF;
  END LOOP;
  IF cardinality(v_resolve_runs) > 0 THEN   -- after the group's own events (docs/dynamic.md)
    FOREACH v_cand IN ARRAY v_resolve_runs LOOP
      PERFORM awp._resolve_run(v_cand);
    END LOOP;
    PERFORM awp._log_flush();
  END IF;
  IF cardinality(v_end_runs) > 0 THEN   -- the runs that end with this group, after their events (awp._settle_run)
    FOREACH v_cand IN ARRAY v_end_runs LOOP
      PERFORM awp._settle_run(v_cand);
    END LOOP;
    PERFORM awp._log_flush();
  END IF;
  FOREACH v_k IN ARRAY c_fan LOOP   -- the coordinator is woken as by each item's own call (awp._complete_and_claim)
    PERFORM awp._wake_for_fan_out(c_run[v_k], c_key[v_k], 'success');
  END LOOP;
  RETURN QUERY
    SELECT v_pos[u.i]::integer,
           ROW(u.id, u.tok, g_wf[array_position(g_run, u.run)], g_ver[array_position(g_run, u.run)], u.run, u.task_key,
               u.exec, u.act, u.inp, u.att, u.dl, u.exp, awp._ms(u.exp - u.at), u.fence,
               g_in[array_position(g_run, u.run)], u.up, u.item, u.idx)::awp.lease
      FROM unnest(f_id, f_tok, f_run, f_key, f_exec, f_act, f_in, f_att, f_dl, f_exp, f_fence, f_up, f_item, f_idx, f_at)
           WITH ORDINALITY AS u(id, tok, run, task_key, exec, act, inp, att, dl, exp, fence, up, item, idx, at, i);
END $$;
COMMENT ON FUNCTION awp._complete_and_refill_group(jsonb, text[]) IS 'The group path of complete_and_claim_many and complete_tasks: a group of hot-path items, of one run or several, settled set-based (raises AWGRP when it does not apply).';

-- awp._group_path_or_nothing(items, kinds): awp._complete_and_refill_group in a subtransaction, for
-- awp.complete_and_claim_many and awp.complete_tasks: its items and their leases (arrays in item order), or NULLs
-- when it does not apply (AWGRP) or an item's own call would be refused (AWSES, AWLST, AWCNF, AWREQ): then it is
-- rolled back, nothing of it remains, and the caller settles the items one by one, each with its exact answer.
-- Every item of a group it settles gets a lease. Locks: as awp._complete_and_refill_group.
CREATE OR REPLACE FUNCTION awp._group_path_or_nothing(p_items jsonb, p_kinds text[],
                                                      OUT items integer[], OUT leases awp.lease[])
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  SELECT array_agg(g.item ORDER BY g.item), array_agg(g.lease ORDER BY g.item) INTO items, leases
    FROM awp._complete_and_refill_group(p_items, p_kinds) g;
EXCEPTION WHEN SQLSTATE 'AWGRP' OR SQLSTATE 'AWSES' OR SQLSTATE 'AWLST' OR SQLSTATE 'AWCNF' OR SQLSTATE 'AWREQ' THEN
  items := NULL;
  leases := NULL;
END $$;
COMMENT ON FUNCTION awp._group_path_or_nothing(jsonb, text[]) IS 'The group path in a subtransaction: its items and leases, or NULLs (rolled back) when it does not apply.';

-- awp.complete_and_claim_many(items): several workers' awp.complete_and_claim calls in one transaction (the
-- gateway groups the claim-on-complete requests that arrive while one of its calls is in flight: docs/protocol.md,
-- Refill and claim on complete). `items` is a JSON array of 1-64 objects
-- {"worker_id", "session_token", "dispatch_id", "lease_token", "result", "slots", "claim_seq"} (strings;
-- result an object; slots an integer >= 0; claim_seq an integer or null). Each item is settled exactly as
-- awp.complete_and_claim would settle it alone, and one that it would refuse (AWSES, AWREQ, AWLST, AWCNF) is
-- answered with that error without affecting the others. Returns one row per lease granted (item = the
-- item's 1-based position, error NULL), one row (item, error {"sqlstate", "message", "detail"}) per refused
-- item, and one row (item, NULL, NULL) for an item that was applied but got no lease. Raises AWREQ for a
-- malformed array. One revision of each run touched (one transaction).
-- An item may carry "live_output", its lease's last progress writes (docs/progress.md), stored with its result:
-- by the group path when it settles the group (the common form, awp._write_group_output), else before the items'
-- results, fenced per write and dropped when refused (awp._write_live_output).
-- A group of hot-path items is settled set-based first (awp._complete_and_refill_group, the group path: the same
-- rows and events, one statement per table); any other group is rolled back to a subtransaction's start and its
-- items are settled one by one.
-- Locks: the advisory locks of the items' runs in run_id order (as awp._queue_for_runs), then those of the group
-- path; or the live output's (awp._write_live_output: the runs' awp.run_outputs rows in run_id order), then per item
-- in (worker_id, position) order its worker row and the locks of awp.complete_and_claim.
CREATE OR REPLACE FUNCTION awp.complete_and_claim_many(p_items jsonb)
RETURNS TABLE (item integer, error jsonb, lease awp.lease)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_item   record;
  v_run    text;
  v_leases awp.lease[];
  v_gitems integer[];
  v_gleases awp.lease[];
  v_gkinds text[];
  v_k      integer;
  v_state  text;
  v_msg    text;
  v_detail text;
BEGIN
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' OR jsonb_array_length(p_items) NOT BETWEEN 1 AND 64
     OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e
                 WHERE jsonb_typeof(e) <> 'object'
                    OR jsonb_typeof(e->'worker_id') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(e->'session_token') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(e->'dispatch_id') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(e->'lease_token') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(e->'slots') IS DISTINCT FROM 'number'
                    OR jsonb_typeof(e->'claim_seq') NOT IN ('number', 'null')
                    OR e - '{worker_id,session_token,dispatch_id,lease_token,result,slots,claim_seq,live_output}'::text[]
                       <> '{}'::jsonb) THEN   -- an unknown key (an expression: no query per item)
    PERFORM awp._raise_invalid_request('invalid items',
      'items must be an array of 1-64 {"worker_id", "session_token", "dispatch_id", "lease_token": string, '
      '"result": object, "slots": integer, "claim_seq": integer or null, "live_output"?: array of progress writes}');
  END IF;
  FOR v_run IN   -- one primary-key probe per item (LIMIT 1 keeps it a probe, never a scan of the table)
    SELECT DISTINCT x.run_id
      FROM jsonb_array_elements(p_items) e
     CROSS JOIN LATERAL (SELECT d.run_id FROM awp.dispatches d
                          WHERE d.dispatch_id = e->>'dispatch_id' AND awp._holds_lease(d, e->>'worker_id', e->>'lease_token')
                          LIMIT 1) x
     ORDER BY x.run_id
  LOOP
    PERFORM pg_advisory_xact_lock(hashtextextended(v_run, 0));
  END LOOP;
  v_gkinds := awp._group_path_kinds(p_items);
  IF v_gkinds IS NOT NULL THEN   -- the common group set-based (awp._complete_and_refill_group)
    SELECT g.items, g.leases INTO v_gitems, v_gleases FROM awp._group_path_or_nothing(p_items, v_gkinds) g;
    IF v_gitems IS NOT NULL THEN   -- else rolled back: the items are settled one by one below
      FOR v_k IN 1 .. cardinality(v_gitems) LOOP
        item := v_gitems[v_k];
        error := NULL;
        lease := v_gleases[v_k];
        RETURN NEXT;
      END LOOP;
      PERFORM awp._notify_pending();
      RETURN;
    END IF;
  END IF;
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e WHERE e ? 'live_output') THEN
    PERFORM awp._write_live_output(p_items, 'invalid items');   -- the tasks' last output, before their results
  END IF;
  FOR v_item IN
    SELECT o::integer AS o, e->>'worker_id' AS worker_id, e->>'session_token' AS session_token,
           e->>'dispatch_id' AS dispatch_id, e->>'lease_token' AS lease_token, e->'result' AS result,
           e->'slots' AS slots, e->'claim_seq' AS claim_seq
      FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, o)
     ORDER BY e->>'worker_id', o
  LOOP
    item := v_item.o;
    error := NULL;
    BEGIN
      IF NOT awp._int_ok(v_item.slots, 0, 1000)
         OR (jsonb_typeof(v_item.claim_seq) = 'number' AND NOT awp._int_ok(v_item.claim_seq, 1, 9223372036854775807)) THEN
        PERFORM awp._raise_invalid_request('invalid item', 'slots must be an integer 0-1000, claim_seq an integer >= 1');
      END IF;
      v_leases := ARRAY(SELECT c FROM awp._complete_and_claim(awp._session(v_item.worker_id, v_item.session_token, true),
                                                             v_item.dispatch_id, v_item.lease_token, v_item.result,
                                                             (v_item.slots)::integer,
                                                             CASE WHEN jsonb_typeof(v_item.claim_seq) = 'number'
                                                                  THEN (v_item.claim_seq)::bigint END) c);
    EXCEPTION WHEN SQLSTATE 'AWSES' OR SQLSTATE 'AWLST' OR SQLSTATE 'AWCNF' OR SQLSTATE 'AWREQ' THEN
      GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
      error := jsonb_build_object('sqlstate', v_state, 'message', v_msg, 'detail', nullif(v_detail, ''));
      v_leases := '{}';
    END;
    lease := NULL;
    IF cardinality(v_leases) = 0 THEN
      RETURN NEXT;   -- refused (error set), or applied without a lease
    END IF;
    FOREACH lease IN ARRAY v_leases LOOP
      RETURN NEXT;
    END LOOP;
  END LOOP;
  PERFORM awp._notify_pending();
END $$;
COMMENT ON FUNCTION awp.complete_and_claim_many(jsonb) IS 'Several workers'' complete_and_claim calls in one transaction (the gateway''s grouping of completions); each item answered with its leases or its error.';

-- awp.complete_tasks(worker_id, session_token, results, slots, claim_seq): several completions and a claim
-- (claim_seq as in awp.claim_tasks) in one transaction, for a worker with several slots (one request and one commit for many tasks).
-- `results` is a JSON array of 1-256 {"dispatch_id", "lease_token", "result"} objects (distinct
-- dispatch ids); each is settled exactly as awp.complete_task would (fenced, idempotent), and an
-- item that complete_task would refuse (AWLST, AWCNF, AWREQ for its result) is answered with that
-- error without affecting the others. Then, as awp.complete_and_claim, up to `slots` new leases
-- (never more than are free; none while draining). Returns
--   {"results": [{"dispatch_id", "applied": true} | {"dispatch_id", "error": {"sqlstate", "message", "detail"}}],
--    "leases": [lease objects: the columns of awp.lease]}
-- with results in the order given. Raises AWSES (checked first) and AWREQ (malformed array).
-- The common batch (every result a success of a dispatch that the worker holds, the worker active and asking for at
-- least as many slots as it frees, and nothing pending to claim) is settled set-based first
-- by the group path (awp._complete_and_refill_group, one worker's items): in the order given, each completion,
-- then its freed slot refilled and leased straight back to the worker (as a refill and a claim would: nothing
-- else waits to be claimed); then a claim for any further slots. Any other batch is rolled back to a
-- subtransaction's start and settled item by item, which gives each its exact answer. Measured (one worker, one
-- run, backend CPU per result, two databases alternating): 0.65 -> 0.23 ms at 16 results per call, 1.00 -> 0.45 at
-- 4, 1.89 -> 1.21 at 1. What it writes is what the worker's results sent one by one with claim on complete would
-- (awp.complete_and_claim each, in the order given: db/tests/32_batch_path.sql); the item loop writes the
-- completions first, then the refills, then the claims (another order of the events, and a dependant made ready by
-- a later result may be refilled before an earlier ready task).
-- Locks: the advisory locks of the items' runs in run_id order (awp._queue_for_runs, before the worker
-- row), then the worker row, then the runs of the items in run_id order (each as complete_task: Run,
-- then Dispatch, then Task), then as claim_tasks. Sorting by run keeps two batches that touch
-- the same runs from deadlocking. The group path locks as awp._complete_and_refill_group says.
CREATE OR REPLACE FUNCTION awp.complete_tasks(p_worker_id text, p_session_token text, p_results jsonb,
                                              p_slots integer DEFAULT 0, p_claim_seq bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w        awp.workers := awp._session(p_worker_id, p_session_token, false);   -- AWSES first; locked below
  v_item   record;
  v_out    jsonb := '{}';
  v_msg    text;
  v_detail text;
  v_state  text;
  v_free   integer;
  v_leases jsonb := '[]';
  v_freed  integer := 0;
  v_items  jsonb;
  v_gkinds text[];
BEGIN
  IF jsonb_typeof(p_results) IS DISTINCT FROM 'array' OR jsonb_array_length(p_results) NOT BETWEEN 1 AND awp._limit_batch_results()
     OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_results) e
                 WHERE jsonb_typeof(e) <> 'object'
                    OR jsonb_typeof(e->'dispatch_id') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(e->'lease_token') IS DISTINCT FROM 'string'
                    OR e - '{dispatch_id,lease_token,result}'::text[] <> '{}'::jsonb)   -- an unknown key
     OR (SELECT count(DISTINCT e->>'dispatch_id') FROM jsonb_array_elements(p_results) e) <> jsonb_array_length(p_results) THEN
    PERFORM awp._raise_invalid_request('invalid results',
      format('results must be an array of 1-%s {"dispatch_id": string, "lease_token": string, "result": object} with distinct dispatch ids',
             awp._limit_batch_results()));
  END IF;
  PERFORM awp._check_claim_seq(p_claim_seq);
  PERFORM awp._queue_for_runs(p_worker_id,
    ARRAY(SELECT e->>'dispatch_id' FROM jsonb_array_elements(p_results) WITH ORDINALITY AS x(e, o) ORDER BY o),
    ARRAY(SELECT e->>'lease_token' FROM jsonb_array_elements(p_results) WITH ORDINALITY AS x(e, o) ORDER BY o));
  w := awp._session(p_worker_id, p_session_token, true);
  IF p_slots >= jsonb_array_length(p_results) AND w.status = 'active' THEN   -- the group path (see above)
    v_items := (SELECT jsonb_agg(jsonb_build_object('worker_id', p_worker_id, 'session_token', p_session_token,
                                                    'dispatch_id', e->'dispatch_id', 'lease_token', e->'lease_token',
                                                    'result', e->'result', 'slots', 1, 'claim_seq', p_claim_seq)
                                 ORDER BY o)
                  FROM jsonb_array_elements(p_results) WITH ORDINALITY AS x(e, o));
    v_gkinds := awp._group_path_kinds(v_items, true);
  END IF;
  IF v_gkinds IS NOT NULL THEN
    SELECT (SELECT jsonb_agg(to_jsonb(g.leases[k]) ORDER BY k) FROM generate_subscripts(g.leases, 1) AS k) INTO v_leases
      FROM awp._group_path_or_nothing(v_items, v_gkinds) g;
    IF v_leases IS NULL THEN   -- refused and rolled back: the items are settled one by one below
      v_leases := '[]';
      v_gkinds := NULL;
    END IF;
  END IF;
  IF v_gkinds IS NOT NULL THEN
    v_free := least(p_slots - jsonb_array_length(p_results), awp._free_slots(w));
    IF v_free >= 1 THEN
      v_leases := v_leases || (SELECT coalesce(jsonb_agg(to_jsonb(c)), '[]') FROM awp._claim(w, v_free, false, p_claim_seq) c);
    END IF;
    PERFORM awp._notify_pending();
    RETURN jsonb_build_object(
      'results', (SELECT jsonb_agg(jsonb_build_object('dispatch_id', e->>'dispatch_id', 'applied', true) ORDER BY o)
                    FROM jsonb_array_elements(p_results) WITH ORDINALITY AS x(e, o)),
      'leases', v_leases);
  END IF;
  FOR v_item IN
    SELECT e->>'dispatch_id' AS dispatch_id, e->>'lease_token' AS lease_token, e->'result' AS result
      FROM jsonb_array_elements(p_results) e
      LEFT JOIN LATERAL (SELECT y.run_id FROM awp.dispatches y WHERE y.dispatch_id = e->>'dispatch_id' LIMIT 1) d
        ON true   -- by key (a join could read every dispatch)
     ORDER BY d.run_id NULLS LAST, e->>'dispatch_id'
  LOOP
    BEGIN
      PERFORM awp._complete_task(w, v_item.dispatch_id, v_item.lease_token, v_item.result, false);
      v_freed := v_freed + 1;
      v_out := v_out || jsonb_build_object(v_item.dispatch_id, jsonb_build_object('dispatch_id', v_item.dispatch_id, 'applied', true));
    EXCEPTION WHEN SQLSTATE 'AWLST' OR SQLSTATE 'AWCNF' OR SQLSTATE 'AWREQ' THEN
      GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
      v_out := v_out || jsonb_build_object(v_item.dispatch_id, jsonb_build_object('dispatch_id', v_item.dispatch_id,
                 'error', jsonb_build_object('sqlstate', v_state, 'message', v_msg, 'detail', nullif(v_detail, ''))));
    END;
  END LOOP;
  -- The freed slots are refilled together (one dispatch per freed slot, as complete_task would);
  -- the coordinator is woken when not all of them could be.
  IF v_freed > 0 AND awp._refill_slots(w, v_freed) < v_freed THEN
    PERFORM awp._wake('awp_coordinator', 'completed');
  END IF;
  IF p_slots IS NOT NULL AND p_slots >= 1 AND w.status = 'active' THEN
    v_free := awp._free_slots(w);
    IF v_free >= 1 THEN
      SELECT coalesce(jsonb_agg(to_jsonb(c)), '[]') INTO v_leases FROM awp._claim(w, least(p_slots, v_free), false, p_claim_seq) c;
    END IF;
  END IF;
  PERFORM awp._notify_pending();
  RETURN jsonb_build_object(
    'results', (SELECT jsonb_agg(v_out->(e->>'dispatch_id') ORDER BY o) FROM jsonb_array_elements(p_results) WITH ORDINALITY AS x(e, o)),
    'leases', v_leases);
END $$;
COMMENT ON FUNCTION awp.complete_tasks(text, text, jsonb, integer, bigint) IS 'Several fenced, idempotent completions (each answered applied or with its error) and a claim of up to slots leases, in one transaction.';
