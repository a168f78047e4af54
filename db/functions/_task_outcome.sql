-- Private helpers that settle attempts, tasks and runs. Shared by complete_task, the reaper and
-- cancel convergence. Every caller already holds the run's row lock (lock order: Run, then
-- Dispatch, then Task rows of that run).

-- awp._task_counts(run): {status: count} of the run's tasks ({} for none). Read through awp.list_runs and
-- awp.get_run for a live run; stored in runs.final_task_counts when the run finishes (its tasks never change
-- again: migration 0011_final_task_counts). Locks: none.
-- PL/pgSQL for its cached plan (a SQL function with a SET clause is planned at every call; it runs once per run
-- settled).
CREATE OR REPLACE FUNCTION awp._task_counts(p_run_id text) RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{}')
            FROM (SELECT t.status, count(*) AS n FROM awp.tasks t WHERE t.run_id = p_run_id GROUP BY 1) c);
END $$;
COMMENT ON FUNCTION awp._task_counts(text) IS 'A run''s task counts by status.';

-- awp._settle_run(run): when no task of the run can still change, the run becomes
-- `succeeded` (every task succeeded, and its output is set) or `failed`, its task counts stored
-- (runs.final_task_counts). Returns the run's status.
-- The run's row is written once, with its revision and its event's sequence (as awp._write_log does), and the event
-- inserted directly: through awp._append_event and awp._log_flush it took two UPDATEs of the row and a read of it
-- for the run state (AWP issue 46: a settle per one-task run). A run the call's state (awp.log_state) holds is
-- flushed first, so its row is up to date. Locks: the run row, which the caller holds.
CREATE OR REPLACE FUNCTION awp._settle_run(p_run_id text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_status text;
  v_left   integer;
  v_final  text;
  v_counts jsonb;
  v_output jsonb;
  v_cut    boolean;
  v_parent text;
  v_now    timestamptz;
  v_xid    xid8;
  v_rev    bigint;
  v_last   bigint;
BEGIN
  IF strpos(coalesce(current_setting('awp.log_state', true), ''), ';' || p_run_id || ',') > 0 THEN
    PERFORM awp._log_flush();
  END IF;
  SELECT r.status, r.unfinished_tasks, r.parent_run_id INTO v_status, v_left, v_parent
    FROM awp.runs r WHERE r.run_id = p_run_id;
  IF v_status NOT IN ('pending', 'running') OR v_left > 0 THEN
    RETURN v_status;
  END IF;
  v_counts := awp._task_counts(p_run_id);   -- one pass over the tasks: stored, and it decides the status
  -- A skipped task with no failed one: skipped by its condition (docs/dynamic.md), not by a failure.
  v_final := CASE WHEN v_counts - 'succeeded' - 'skipped' = '{}'::jsonb THEN 'succeeded' ELSE 'failed' END;
  IF v_final = 'succeeded' THEN
    SELECT o.output, o.truncated INTO v_output, v_cut FROM awp._run_output(p_run_id) o;
  END IF;
  v_now := awp._now();
  v_xid := pg_current_xact_id();
  UPDATE awp.runs r SET status = v_final, finished_at = v_now, started_at = coalesce(r.started_at, v_now),
                        final_task_counts = v_counts,
                        output = CASE WHEN v_final = 'succeeded' THEN v_output ELSE r.output END,
                        output_truncated = CASE WHEN v_final = 'succeeded' THEN v_cut ELSE r.output_truncated END,
                        revision = CASE WHEN r.revision_xid = v_xid THEN r.revision ELSE r.revision + 1 END,
                        revision_xid = v_xid, last_sequence = r.last_sequence + 1
   WHERE r.run_id = p_run_id
  RETURNING r.revision, r.last_sequence INTO v_rev, v_last;
  INSERT INTO awp.events (run_id, sequence, revision, entity_type, entity_key, from_status, to_status, reason, occurred_at)
  VALUES (p_run_id, v_last, v_rev, 'run', p_run_id, v_status, v_final,
          CASE v_final WHEN 'succeeded' THEN 'all tasks succeeded' ELSE 'a task failed' END, v_now);
  -- No NOTIFY to the coordinator: a finished run gives a pass nothing to do (its slots were freed and refilled by
  -- the completions), and with many small runs a wake-up per finished run kept the coordinator passing back to
  -- back (AWP issue 46). A child run's end is the exception: its parent's task is settled by a pass
  -- (awp._settle_children; docs/dynamic.md).
  IF v_parent IS NOT NULL THEN
    PERFORM awp._wake('awp_coordinator', 'child_run_finished');
  END IF;
  RETURN v_final;
END $$;
COMMENT ON FUNCTION awp._settle_run(text) IS 'Finishes a run (succeeded/failed) once none of its tasks can change.';

-- awp._run_output(run): the output of a succeeded run: {task key: output of its succeeded attempt}
-- for every task with no dependants, in definition order. Bounded at 1 MiB (sum of the outputs' jsonb
-- text): the tasks past that map to null and truncated is true; their outputs stay readable
-- through awp.task_attempts. awp._settle_run writes it with the run's status, in one UPDATE. PL/pgSQL, not SQL:
-- a SQL function is planned again at every call (measured 0.3 of 0.4 ms per run settled; AWP issue 46).
CREATE OR REPLACE FUNCTION awp._run_output(p_run_id text, OUT output jsonb, OUT truncated boolean)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH leaves AS (
    SELECT t.task_key, coalesce(a.output, t.output) AS output,
           sum(coalesce(octet_length(a.output::text), 4) + octet_length(t.task_key) + 6)
             OVER (ORDER BY t.ordinal) AS upto
      FROM awp.tasks t
      -- Its succeeded attempt by key (LATERAL ... LIMIT 1: a probe per task). As a join, a plan made while the runs
      -- were small (a few tasks each) read the run's attempts once and compared each task with all of them: 0.85 s
      -- to settle a run of 5,000 tasks (AWP issue 46; python/tests/sql/test_completion_plans.py).
      LEFT JOIN LATERAL (SELECT d.output FROM awp.dispatches d
                          WHERE d.run_id = t.run_id AND d.task_key = t.task_key AND d.attempt = t.attempts
                            AND d.attempt_status = 'succeeded' LIMIT 1) a ON true
     WHERE t.run_id = p_run_id AND cardinality(t.dependants) = 0
  )
  SELECT coalesce(jsonb_object_agg(l.task_key, CASE WHEN l.upto <= awp._limit_run_output_bytes() THEN l.output END), '{}'),
         coalesce(bool_or(l.upto > awp._limit_run_output_bytes()), false)
    INTO output, truncated
    FROM leaves l;
END $$;
COMMENT ON FUNCTION awp._run_output(text) IS 'A succeeded run''s output: the outputs of its tasks without dependants (at most 1 MiB), and whether it was cut.';

-- awp._skip_descendants(run, task): every task that transitively depends on a failed task
-- (all of them still waiting) becomes `skipped` (skip_reason dependency_failed). When the failed task is an instance
-- of a for_each task (docs/dynamic.md), that mapped task fails (error instance_failed) and its descendants are
-- skipped instead; its other instances go on.
CREATE OR REPLACE FUNCTION awp._skip_descendants(p_run_id text, p_task_key text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_keys   text[];
  v_mapped text;
BEGIN
  SELECT t.mapped_task INTO v_mapped FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = p_task_key;
  IF v_mapped IS NOT NULL THEN
    UPDATE awp.tasks t SET status = 'failed', finished_at = awp._now(), updated_at = awp._now(), pending_deps = 0,
                           error_code = 'instance_failed', error_message = format('instance %s failed', p_task_key)
     WHERE t.run_id = p_run_id AND t.task_key = v_mapped AND t.status = 'waiting_dependencies';
    IF FOUND THEN
      PERFORM awp._unfinished_add(p_run_id, -1);
      PERFORM awp._append_event(p_run_id, 'task', v_mapped, 'waiting_dependencies', 'failed',
                                format('instance %s failed', p_task_key));
      PERFORM awp._skip_descendants(p_run_id, v_mapped);
    END IF;
    RETURN;
  END IF;
  WITH RECURSIVE d(task_key) AS (
    SELECT unnest(t.dependants) FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = p_task_key
    UNION
    SELECT unnest(t.dependants) FROM awp.tasks t JOIN d ON t.run_id = p_run_id AND t.task_key = d.task_key
  ), u AS (
    UPDATE awp.tasks t SET status = 'skipped', finished_at = awp._now(), updated_at = awp._now(),
                           skip_reason = 'dependency_failed'
      FROM d
     WHERE t.run_id = p_run_id AND t.task_key = d.task_key AND t.status = 'waiting_dependencies'
    RETURNING t.task_key, t.ordinal
  )
  SELECT array_agg(u.task_key ORDER BY u.ordinal) INTO v_keys FROM u;
  PERFORM awp._unfinished_add(p_run_id, -coalesce(cardinality(v_keys), 0));
  PERFORM awp._append_events_alike(p_run_id, 'task', v_keys, array_fill('waiting_dependencies'::text, ARRAY[coalesce(cardinality(v_keys), 0)]),
                                   'skipped', format('dependency %s failed', p_task_key));
END $$;
COMMENT ON FUNCTION awp._skip_descendants(text, text) IS 'Skips every waiting descendant of a failed task.';

-- awp._unlock_dependants(run, dependants, now): a task of the run succeeded (or was skipped by its condition): each
-- of its dependants still waiting has one dependency less, and those with none left become ready. Returns `ready`,
-- the keys that became ready, in definition order (their events are the caller's: waiting_dependencies -> ready),
-- or NULL; and `resolve`: a task with a `when` or a `for_each` (or a mapped task whose last instance succeeded)
-- has none left, and stays waiting_dependencies, or a task run by the database (a child run, a signal or sleep)
-- became ready, for the caller to pass the run to awp._resolve_run
-- (db/functions/_dynamic.sql) once its own writes are done. Shared by awp._end_attempt, the hot path
-- (awp._complete_and_refill), the group path and awp._resolve_run. Locks: those task rows; the caller holds the
-- run.
CREATE OR REPLACE FUNCTION awp._unlock_dependants(p_run_id text, p_dependants text[], p_now timestamptz,
                                                  OUT ready text[], OUT resolve boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH u AS (
    UPDATE awp.tasks x
       SET pending_deps = x.pending_deps - 1,
           status = CASE WHEN x.pending_deps = 1 AND x.condition IS NULL AND x.for_each IS NULL THEN 'ready'
                         ELSE x.status END,
           updated_at = p_now
     WHERE x.run_id = p_run_id AND x.task_key = ANY (p_dependants) AND x.status = 'waiting_dependencies'
    RETURNING x.task_key, x.status, x.ordinal, x.pending_deps, x.executor
  )
  SELECT array_agg(u.task_key ORDER BY u.ordinal) FILTER (WHERE u.status = 'ready'),
         coalesce(bool_or((u.pending_deps = 0 AND u.status <> 'ready')
                          OR (u.status = 'ready' AND u.executor IN ('workflow', 'signal', 'sleep'))),   -- awp._database_kinds()
                  false)
    INTO ready, resolve FROM u;
END $$;
COMMENT ON FUNCTION awp._unlock_dependants(text, text[], timestamptz) IS 'Counts a success against the waiting dependants of a task; returns those that became ready, and whether a dynamic task waits for awp._resolve_run.';

-- awp._retry_wait(task): the wait before a task's next attempt after its counted attempt n failed (docs/protocol.md,
-- Retries): min(max_interval_ms, interval_ms x backoff^(n-1)), less a random part of up to jitter x that (the
-- database's random()). backoff 1 and jitter 0 (the defaults): interval_ms, as before migration 0017. Locks: none.
CREATE OR REPLACE FUNCTION awp._retry_wait(t awp.tasks) RETURNS interval
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_ms numeric := t.interval_ms;
BEGIN
  IF t.backoff <> 1 THEN
    v_ms := t.interval_ms * power(t.backoff, greatest(t.attempts - t.uncounted_attempts - 1, 0));
  END IF;
  IF t.max_interval_ms IS NOT NULL THEN
    v_ms := least(v_ms, t.max_interval_ms);
  END IF;
  IF t.jitter > 0 THEN
    v_ms := v_ms * (1 - random() * t.jitter);
  END IF;
  RETURN make_interval(secs => round(v_ms) / 1000.0);
END $$;
COMMENT ON FUNCTION awp._retry_wait(awp.tasks) IS 'The wait before a task''s next attempt: interval_ms grown by backoff, capped by max_interval_ms, less jitter.';

-- awp._end_attempt(run, task, attempt, attempt_status, retryable, output, error_code,
--                  error_message, reason, counted, dispatch_status, result_hash, error_detail): settles a running attempt
-- (with its dispatch, whose row it is: the dispatch becomes dispatch_status -- completed with result_hash,
-- or expired with none -- in the same UPDATE) and then its task:
--   succeeded                 -> task succeeded, dependants whose dependencies all succeeded become ready;
--   failed/timed_out/interrupted/not_received, retryable and attempts left
--                             -> task waiting_retry (ready_at = now + interval_ms; now when not counted);
--   otherwise                 -> task failed, descendants skipped.
-- counted false (a lease lost to a lost claim answer or to an outage, docs/protocol.md, Lease recovery):
-- the attempt does not count against max_attempts (attempts.counted, tasks.uncounted_attempts), up to
-- 100 such attempts per task; past that it counts like any other, so no task retries without end.
-- Finally settles the run. Returns the task's new status.
CREATE OR REPLACE FUNCTION awp._end_attempt(p_run_id text, p_task_key text, p_attempt integer,
                                            p_attempt_status text, p_retryable boolean,
                                            p_output jsonb, p_error_code text, p_error_message text,
                                            p_reason text, p_counted boolean, p_dispatch_status text,
                                            p_result_hash bytea, p_error_detail text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now   timestamptz := awp._now();
  t       awp.tasks;
  v_to    text;
  v_ready text[];
  v_resolve boolean;
  v_free  boolean;
BEGIN
  SELECT * INTO t FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = p_task_key FOR UPDATE;
  v_free := NOT p_counted AND t.uncounted_attempts < 100;
  -- The attempt is its dispatch's row (0010_fold_attempts), written once with the dispatch's own end: a second
  -- UPDATE of a row this transaction wrote runs its foreign-key checks again, and the one on worker_id takes
  -- FOR KEY SHARE on the worker's row, where that worker's heartbeat (FOR UPDATE) would wait for this commit.
  UPDATE awp.dispatches x
     SET status = p_dispatch_status, finished_at = v_now, result_hash = p_result_hash,
         attempt_status = p_attempt_status, attempt_finished_at = v_now, output = p_output,
         error_code = p_error_code, error_message = p_error_message, counted = NOT v_free,
         error_detail = p_error_detail
   WHERE x.run_id = p_run_id AND x.task_key = p_task_key AND x.attempt = p_attempt AND x.attempt_status = 'running';

  IF p_attempt_status = 'succeeded' THEN
    v_to := 'succeeded';
  ELSIF p_retryable AND (v_free OR t.attempts - t.uncounted_attempts < t.max_attempts) THEN
    v_to := 'waiting_retry';
  ELSE
    v_to := 'failed';
  END IF;
  UPDATE awp.tasks x
     SET status = v_to, updated_at = v_now,
         uncounted_attempts = x.uncounted_attempts + CASE WHEN v_free THEN 1 ELSE 0 END,
         ready_at = CASE WHEN v_to = 'waiting_retry'
                         THEN v_now + CASE WHEN v_free THEN interval '0' ELSE awp._retry_wait(t) END
                    END,
         wait_until = NULL,
         finished_at = CASE WHEN v_to IN ('succeeded', 'failed') THEN v_now END
   WHERE x.run_id = p_run_id AND x.task_key = p_task_key;
  IF v_to IN ('succeeded', 'failed') THEN
    PERFORM awp._unfinished_add(p_run_id, -1);
  END IF;
  PERFORM awp._append_events(p_run_id, '{attempt,task}', ARRAY[p_task_key || '#' || p_attempt, p_task_key],
                             ARRAY['running', t.status], ARRAY[p_attempt_status, v_to], ARRAY[p_reason, p_reason]);

  IF v_to = 'succeeded' AND cardinality(t.dependants) > 0 THEN
    SELECT u.ready, u.resolve INTO v_ready, v_resolve FROM awp._unlock_dependants(p_run_id, t.dependants, v_now) u;
    PERFORM awp._append_events_alike(p_run_id, 'task', v_ready,
                                     array_fill('waiting_dependencies'::text, ARRAY[coalesce(cardinality(v_ready), 0)]),
                                     'ready', 'dependencies succeeded');
    IF v_resolve THEN
      PERFORM awp._resolve_run(p_run_id);
    END IF;
  ELSIF v_to = 'failed' THEN
    PERFORM awp._skip_descendants(p_run_id, p_task_key);
  END IF;
  PERFORM awp._settle_run(p_run_id);
  RETURN v_to;
END $$;
COMMENT ON FUNCTION awp._end_attempt(text, text, integer, text, boolean, jsonb, text, text, text, boolean, text, bytea, text) IS 'Settles a running attempt (counted against max_attempts or not), its task (retry/fail/succeed, unlock or skip dependants) and the run.';

-- awp._converge_cancel(run): converges a run whose cancellation was requested: pending and
-- leased dispatches canceled, running attempts canceled, unfinished tasks canceled, run canceled (its task
-- counts stored: runs.final_task_counts).
-- The caller holds the run lock; dispatches are locked in dispatch_id order.
CREATE OR REPLACE FUNCTION awp._converge_cancel(p_run_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now    timestamptz := awp._now();
  v_status text;
  v_keys   text[];
  v_from   text[];
  v_attempts text[];
  v_child  text;
  v_children text[];
  v_child_attempts text[];
BEGIN
  SELECT r.status INTO v_status FROM awp.runs r
   WHERE r.run_id = p_run_id AND r.cancel_requested_at IS NOT NULL AND r.status IN ('pending', 'running');
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  -- Its running child runs are canceled too, and the attempts of its running tasks run by the database (child runs,
  -- waits: they have no dispatch) with them (docs/dynamic.md, docs/waits.md; lock order: the parent, then its
  -- children).
  SELECT array_agg(t.child_run_id ORDER BY t.child_run_id) FILTER (WHERE t.child_run_id IS NOT NULL),
         array_agg(t.task_key || '#' || t.attempts ORDER BY t.ordinal)
    INTO v_children, v_child_attempts
    FROM awp.tasks t
   WHERE t.run_id = p_run_id AND t.status = 'running' AND t.executor = ANY (awp._database_kinds());
  FOREACH v_child IN ARRAY coalesce(v_children, '{}') LOOP
    PERFORM awp._request_cancel(v_child);
  END LOOP;
  PERFORM awp._append_events_alike(p_run_id, 'attempt', v_child_attempts,
                                   array_fill('running'::text, ARRAY[coalesce(cardinality(v_child_attempts), 0)]),
                                   'canceled', 'run canceled');
  -- A leased dispatch's running attempt is canceled with it, in the same UPDATE (the attempt is the dispatch's
  -- row: 0010_fold_attempts; see awp._end_attempt for why a row is written once).
  WITH l AS (
    SELECT d.dispatch_id, d.status, d.attempt_status FROM awp.dispatches d
     WHERE d.run_id = p_run_id AND d.status IN ('pending', 'leased')
     ORDER BY d.dispatch_id FOR UPDATE
  ), u AS (
    UPDATE awp.dispatches d
       SET status = 'canceled', finished_at = v_now,
           attempt_status = CASE WHEN l.attempt_status = 'running' THEN 'canceled' ELSE d.attempt_status END,
           attempt_finished_at = CASE WHEN l.attempt_status = 'running' THEN v_now ELSE d.attempt_finished_at END
      FROM l WHERE d.dispatch_id = l.dispatch_id
    RETURNING d.dispatch_id, l.status AS from_status,
              CASE WHEN l.attempt_status = 'running' THEN d.task_key || '#' || d.attempt END AS attempt_key
  )
  SELECT array_agg(u.dispatch_id ORDER BY u.dispatch_id), array_agg(u.from_status ORDER BY u.dispatch_id),
         array_agg(u.attempt_key ORDER BY u.attempt_key) FILTER (WHERE u.attempt_key IS NOT NULL)
    INTO v_keys, v_from, v_attempts FROM u;
  PERFORM awp._append_events_alike(p_run_id, 'dispatch', v_keys, v_from, 'canceled', 'run canceled');
  PERFORM awp._append_events_alike(p_run_id, 'attempt', v_attempts,
                                   array_fill('running'::text, ARRAY[coalesce(cardinality(v_attempts), 0)]),
                                   'canceled', 'run canceled');

  WITH l AS (
    SELECT t.task_key, t.status, t.ordinal FROM awp.tasks t
     WHERE t.run_id = p_run_id
       AND t.status IN ('waiting_dependencies', 'ready', 'queued', 'running', 'waiting_retry')
     FOR UPDATE
  ), u AS (
    UPDATE awp.tasks t SET status = 'canceled', finished_at = v_now, updated_at = v_now, ready_at = NULL,
                           wait_until = NULL
      FROM l WHERE t.run_id = p_run_id AND t.task_key = l.task_key
    RETURNING t.task_key, l.status AS from_status, l.ordinal
  )
  SELECT array_agg(u.task_key ORDER BY u.ordinal), array_agg(u.from_status ORDER BY u.ordinal)
    INTO v_keys, v_from FROM u;
  PERFORM awp._append_events_alike(p_run_id, 'task', v_keys, v_from, 'canceled', 'run canceled');

  PERFORM awp._log_flush();   -- pending counter changes first: the count is set to 0 here
  UPDATE awp.runs r SET status = 'canceled', finished_at = v_now, unfinished_tasks = 0,
                        final_task_counts = awp._task_counts(p_run_id)
   WHERE r.run_id = p_run_id;
  PERFORM awp._append_event(p_run_id, 'run', p_run_id, v_status, 'canceled', 'cancellation converged');
  PERFORM awp._wake('awp_coordinator', 'run_canceled');   -- also settles its parent's task, for a child run
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._converge_cancel(text) IS 'Converges a requested cancellation: dispatches, attempts, tasks and the run become canceled.';
