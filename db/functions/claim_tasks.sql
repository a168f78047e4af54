-- awp.lease: one lease as the worker protocol hands it out: the rows of awp.claim_tasks and
-- awp.complete_and_claim, the objects of complete_tasks' "leases" (docs/sql-api.md). One definition of
-- its columns; awp._claim builds every row. Re-created on every migrate, after the functions that return it
-- were dropped (python/awp/dev/migrate.py), so a change here needs no migration.
DROP TYPE IF EXISTS awp.lease;
CREATE TYPE awp.lease AS (
  dispatch_id text, lease_token text, workflow_id text, workflow_version integer, run_id text, task_key text,
  executor_kind text, action text, input jsonb, attempt integer, attempt_deadline timestamptz,
  lease_expires_at timestamptz, lease_remaining_ms bigint, fencing_token bigint, run_input jsonb, upstream jsonb,
  item jsonb, item_index integer);   -- item, item_index: an instance of a for_each task (docs/dynamic.md); else NULL
ALTER TYPE awp.lease OWNER TO awp_owner;
COMMENT ON TYPE awp.lease IS 'One lease handed to a worker (claim_tasks, complete_and_claim, complete_tasks).';

-- awp._claim_candidates: the pending dispatches a claim may lease: those of runs that are pending or running
-- and whose cancellation was not requested. The one definition of that rule (but for awp._pending_waits, the check
-- that none waits, which writes it from the pending dispatches so that each probes its run by key); awp._claim adds
-- the worker's executor kinds, the claim order (oldest first: created_at, dispatch_id) and its row locks (FOR UPDATE
-- OF the view locks both of its rows). A plain view: the planner merges it into each query, so the plans are
-- those of the query written out. Re-created on every migrate (nothing depends on it).
-- The run comes first in FROM on purpose: FOR UPDATE OF a view locks its tables in that order, and the lock
-- order is Run, then Dispatch. The other way round, a claim that skips a candidate because its run is busy
-- (SKIP LOCKED) would keep the dispatch row it had locked first, hiding it from every other claim until it
-- commits (python/tests/faults/test_protocol_races.py saw claims answer empty with work left).
-- "Live" is written r.finished_at IS NULL (the same runs: constraint run_finished_iff_terminal), not r.status IN
-- ('pending', 'running'): that predicate is runs_live_idx's, and with statistics taken while runs was small the
-- planner read every live run through that index and probed each for a pending dispatch (0.8 ms per claim at
-- 2,000 live runs, AWP issue 46), where the pending dispatches are few (at most dispatch_limit) and each finds
-- its run by key. No index serves finished_at IS NULL, so the dispatches drive the join.
DROP VIEW IF EXISTS awp._claim_candidates;
CREATE VIEW awp._claim_candidates AS
  SELECT d.dispatch_id, d.created_at, d.executor_kind, d.run_id
    FROM awp.runs r JOIN awp.dispatches d ON d.run_id = r.run_id
   WHERE d.status = 'pending'
     AND r.finished_at IS NULL AND r.cancel_requested_at IS NULL;
ALTER VIEW awp._claim_candidates OWNER TO awp_owner;
COMMENT ON VIEW awp._claim_candidates IS 'The pending dispatches a claim may lease (runs live, no cancel requested).';

-- awp._pending_waits(kinds): whether a pending dispatch of one of these executor kinds waits for a claim (a row of
-- awp._claim_candidates): the test of a refill (awp._lease_refill) and of the group path (awp._group_path_kinds),
-- which lease straight back only when no claim waits. Written from the pending dispatches (their partial index), each
-- probing its run by key, and planned with enable_seqscan off: as an EXISTS over the view, the generic plan made
-- while the runs were few read every run and joined the pending dispatches to them (104 buffers per completion at
-- 1,000 live runs, AWP issue 46). Locks: none.
CREATE OR REPLACE FUNCTION awp._pending_waits(p_kinds text[]) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $$
BEGIN
  RETURN EXISTS (SELECT 1 FROM awp.dispatches k
                  CROSS JOIN LATERAL (SELECT 1 FROM awp.runs u
                                       WHERE u.run_id = k.run_id AND u.finished_at IS NULL
                                         AND u.cancel_requested_at IS NULL LIMIT 1) u
                  WHERE k.status = 'pending' AND k.executor_kind = ANY (p_kinds));
END $$;
COMMENT ON FUNCTION awp._pending_waits(text[]) IS 'Whether a pending dispatch of one of these executor kinds waits for a claim.';

-- awp.claim_tasks(worker_id, session_token, slots, claim_seq): hands up to `slots` pending dispatches to a
-- worker, oldest first, as rows of awp.lease. claim_seq (optional): the worker's number of this claim request, stored on each
-- lease (dispatches.claim_seq) for the heartbeat's release rule (docs/protocol.md, Lease recovery). For each: attempt N+1 is created (`running`), the task becomes `running`,
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
-- Locks: the worker row, then Run and Dispatch together (`FOR UPDATE OF` the view awp._claim_candidates,
-- `SKIP LOCKED`). When every candidate is locked by someone else it waits for
-- the oldest candidate's run row (and only that row) instead of answering empty: a busy run is a
-- hot row, not an idle queue. That wait lasts at most 500 ms (or the session's lower lock_timeout):
-- a run held longer is stuck, not busy, and the claim answers empty rather than hold the worker's
-- row (and so its heartbeats) behind it.
CREATE OR REPLACE FUNCTION awp.claim_tasks(p_worker_id text, p_session_token text, p_slots integer,
                                           p_claim_seq bigint DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w      awp.workers := awp._session(p_worker_id, p_session_token, true);
  v_free integer;
BEGIN
  IF w.status = 'draining' THEN
    PERFORM awp._raise_worker_draining('a draining worker completes its leases but claims nothing new');
  END IF;
  IF p_slots IS NULL OR p_slots < 1 THEN
    PERFORM awp._raise_invalid_request('invalid slots', 'slots must be at least 1');
  END IF;
  PERFORM awp._check_claim_seq(p_claim_seq);
  v_free := awp._free_slots(w);
  IF p_slots > v_free THEN
    PERFORM awp._raise_capacity_exceeded(format('asked for %s slots, %s of %s free', p_slots, v_free, w.max_concurrency));
  END IF;
  RETURN QUERY SELECT * FROM awp._claim(w, p_slots, true, p_claim_seq);
  PERFORM awp._log_flush();
END $$;
COMMENT ON FUNCTION awp.claim_tasks(text, text, integer, bigint) IS 'Leases up to slots pending dispatches to a worker (attempt, lease token, fencing token); AWSES/AWDRN/AWCAP/AWREQ.';

-- awp._check_claim_seq(claim_seq): AWREQ unless it is null or at least 1. Locks: none.
CREATE OR REPLACE FUNCTION awp._check_claim_seq(p_claim_seq bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_claim_seq < 1 THEN
    PERFORM awp._raise_invalid_request('invalid claim_seq', 'claim_seq must be at least 1');
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_claim_seq(bigint) IS 'Validates a claim request number (AWREQ unless null or >= 1).';

-- awp._free_slots(worker): the worker's max_concurrency less its leases. Locks: none.
CREATE OR REPLACE FUNCTION awp._free_slots(w awp.workers) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN w.max_concurrency - (SELECT count(*) FROM awp.dispatches d WHERE d.worker_id = w.worker_id AND d.status = 'leased');
END $$;
COMMENT ON FUNCTION awp._free_slots(awp.workers) IS 'Free slots of a worker: max_concurrency less its leases.';

-- awp._claim_is_alive(worker, settings, now): a claim is a sign of life too: the worker's last_heartbeat_at is
-- written, at most every half heartbeat interval (one row write less per task). Used by every path that leases
-- (awp._claim, awp._lease_refill). Locks: the worker row, which the caller holds.
CREATE OR REPLACE FUNCTION awp._claim_is_alive(w awp.workers, s awp.settings, p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF w.last_heartbeat_at < p_now - make_interval(secs => s.heartbeat_interval_ms / 2000.0) THEN
    UPDATE awp.workers x SET last_heartbeat_at = p_now WHERE x.worker_id = w.worker_id;
  END IF;
END $$;
COMMENT ON FUNCTION awp._claim_is_alive(awp.workers, awp.settings, timestamptz) IS 'Notes a claim as a sign of life of its worker (at most every half heartbeat interval).';

-- awp._lease_terms(settings, now, timeout_ms): the terms of a new lease granted now for a task with that
-- timeout: attempt_deadline = now + timeout, lease_expires_at = least(now + lease duration, deadline), and the
-- next (strictly increasing) fencing token. The one definition, for awp._claim and awp._lease_refill.
CREATE OR REPLACE FUNCTION awp._lease_terms(s awp.settings, p_now timestamptz, p_timeout_ms integer,
                                            OUT attempt_deadline timestamptz, OUT lease_expires_at timestamptz,
                                            OUT fencing_token bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  attempt_deadline := p_now + make_interval(secs => p_timeout_ms / 1000.0);
  lease_expires_at := least(p_now + make_interval(secs => s.lease_duration_ms / 1000.0), attempt_deadline);
  fencing_token := nextval('awp.fencing_token_seq');
END $$;
COMMENT ON FUNCTION awp._lease_terms(awp.settings, timestamptz, integer) IS 'Deadline, lease expiry and fencing token of a lease granted now.';

-- awp._claim(worker, slots, may_wait, claim_seq): the leasing part of awp.claim_tasks for a worker whose
-- session, status and free capacity the caller has checked (holding the worker row's lock). With
-- may_wait false (a completion that claims: it holds a run already) it never waits for a busy run.
-- claim_seq is stored on every lease it grants (NULL: none given). Builds every awp.lease row there is.
CREATE OR REPLACE FUNCTION awp._claim(w awp.workers, p_slots integer, p_may_wait boolean,
                                      p_claim_seq bigint DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s       awp.settings := awp._settings();
  v_worker_id text := w.worker_id;
  v_now   timestamptz := awp._now();
  v_ids   text[];
  c       record;
  v_token text;
  v_att   integer;
  v_dl    timestamptz;
  v_exp   timestamptz;
  v_fence bigint;
  v_busy  text;
  v_lock_timeout text;
  v_id    text;
  v_up    jsonb;
  v_seqscan text := current_setting('enable_seqscan');   -- restored after the read of each lease (below)
BEGIN
  PERFORM awp._claim_is_alive(w, s, v_now);

  -- The candidates (awp._claim_candidates) of the worker's kinds, oldest first; FOR UPDATE OF the view locks
  -- Run and Dispatch together.
  SELECT array_agg(q.dispatch_id ORDER BY q.created_at, q.dispatch_id) INTO v_ids FROM (
    SELECT k.dispatch_id, k.created_at FROM awp._claim_candidates k
     WHERE k.executor_kind = ANY (w.executor_kinds)
       AND awp._takes(w.actions, k.dispatch_id)   -- routing by action (db/functions/_routing.sql)
     ORDER BY k.created_at, k.dispatch_id
     LIMIT p_slots
     FOR UPDATE OF k SKIP LOCKED) q;
  IF v_ids IS NULL THEN
    -- Every candidate was locked: the oldest one's run is busy (a claim or complete holds it for
    -- a moment). Wait for that run's lock alone (Run first, as everywhere), then take from it.
    -- Waiting on the run row only keeps the lock order; a blocking multi-row lock would keep
    -- locks on rows that failed their re-check and could deadlock with a complete.
    SELECT k.run_id INTO v_busy FROM awp._claim_candidates k
     WHERE k.executor_kind = ANY (w.executor_kinds)
       AND awp._takes(w.actions, k.dispatch_id)   -- routing by action (db/functions/_routing.sql)
     ORDER BY k.created_at, k.dispatch_id
     LIMIT 1;
    IF v_busy IS NOT NULL AND p_may_wait THEN
      -- On the row itself, not behind the run's queue of completions (their advisory lock, see
      -- awp._complete_task): a claim holds its worker's row while it waits, and a long wait there
      -- would hold that worker's heartbeats back too. For the same reason the wait is bounded: a row
      -- held for longer than a few completions take (a transaction left open, a slow statement) is
      -- not waited for; the claim answers empty (a long-poll re-checks later) instead of failing.
      v_lock_timeout := current_setting('lock_timeout');
      BEGIN
        IF v_lock_timeout::interval = interval '0' OR v_lock_timeout::interval > interval '500 ms' THEN
          PERFORM set_config('lock_timeout', '500ms', true);
        END IF;
        PERFORM 1 FROM awp.runs r WHERE r.run_id = v_busy FOR UPDATE;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
      EXCEPTION WHEN lock_not_available THEN   -- the block's setting is undone with it
        RETURN;
      END;
      SELECT array_agg(q.dispatch_id ORDER BY q.created_at, q.dispatch_id) INTO v_ids FROM (
        SELECT k.dispatch_id, k.created_at FROM awp._claim_candidates k
         WHERE k.run_id = v_busy AND k.executor_kind = ANY (w.executor_kinds)
           AND awp._takes(w.actions, k.dispatch_id)   -- routing by action (db/functions/_routing.sql)
         ORDER BY k.created_at, k.dispatch_id
         LIMIT p_slots
         FOR UPDATE OF k SKIP LOCKED) q;
    END IF;
  END IF;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  v_now := awp._now();   -- after a possible wait for a busy run's lock
  FOREACH v_id IN ARRAY v_ids LOOP
    -- Three key probes (LATERAL ... LIMIT 1): as a join, a generic plan over the partitioned tables merged the
    -- dispatch with every run and every task of its run (2.4 ms per lease at 1,000 runs; docs/performance.md).
    -- Planned with enable_seqscan off (set around it), so a plan made while the tables were small probes too
    -- (python/tests/sql/test_completion_plans.py).
    PERFORM set_config('enable_seqscan', 'off', true);
    SELECT d.dispatch_id, d.run_id, d.task_key, d.executor_kind, t.action, t.input, t.attempts,
           t.timeout_ms, t.depends_on, r.workflow_id, r.workflow_version, r.input AS run_input, t.item, t.item_index
      INTO c
      FROM awp.dispatches d
      CROSS JOIN LATERAL (SELECT y.action, y.input, y.attempts, y.timeout_ms, y.depends_on, y.item, y.item_index
                            FROM awp.tasks y WHERE y.run_id = d.run_id AND y.task_key = d.task_key LIMIT 1) t
      CROSS JOIN LATERAL (SELECT y.workflow_id, y.workflow_version, y.input
                            FROM awp.runs y WHERE y.run_id = d.run_id LIMIT 1) r
     WHERE d.dispatch_id = v_id;
    PERFORM set_config('enable_seqscan', v_seqscan, true);
    v_token := awp._token();
    v_att := c.attempts + 1;
    SELECT * INTO v_dl, v_exp, v_fence FROM awp._lease_terms(s, v_now, c.timeout_ms);
    UPDATE awp.dispatches d
       SET status = 'leased', worker_id = v_worker_id, lease_token_hash = awp._hash(v_token),
           attempt = v_att, fencing_token = v_fence, leased_at = v_now,
           lease_expires_at = v_exp, attempt_deadline = v_dl, claim_seq = p_claim_seq,
           attempt_status = 'running'   -- attempt v_att starts (awp.attempts: 0010_fold_attempts)
     WHERE d.dispatch_id = c.dispatch_id;
    UPDATE awp.tasks t SET status = 'running', attempts = v_att, updated_at = v_now
     WHERE t.run_id = c.run_id AND t.task_key = c.task_key;
    PERFORM awp._append_events(c.run_id, '{dispatch,task,attempt}', ARRAY[c.dispatch_id, c.task_key, c.task_key || '#' || v_att],
                               ARRAY['pending', 'queued', NULL], '{leased,running,running}',
                               ARRAY['claimed by ' || v_worker_id, 'attempt ' || v_att || ' started', 'claimed by ' || v_worker_id]);
    v_up := CASE WHEN cardinality(c.depends_on) = 0 THEN '{}'::jsonb ELSE awp._upstream(c.run_id, c.depends_on) END;
    -- Each output is at most 64 KiB, so only a task with many dependencies can pass the limit.
    IF cardinality(c.depends_on) > 8 AND octet_length(v_up::text) > awp._limit_lease_payload_bytes() THEN
      PERFORM awp._fail_oversize_lease(c.run_id, c.task_key, c.dispatch_id, v_att, octet_length(v_up::text));
      CONTINUE;
    END IF;
    RETURN QUERY SELECT c.dispatch_id, v_token, c.workflow_id, c.workflow_version, c.run_id, c.task_key,
                        c.executor_kind, c.action, c.input, v_att, v_dl, v_exp, awp._ms(v_exp - v_now), v_fence,
                        c.run_input, v_up, c.item, c.item_index;
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._claim(awp.workers, integer, boolean, bigint) IS 'Leases up to slots pending dispatches to a checked worker (the body of claim_tasks).';

-- awp._first_ready(run, kinds, except, actions): the task a refill of the run takes for a worker of these executor
-- kinds (and these action lists, workers.actions: routing by action, db/functions/_routing.sql): its first ready
-- task without limits (higher priority first, then definition order; tasks with rate limits are
-- awp._pick_limited's), other than those in `except` (refilled earlier in the same group),
-- locked FOR UPDATE; all fields NULL when there is none. The one definition of a refill's choice, for
-- awp._lease_refill and the group path (awp._complete_and_refill_group).
-- enable_sort = off: see awp._dispatch_one (only here: a plan that sorts under it costs more than jit_above_cost
-- and is compiled on every call).
CREATE OR REPLACE FUNCTION awp._first_ready(p_run_id text, p_kinds text[], p_except text[], p_actions jsonb,
                                            OUT task_key text, OUT executor text, OUT action text, OUT input jsonb,
                                            OUT attempts integer, OUT timeout_ms integer, OUT depends_on text[],
                                            OUT item jsonb, OUT item_index integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_sort = off AS $$
BEGIN
  SELECT y.task_key, y.executor, y.action, y.input, y.attempts, y.timeout_ms, y.depends_on, y.item, y.item_index
    INTO task_key, executor, action, input, attempts, timeout_ms, depends_on, item, item_index
    FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.status = 'ready' AND y.executor = ANY (p_kinds) AND y.task_key <> ALL (p_except)
     AND y.limit_buckets IS NULL
     AND awp._offers(p_actions, y.executor, y.action)   -- routing by action (db/functions/_routing.sql)
   ORDER BY y.priority DESC, y.ordinal LIMIT 1
     FOR UPDATE;
END $$;
COMMENT ON FUNCTION awp._first_ready(text, text[], text[], jsonb) IS 'The first ready task of a run for these executor kinds and action lists, not in except (locked).';

-- awp._lease_refill(worker, claim_seq[, now, run, succeeded_task, the completion's events, done, done_hash,
-- done_result]): refill straight to the
-- completing worker (docs/protocol.md, Refill and claim on complete). A completion that also claims frees a slot of
-- its own worker and asks for it back: the refill of that slot (awp._refill_slot: the first run in fairness order
-- with a ready task of one of the worker's kinds and room under its concurrency) is created already leased to
-- that worker, instead of pending and then leased by the claim part. The same rows and the same events result
-- (task ready -> queued, dispatch pending, then leased, task running, attempt running), with one dispatch INSERT
-- instead of an INSERT and an UPDATE, one task UPDATE instead of two, no candidate scan and no NOTIFY. Only when
-- no pending dispatch of the worker's kinds waits to be claimed (claims take the oldest first; otherwise the
-- caller refills and claims as before). Returns the lease (at most one row); none when nothing could be refilled.
-- The hot path (awp._complete_and_refill) also passes the writes of its completion that this call finishes:
-- `run` and its `succeeded_task` (always both: the task's row is written here with the refilled task's, one
-- UPDATE, and the run has one unfinished task less) and the events of that completion (parallel arrays as
-- awp._append_events), and the completed dispatch (`done`, its result hash and result, checked by the caller under
-- the run's lock): it is written here with the refill's row, one MERGE on awp.dispatches (completed with its
-- attempt as awp._end_attempt does for a success) instead of an UPDATE and an INSERT. Each run touched is then
-- written once with its events (awp._write_log). `countdown`: the mapped task of a completed instance
-- (docs/dynamic.md) that waits for other instances too: one less to wait for, in the same tasks UPDATE (the caller
-- checked it under the run's lock). The general path (after awp._complete_task) passes the worker and claim_seq
-- alone. The MERGE reads awp.dispatches by primary key only (its ON clause names both ids), and the
-- tasks UPDATE awp.tasks by primary key; both are planned with enable_seqscan off (set around them): with a table
-- small (a fresh database, or one analyzed while small) the planner preferred to scan all of it, a plan the plan
-- cache kept as the table grew (measured: +30% per completion at 2,400 dispatches; the tasks UPDATE scanned 1,200
-- tasks per completion); see awp._complete_and_refill_group for why not on the whole function.
-- Locks: as awp._refill_slot (runs without waiting: awp._try_run, then the task row), then the completed dispatch
-- (the caller holds its run), then as awp._claim.
CREATE OR REPLACE FUNCTION awp._lease_refill(w awp.workers, p_claim_seq bigint, p_now timestamptz DEFAULT NULL,
                                             p_run text DEFAULT NULL, p_succeeded_task text DEFAULT NULL,
                                             p_types text[] DEFAULT '{}', p_keys text[] DEFAULT '{}',
                                             p_from text[] DEFAULT '{}', p_to text[] DEFAULT '{}',
                                             p_reasons text[] DEFAULT '{}', p_done text DEFAULT NULL,
                                             p_done_hash bytea DEFAULT NULL, p_done_result jsonb DEFAULT NULL,
                                             p_countdown text DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_sort = off AS $$   -- see awp._dispatch_one
DECLARE
  v_now   timestamptz := coalesce(p_now, awp._now());
  v_at    timestamptz;   -- the refill's time (see below)
  s       awp.settings;
  v_run   text;
  c       refcursor;
  v_key   text;   -- the task refilled and its executor (NULL: none)
  v_exec  text;
  v_seqscan text;   -- the session's enable_seqscan, restored after the MERGE and the tasks UPDATE
  v_hashjoin text := current_setting('enable_hashjoin');   -- the same for enable_hashjoin
  v_idle  boolean;   -- no pending dispatch of the worker's kinds waits: refill
  r       record;
  t       record;
  v_id    text;
  v_token text;
  v_att   integer;
  v_dl    timestamptz;
  v_exp   timestamptz;
  v_fence bigint;
  v_up    jsonb;
  f_type  text[];
  f_key   text[];
  f_from  text[];
  f_to    text[];
  f_why   text[];
BEGIN
  IF coalesce(current_setting('awp.log_state', true), '') <> '' THEN
    PERFORM awp._log_flush();   -- awp._write_log below writes the run rows directly
  END IF;
  -- Refill only when no pending dispatch of the worker's kinds waits for a claim (awp._pending_waits).
  v_idle := w.status = 'active' AND NOT awp._pending_waits(w.executor_kinds);
  IF v_idle THEN
    -- A ready task with rate limits that have room first (as awp._refill_slot), then the fairness order.
    IF EXISTS (SELECT 1 FROM awp.tasks y WHERE y.status = 'ready' AND y.limit_buckets IS NOT NULL) THEN
      SELECT p.run_id, p.task_key INTO v_run, v_key FROM awp._pick_limited(w.executor_kinds, NULL, p_run, w.actions) p;
      IF v_key IS NOT NULL THEN
        SELECT x.status, x.concurrency, x.workflow_id, x.workflow_version, x.input INTO r FROM awp.runs x
         WHERE x.run_id = v_run;
        SELECT y.task_key, y.executor, y.action, y.input, y.attempts, y.timeout_ms, y.depends_on, y.item, y.item_index
          INTO t FROM awp.tasks y WHERE y.run_id = v_run AND y.task_key = v_key;
        v_exec := t.executor;
      END IF;
    END IF;
    c := awp._fairness_order(w.executor_kinds);
    LOOP
      EXIT WHEN v_key IS NOT NULL;
      FETCH c INTO v_run;
      EXIT WHEN NOT FOUND;
      CONTINUE WHEN NOT awp._try_run(v_run);
      -- By its key, then its state (in the WHERE, `status IN ('pending', 'running')` let a plan made while the runs
      -- were few read every live run through runs_live_idx: 39 buffers at 3,000 live runs); enable_seqscan off
      -- around it, as above.
      v_seqscan := current_setting('enable_seqscan');
      PERFORM set_config('enable_seqscan', 'off', true);
      SELECT x.status, x.concurrency, x.workflow_id, x.workflow_version, x.input, x.cancel_requested_at INTO r
        FROM awp.runs x WHERE x.run_id = v_run;
      PERFORM set_config('enable_seqscan', v_seqscan, true);
      CONTINUE WHEN r.status IS NULL OR r.status NOT IN ('pending', 'running') OR r.cancel_requested_at IS NOT NULL
                 -- the task that succeeded in this call is not written yet: it counts out
                 OR (SELECT count(*) FROM awp.tasks y WHERE y.run_id = v_run AND y.status IN ('queued', 'running'))
                    - CASE WHEN v_run = p_run THEN 1 ELSE 0 END >= r.concurrency;
      t := awp._first_ready(v_run, w.executor_kinds, '{}', w.actions);
      CONTINUE WHEN t.task_key IS NULL;
      v_key := t.task_key;
      v_exec := t.executor;
      EXIT;
    END LOOP;
    CLOSE c;
  END IF;
  IF v_key IS NOT NULL THEN
    -- The refill's time: the completion's for a task of the completed run (held since before v_now, so whatever
    -- made the task ready was written before it), else the clock read now, after the task was seen ready. v_now was
    -- read before that run was taken: a dependency that another transaction completed meanwhile finished after
    -- v_now, and an attempt started at v_now would start before it (check_invariants: started_before_deps).
    v_at := CASE WHEN v_run = p_run THEN v_now ELSE awp._now() END;
    s := awp._settings();
    PERFORM awp._claim_is_alive(w, s, v_now);
    v_id := awp._new_dispatch_id(v_run);
    v_token := awp._token();
    v_att := t.attempts + 1;
    SELECT * INTO v_dl, v_exp, v_fence FROM awp._lease_terms(s, v_at, t.timeout_ms);
  END IF;
  -- enable_seqscan off for planning the MERGE and the tasks UPDATE below (see above), restored after them.
  v_seqscan := current_setting('enable_seqscan');
  PERFORM set_config('enable_seqscan', 'off', true);
  -- And no hash join for the tasks UPDATE: over the partitions of awp.tasks (migration 0023) the planner, with the
  -- table small, hashed the VALUES list against a full index scan of each partition instead of probing them.
  PERFORM set_config('enable_hashjoin', 'off', true);
  IF p_done IS NOT NULL THEN   -- the hot path's completion, with the refill's row when there is one
    MERGE INTO awp.dispatches x
    USING (VALUES (p_done, true), (v_id, false)) AS m(id, done)
       ON x.dispatch_id = m.id AND x.dispatch_id IN (p_done, v_id)
    WHEN MATCHED AND m.done THEN
      UPDATE SET status = 'completed', result_hash = p_done_hash, finished_at = v_now, attempt_status = 'succeeded',
                 attempt_finished_at = v_now, output = p_done_result->'output',
                 error_code = p_done_result->>'error_code', error_message = p_done_result->>'error_message',
                 counted = true
    WHEN NOT MATCHED AND NOT m.done AND m.id IS NOT NULL THEN
      INSERT (dispatch_id, run_id, task_key, executor_kind, created_at, status, worker_id, lease_token_hash, attempt,
              fencing_token, leased_at, lease_expires_at, attempt_deadline, claim_seq, attempt_status)
      VALUES (v_id, v_run, v_key, v_exec, v_at, 'leased', w.worker_id, awp._hash(v_token), v_att,
              v_fence, v_at, v_exp, v_dl, p_claim_seq, 'running');   -- v_key, v_exec: t is unset without a refill
  ELSIF v_key IS NOT NULL THEN
    INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at, status, worker_id,
                                lease_token_hash, attempt, fencing_token, leased_at, lease_expires_at,
                                attempt_deadline, claim_seq, attempt_status)
    VALUES (v_id, v_run, t.task_key, t.executor, v_at, 'leased', w.worker_id, awp._hash(v_token), v_att, v_fence,
            v_at, v_exp, v_dl, p_claim_seq, 'running');
  END IF;
  IF v_key IS NOT NULL THEN
    f_type := CASE WHEN r.status = 'pending' THEN '{run}'::text[] ELSE '{}' END || '{task,dispatch,dispatch,task,attempt}'::text[];
    f_key := CASE WHEN r.status = 'pending' THEN ARRAY[v_run] ELSE '{}' END
             || ARRAY[t.task_key, v_id, v_id, t.task_key, t.task_key || '#' || v_att];
    f_from := CASE WHEN r.status = 'pending' THEN '{pending}'::text[] ELSE '{}' END || '{ready,NULL,pending,queued,NULL}'::text[];
    f_to := CASE WHEN r.status = 'pending' THEN '{running}'::text[] ELSE '{}' END || '{queued,pending,leased,running,running}'::text[];
    f_why := CASE WHEN r.status = 'pending' THEN '{"first dispatch"}'::text[] ELSE '{}' END
             || ARRAY['dispatch created', 'dispatch created', 'claimed by ' || w.worker_id,
                      'attempt ' || v_att || ' started', 'claimed by ' || w.worker_id];
  END IF;
  -- The refilled task runs, the completed one (hot path) succeeds: one UPDATE (each write statement reads its
  -- table's CHECK constraints again, so fewer statements cost less). Planned with enable_seqscan off (see above):
  -- with the table small it was a hash join over a scan of every task, whose cost grew with the table.
  IF v_key IS NOT NULL OR p_succeeded_task IS NOT NULL THEN
    UPDATE awp.tasks y
       SET status = v.status, attempts = coalesce(v.attempts, y.attempts), updated_at = v.at, ready_at = NULL,
           finished_at = CASE WHEN v.status = 'succeeded' THEN v_now END, pending_deps = y.pending_deps - v.down
      FROM (VALUES (p_run, p_succeeded_task, 'succeeded', NULL::integer, 0, v_now),
                   (v_run, v_key, 'running', v_att, 0, v_at),
                   (p_run, p_countdown, 'waiting_dependencies', NULL, 1, v_now))
           AS v(run_id, task_key, status, attempts, down, at)
     WHERE y.run_id = v.run_id AND y.task_key = v.task_key;
  END IF;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  PERFORM set_config('enable_hashjoin', v_hashjoin, true);
  -- Each run's row and events once: the completed run's (with the refill's when it went to the same run), then
  -- the refilled run's when it is another one.
  IF v_key IS NOT NULL AND v_run = p_run THEN
    PERFORM awp._write_log(p_run, p_types || f_type, p_keys || f_key, p_from || f_from, p_to || f_to,
                           p_reasons || f_why, -1, true, v_now);
  ELSE
    IF p_run IS NOT NULL THEN
      PERFORM awp._write_log(p_run, p_types, p_keys, p_from, p_to, p_reasons, -1, false, v_now);
    END IF;
    IF v_key IS NOT NULL THEN
      PERFORM awp._write_log(v_run, f_type, f_key, f_from, f_to, f_why, 0, true, v_at);
    END IF;
  END IF;
  IF v_key IS NULL THEN
    RETURN;
  END IF;
  v_up := CASE WHEN cardinality(t.depends_on) = 0 THEN '{}'::jsonb ELSE awp._upstream(v_run, t.depends_on) END;
  IF cardinality(t.depends_on) > 8 AND octet_length(v_up::text) > awp._limit_lease_payload_bytes() THEN
    PERFORM awp._fail_oversize_lease(v_run, t.task_key, v_id, v_att, octet_length(v_up::text));
    RETURN;   -- the slot stays free: the caller's claim (or the woken coordinator) fills it
  END IF;
  RETURN QUERY SELECT v_id, v_token, r.workflow_id, r.workflow_version, v_run, t.task_key, t.executor, t.action,
                      t.input, v_att, v_dl, v_exp, awp._ms(v_exp - v_at), v_fence, r.input, v_up, t.item, t.item_index;
END $$;
COMMENT ON FUNCTION awp._lease_refill(awp.workers, bigint, timestamptz, text, text, text[], text[], text[], text[], text[], text, bytea, jsonb, text) IS 'Refills the slot a completion freed with a dispatch leased at once to that worker (claim on complete); the hot path''s completion writes are finished with it.';

-- awp._upstream(run, depends_on): {dependency key: output of its succeeded attempt} (JSON null when
-- that attempt had no output). Called only for tasks that are being leased, so every dependency has
-- succeeded and its last attempt (tasks.attempts) is the succeeded one. Locks: none.
CREATE OR REPLACE FUNCTION awp._upstream(p_run_id text, p_depends_on text[]) RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$   -- PL/pgSQL: its plan is cached
BEGIN
  -- One primary-key probe per dependency, and one per its attempt (LIMIT 1 keeps each a probe): a join here may be
  -- planned as a scan of the whole run when the statistics expect small runs (see awp._task_waits); joined to the
  -- attempts, the plan read every attempt of the run for each lease (as awp._run_output did, AWP issue 46).
  -- A task settled without an attempt has its output on its row (a mapped task's array, docs/dynamic.md); a task
  -- skipped by its condition has none (null).
  RETURN (SELECT coalesce(jsonb_object_agg(u.task_key, coalesce(a.output, t.output)), '{}'::jsonb)
            FROM unnest(p_depends_on) AS u(task_key)
            CROSS JOIN LATERAL (SELECT x.attempts, x.output FROM awp.tasks x
                                 WHERE x.run_id = p_run_id AND x.task_key = u.task_key LIMIT 1) t
            LEFT JOIN LATERAL (SELECT d.output FROM awp.dispatches d
                                WHERE d.run_id = p_run_id AND d.task_key = u.task_key AND d.attempt = t.attempts
                                  AND d.attempt_status = 'succeeded' LIMIT 1) a ON true);
END $$;
COMMENT ON FUNCTION awp._upstream(text, text[]) IS 'The outputs of a task''s direct dependencies, keyed by task key.';

-- awp._fail_oversize_lease(run, task, dispatch, attempt, bytes): settles an attempt that claim_tasks
-- just started but cannot hand out because its upstream is over the lease payload limit: the
-- dispatch is completed with a permanent failure (error_code lease_payload_too_large) as if its
-- worker had reported it, and the task fails (dependants skipped, run settled). Locks: the caller
-- holds the run and the dispatch.
CREATE OR REPLACE FUNCTION awp._fail_oversize_lease(p_run_id text, p_task_key text, p_dispatch_id text,
                                                    p_attempt integer, p_bytes integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_msg text := format('the outputs of this task''s dependencies are %s bytes, over the %s-byte lease payload limit',
                       p_bytes, awp._limit_lease_payload_bytes());
BEGIN
  PERFORM awp._append_event(p_run_id, 'dispatch', p_dispatch_id, 'leased', 'completed', 'upstream over the lease payload limit');
  PERFORM awp._end_attempt(p_run_id, p_task_key, p_attempt, 'failed', false, NULL,   -- the dispatch completes with it
                           'lease_payload_too_large', v_msg, 'upstream over the lease payload limit', true, 'completed',
                           awp._result_hash(jsonb_build_object('kind', 'permanent_failure', 'error_code',
                                                               'lease_payload_too_large', 'error_message', v_msg)));
  PERFORM awp._wake('awp_coordinator', 'completed');
END $$;
COMMENT ON FUNCTION awp._fail_oversize_lease(text, text, text, integer, integer) IS 'Fails an attempt whose upstream outputs are over the lease payload limit, before it is handed out.';
