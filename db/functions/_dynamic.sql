-- Dynamic workflows (docs/dynamic.md): `when` conditions and `for_each` fan-out over a list produced at run time,
-- resolved by the database under the run's lock, by the call that completed the dependency.
--
-- A task with a `when` or a `for_each` never becomes ready straight from its dependencies: awp._unlock_dependants
-- leaves it waiting_dependencies with pending_deps 0 and says so (`resolve`), and its caller (awp._end_attempt, the
-- hot path awp._complete_and_refill, the group path) passes the run to awp._resolve_run once its own writes and
-- events are done. There:
--   a mapped task whose instances all succeeded   -> succeeded, output the array of their outputs in index order
--   a `when` that does not hold                    -> skipped (skip_reason condition_false); its dependants count it
--                                                    as done (its output is null for them)
--   a `for_each` (its `when`, if any, holds)       -> the dependency's output must be an array of at most max_items
--                                                    elements: one instance per element ("<key>[<i>]", ready, with
--                                                    the task's executor, action, input, retry and timeout; the
--                                                    element and index on its lease; its dependencies are the
--                                                    task's but the list's, which `item` replaces: a lease does not
--                                                    carry the whole list), and the mapped task waits
--                                                    for them (pending_deps counts those not yet succeeded); an
--                                                    empty array: succeeded with []; otherwise failed, error
--                                                    for_each_invalid, dependants skipped
--   a `when` that holds, no for_each               -> ready
-- An instance that fails for good fails its mapped task (awp._skip_descendants). Locks: the caller holds the run;
-- the run's task rows.

-- awp._condition_holds(run, when): does a task's `when` hold? The value at `path` in the output of the dependency
-- `task` (JSON null when the path leads nowhere or the dependency was skipped) compared with `equals` (or
-- `not_equals`) as JSON values. Locks: none.
CREATE OR REPLACE FUNCTION awp._condition_holds(p_run_id text, p_when jsonb) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_value jsonb;
BEGIN
  v_value := coalesce(awp._upstream(p_run_id, ARRAY[p_when->>'task'])->(p_when->>'task')
                        #> ARRAY(SELECT jsonb_array_elements_text(coalesce(p_when->'path', '[]'))),
                      'null'::jsonb);
  RETURN CASE WHEN p_when ? 'equals' THEN v_value = p_when->'equals' ELSE v_value <> p_when->'not_equals' END;
END $$;
COMMENT ON FUNCTION awp._condition_holds(text, jsonb) IS 'Whether a task''s when condition holds on its dependency''s output.';

-- awp._settle_without_attempt(run, task, status, now, output, error_code, error_message, skip_reason, reason):
-- a waiting task settled by the database (no attempt): its row, its event (waiting_dependencies -> status, for
-- reason), one unfinished task less; then its dependants: unlocked when it succeeded or was skipped by its
-- condition (returns whether a dynamic one now waits for awp._resolve_run), skipped when it failed. Locks: the
-- task's row and its dependants'; the caller holds the run.
CREATE OR REPLACE FUNCTION awp._settle_without_attempt(p_run_id text, p_task_key text, p_status text, p_now timestamptz,
                                                       p_output jsonb, p_error_code text, p_error_message text,
                                                       p_skip_reason text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_deps    text[];
  v_ready   text[];
  v_resolve boolean := false;
BEGIN
  UPDATE awp.tasks x
     SET status = p_status, finished_at = p_now, updated_at = p_now, output = p_output, error_code = p_error_code,
         error_message = p_error_message, skip_reason = p_skip_reason
   WHERE x.run_id = p_run_id AND x.task_key = p_task_key
  RETURNING x.dependants INTO v_deps;
  PERFORM awp._unfinished_add(p_run_id, -1);
  PERFORM awp._append_event(p_run_id, 'task', p_task_key, 'waiting_dependencies', p_status, p_reason);
  IF p_status = 'failed' THEN
    PERFORM awp._skip_descendants(p_run_id, p_task_key);
  ELSIF cardinality(v_deps) > 0 THEN
    SELECT u.ready, u.resolve INTO v_ready, v_resolve FROM awp._unlock_dependants(p_run_id, v_deps, p_now) u;
    PERFORM awp._append_events_alike(p_run_id, 'task', v_ready,
                                     array_fill('waiting_dependencies'::text, ARRAY[coalesce(cardinality(v_ready), 0)]),
                                     'ready', 'dependencies done');
  END IF;
  RETURN v_resolve;
END $$;
COMMENT ON FUNCTION awp._settle_without_attempt(text, text, text, timestamptz, jsonb, text, text, text, text) IS 'Settles a waiting task without an attempt (a mapped task, a condition skip) and passes it on to its dependants.';

-- awp._expand_for_each(run, task, now): a mapped task whose dependencies are done (and whose `when` holds): its
-- instances created, or the task settled when the list is empty or invalid (see the top of this file). Returns
-- whether a dynamic task now waits for awp._resolve_run. Locks: the task's row and its instances' (created); the
-- caller holds the run.
CREATE OR REPLACE FUNCTION awp._expand_for_each(p_run_id text, p_task_key text, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t       record;
  v_list  jsonb;
  v_n     integer;
  v_after integer;
  v_err   text;
  v_keys  text[];
BEGIN
  SELECT x.for_each, x.max_items INTO t FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = p_task_key;
  v_list := awp._upstream(p_run_id, ARRAY[t.for_each])->(t.for_each);
  IF jsonb_typeof(v_list) IS DISTINCT FROM 'array' THEN
    v_err := format('for_each: the output of %s is %s, not an array', t.for_each,
                    coalesce('a JSON ' || jsonb_typeof(v_list), 'missing (the task was skipped)'));
  ELSIF jsonb_array_length(v_list) > t.max_items THEN
    v_err := format('for_each: the output of %s has %s elements, over max_items %s', t.for_each,
                    jsonb_array_length(v_list), t.max_items);
  END IF;
  IF v_err IS NOT NULL THEN
    RETURN awp._settle_without_attempt(p_run_id, p_task_key, 'failed', p_now, NULL, 'for_each_invalid', v_err, NULL,
                                       'for_each_invalid');
  END IF;
  v_n := jsonb_array_length(v_list);
  IF v_n = 0 THEN
    UPDATE awp.tasks x SET item_count = 0 WHERE x.run_id = p_run_id AND x.task_key = p_task_key;
    RETURN awp._settle_without_attempt(p_run_id, p_task_key, 'succeeded', p_now, '[]'::jsonb, NULL, NULL, NULL,
                                       'for_each over an empty list');
  END IF;
  -- The instances follow every task of the run in definition order (ordinal), in index order.
  SELECT max(x.ordinal) INTO v_after FROM awp.tasks x WHERE x.run_id = p_run_id;
  WITH i AS (
    INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants, pending_deps,
                           max_attempts, interval_ms, timeout_ms, status, updated_at, mapped_task, item, item_index,
                           backoff, max_interval_ms, jitter, limit_buckets, priority)
    SELECT p_run_id, p_task_key || '[' || (e.o - 1) || ']', v_after + e.o::integer, x.executor, x.action, x.input,
           array_remove(x.depends_on, x.for_each), ARRAY[p_task_key], 0, x.max_attempts, x.interval_ms, x.timeout_ms,
           'ready', p_now,
           p_task_key, e.v, (e.o - 1)::integer, x.backoff, x.max_interval_ms, x.jitter, x.limit_buckets, x.priority
      FROM awp.tasks x, jsonb_array_elements(v_list) WITH ORDINALITY AS e(v, o)
     WHERE x.run_id = p_run_id AND x.task_key = p_task_key
    RETURNING task_key, ordinal
  )
  SELECT array_agg(i.task_key ORDER BY i.ordinal) INTO v_keys FROM i;
  UPDATE awp.tasks x SET pending_deps = v_n, item_count = v_n, updated_at = p_now
   WHERE x.run_id = p_run_id AND x.task_key = p_task_key;
  PERFORM awp._unfinished_add(p_run_id, v_n);
  PERFORM awp._append_events_alike(p_run_id, 'task', v_keys, NULL, 'ready', 'for_each instance of ' || p_task_key);
  PERFORM awp._wake('awp_coordinator', 'for_each');   -- more ready tasks than the refill of one slot
  RETURN false;
END $$;
COMMENT ON FUNCTION awp._expand_for_each(text, text, timestamptz) IS 'Creates a mapped task''s instances from its dependency''s output (or settles it: empty, invalid).';

-- awp._resolve_run(run): resolves every dynamic task of the run whose dependencies (or instances) are done, until
-- none is left (a skip or a success may unlock more), then settles the run (awp._settle_run). See the top of this
-- file. Then the tasks run by the database made ready start (awp._start_database_tasks). Locks: as above; the
-- caller holds the run.
CREATE OR REPLACE FUNCTION awp._resolve_run(p_run_id text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now    timestamptz := awp._now();
  t        record;
  v_again  boolean := true;
  v_out    jsonb;
BEGIN
  WHILE v_again LOOP
    v_again := false;
    FOR t IN
      SELECT x.task_key, x.condition, x.for_each, x.item_count
        FROM awp.tasks x
       WHERE x.run_id = p_run_id AND x.status = 'waiting_dependencies' AND x.pending_deps = 0
       ORDER BY x.ordinal
         FOR UPDATE
    LOOP
      IF t.item_count IS NOT NULL THEN   -- its instances all succeeded
        SELECT jsonb_agg(coalesce(a.output, 'null'::jsonb) ORDER BY i.item_index) INTO v_out
          FROM awp.tasks i
          -- each instance's succeeded attempt by key, as awp._run_output reads a run's leaves (a join compared each
          -- instance with every attempt of the run: 0.7 s for 5,000 instances)
          LEFT JOIN LATERAL (SELECT d.output FROM awp.dispatches d
                              WHERE d.run_id = p_run_id AND d.task_key = i.task_key AND d.attempt = i.attempts
                                AND d.attempt_status = 'succeeded' LIMIT 1) a ON true
         WHERE i.run_id = p_run_id AND i.mapped_task = t.task_key;
        IF octet_length(v_out::text) > awp._limit_lease_payload_bytes() THEN
          v_again := awp._settle_without_attempt(p_run_id, t.task_key, 'failed', v_now, NULL, 'for_each_output_too_large',
                       format('the outputs of its %s instances are %s bytes, over the %s-byte limit of an upstream',
                              t.item_count, octet_length(v_out::text), awp._limit_lease_payload_bytes()),
                       NULL, 'for_each_output_too_large') OR v_again;
        ELSE
          v_again := awp._settle_without_attempt(p_run_id, t.task_key, 'succeeded', v_now, v_out, NULL, NULL, NULL,
                                                 'every instance succeeded') OR v_again;
        END IF;
      ELSIF t.condition IS NOT NULL AND NOT awp._condition_holds(p_run_id, t.condition) THEN
        v_again := awp._settle_without_attempt(p_run_id, t.task_key, 'skipped', v_now, NULL, NULL, NULL,
                                               'condition_false', 'condition_false') OR v_again;
      ELSIF t.for_each IS NOT NULL THEN
        v_again := awp._expand_for_each(p_run_id, t.task_key, v_now) OR v_again;
      ELSE   -- its condition holds
        UPDATE awp.tasks x SET status = 'ready', updated_at = v_now WHERE x.run_id = p_run_id AND x.task_key = t.task_key;
        PERFORM awp._append_event(p_run_id, 'task', t.task_key, 'waiting_dependencies', 'ready', 'condition holds');
        PERFORM awp._wake('awp_coordinator', 'condition');
      END IF;
    END LOOP;
  END LOOP;
  IF EXISTS (SELECT 1 FROM awp.ready_queue q WHERE q.run_id = p_run_id AND q.executor_kind = ANY (awp._database_kinds())) THEN
    PERFORM awp._start_database_tasks(p_run_id);   -- child runs, waits made ready (see awp._start_database_tasks)
  END IF;
  PERFORM awp._settle_run(p_run_id);
END $$;
COMMENT ON FUNCTION awp._resolve_run(text) IS 'Resolves the dynamic tasks of a run whose dependencies are done (conditions, for_each), then settles the run.';

-- ================================================================ child runs
-- A task of executor `workflow` (docs/dynamic.md) is run by the database: no worker, no dispatch. When it is ready
-- and its run has room under its concurrency, awp._start_database_tasks starts a run of the workflow named by its input
-- (the child: parent_run_id, parent_task_key, depth + 1) and the task runs attempt N with child_run_id set (events:
-- task ready -> running, attempt "<key>#N" created -> running). The child is dispatched by the coordinator's next
-- pass. When the child ends, its settle wakes the coordinator, whose pass (awp._settle_children) settles the task
-- under the parent's lock as a worker's result would be: the child succeeded -> the task succeeds with the child's
-- output; failed or canceled -> the attempt fails (error child_run_failed, retried as the task's retry says: each
-- attempt starts a new child). A child that cannot start fails its attempt for good: an unknown workflow or
-- version (not_found), a run input that is not valid or the depth limit of 10 (invalid_request).
-- Lock order: a parent run before its children. A child never locks its parent (that is why the coordinator, not the
-- child's own last transaction, settles the parent's task); a parent's cancel cancels its running children
-- (awp._converge_cancel -> awp._request_cancel), taking their locks after its own.

-- awp._database_kinds(): the executor kinds the database runs itself (a definition may name them, a worker may not):
-- workflow (a child run, above), signal and sleep (docs/waits.md, db/functions/send_signal.sql).
CREATE OR REPLACE FUNCTION awp._database_kinds() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT ARRAY['workflow', 'signal', 'sleep'] $$;
COMMENT ON FUNCTION awp._database_kinds() IS 'The executor kinds run by the database itself (no worker).';

-- awp._workflow_input_error(input): what is wrong with the input of a task of executor workflow, or NULL:
-- {"workflow_id": "<id>", "version": null | integer >= 1 (optional: the latest), "run_input": {...} (optional: the
-- task's upstream)}. Locks: none.
CREATE OR REPLACE FUNCTION awp._workflow_input_error(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN CASE
    WHEN jsonb_typeof(p) IS DISTINCT FROM 'object'
      THEN 'a task of executor workflow needs an input {"workflow_id", "version", "run_input"}'
    WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(p) k WHERE k NOT IN ('workflow_id', 'version', 'run_input'))
      THEN 'input of a workflow task has unknown fields (allowed: workflow_id, version, run_input)'
    WHEN jsonb_typeof(p->'workflow_id') IS DISTINCT FROM 'string' OR (p->>'workflow_id') !~ '^[A-Za-z0-9._-]{1,128}$'
      THEN 'input.workflow_id must be a workflow id (1-128 characters from [A-Za-z0-9._-])'
    WHEN p ? 'version' AND jsonb_typeof(p->'version') <> 'null' AND NOT awp._int_ok(p->'version', 1, 2147483647)
      THEN 'input.version must be null (the latest) or an integer >= 1'
    WHEN p ? 'run_input' AND jsonb_typeof(p->'run_input') IS DISTINCT FROM 'object'
      THEN 'input.run_input must be a JSON object'
  END;
END $$;
COMMENT ON FUNCTION awp._workflow_input_error(jsonb) IS 'What is wrong with the input of a workflow (child run) task, or NULL.';

-- awp._start_database_tasks(run): starts the run's ready tasks of the executor kinds the database runs
-- (awp._database_kinds), in definition order, while the run has room under its concurrency (its queued and running
-- tasks; such a running task counts): a workflow task starts its child run (above); a signal task waits for its
-- signal (awp.send_signal; wait_until: its timeout, from input.timeout_ms, or none); a sleep task sleeps until
-- input.until or for input.sleep_ms (wait_until). Each runs attempt N (events: task ready -> running, attempt
-- "<key>#N" created -> running). The others stay ready (the coordinator's pass tries again:
-- awp._settle_children). Returns how many attempts started. Locks: the caller holds the run; the task rows; each
-- child's rows (new).
CREATE OR REPLACE FUNCTION awp._start_database_tasks(p_run_id text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r       record;
  t       record;
  v_now   timestamptz := awp._now();
  v_room  integer;
  v_n     integer := 0;
  v_att   integer;
  v_child text;
  v_code  text;
  v_err   text;
  v_msg   text;
  v_det   text;
BEGIN
  SELECT x.status, x.concurrency, x.depth INTO r FROM awp.runs x
   WHERE x.run_id = p_run_id AND x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  v_room := r.concurrency - (SELECT count(*) FROM awp.tasks y WHERE y.run_id = p_run_id AND y.status IN ('queued', 'running'));
  FOR t IN
    SELECT y.task_key, y.input, y.depends_on, y.attempts, y.executor FROM awp.tasks y
     WHERE y.run_id = p_run_id AND y.status = 'ready' AND y.executor = ANY (awp._database_kinds())
     ORDER BY y.ordinal
       FOR UPDATE
  LOOP
    EXIT WHEN v_room <= 0;
    v_att := t.attempts + 1;
    v_child := NULL;
    v_code := NULL;
    IF t.executor <> 'workflow' THEN   -- signal, sleep: a wait (docs/waits.md)
      PERFORM awp._start_wait(p_run_id, t.task_key, t.executor, t.input, v_att, r.status = 'pending', v_now);
      r.status := 'running';
      v_n := v_n + 1;
      v_room := v_room - 1;
      CONTINUE;
    END IF;
    IF r.depth >= 10 THEN
      v_code := 'invalid_request';
      v_err := format('run %s is at depth %s: child runs nest at most 10 deep', p_run_id, r.depth);
    ELSE
      BEGIN   -- a subtransaction: a child that cannot start fails the attempt, not the caller's call
        v_child := awp._start_run(t.input->>'workflow_id', (t.input->>'version')::integer, NULL,
                                  coalesce(t.input->'run_input',
                                           CASE WHEN cardinality(t.depends_on) = 0 THEN '{}'::jsonb
                                                ELSE awp._upstream(p_run_id, t.depends_on) END),
                                  NULL, p_run_id, t.task_key, r.depth + 1);
      EXCEPTION WHEN SQLSTATE 'AWNTF' OR SQLSTATE 'AWREQ' OR SQLSTATE 'AWIDM' THEN
        GET STACKED DIAGNOSTICS v_msg = MESSAGE_TEXT, v_det = PG_EXCEPTION_DETAIL;
        v_code := CASE WHEN SQLSTATE = 'AWNTF' THEN 'not_found' ELSE 'invalid_request' END;
        v_err := 'the child run could not start: ' || coalesce(nullif(v_det, ''), v_msg);
      END;
    END IF;
    UPDATE awp.tasks y SET status = 'running', attempts = v_att, child_run_id = v_child, updated_at = v_now,
                           output = NULL, error_code = NULL, error_message = NULL
     WHERE y.run_id = p_run_id AND y.task_key = t.task_key;
    IF r.status = 'pending' THEN   -- its first start, as a first dispatch (awp._dispatch_one)
      UPDATE awp.runs x SET status = 'running', started_at = coalesce(x.started_at, v_now) WHERE x.run_id = p_run_id;
      PERFORM awp._append_event(p_run_id, 'run', p_run_id, 'pending', 'running', 'first child run started');
      r.status := 'running';
    END IF;
    PERFORM awp._append_events(p_run_id, '{task,attempt}', ARRAY[t.task_key, t.task_key || '#' || v_att],
                               ARRAY['ready', NULL],  '{running,running}',
                               ARRAY[coalesce('child run ' || v_child || ' started', 'child run not started'),
                                     coalesce('child run ' || v_child, v_code)]);
    v_n := v_n + 1;
    IF v_code IS NOT NULL THEN
      UPDATE awp.tasks y SET error_code = v_code, error_message = v_err
       WHERE y.run_id = p_run_id AND y.task_key = t.task_key;
      PERFORM awp._end_attempt(p_run_id, t.task_key, v_att, 'failed', false, NULL, v_code, v_err, v_code, true,
                               'completed', NULL);
    ELSE
      v_room := v_room - 1;
    END IF;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._start_database_tasks(text) IS 'Starts a run''s ready tasks run by the database (child runs, signal waits, sleeps) within its concurrency; returns the attempts started.';

-- awp._settle_child_task(run, task, child): settles a running child-run task whose child `child` ended (or no
-- longer exists: pruned), under the parent run's lock: see the top of this section. False when the task is no
-- longer waiting for that child. Locks: the caller holds the run; the task row, then as awp._end_attempt.
CREATE OR REPLACE FUNCTION awp._settle_child_task(p_run_id text, p_task_key text, p_child text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t awp.tasks;
  c record;
BEGIN
  SELECT * INTO t FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.task_key = p_task_key AND y.status = 'running' AND y.child_run_id = p_child
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  SELECT x.status, x.output INTO c FROM awp.runs x WHERE x.run_id = p_child;
  IF FOUND AND c.status IN ('pending', 'running') THEN
    RETURN false;
  END IF;
  IF c.status = 'succeeded' THEN
    UPDATE awp.tasks y SET output = c.output WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
    PERFORM awp._end_attempt(p_run_id, p_task_key, t.attempts, 'succeeded', false, NULL, NULL, NULL,
                             'child run ' || p_child || ' succeeded', true, 'completed', NULL);
  ELSE
    UPDATE awp.tasks y SET error_code = 'child_run_failed',
                           error_message = format('child run %s %s', p_child, coalesce(c.status, 'no longer exists'))
     WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
    PERFORM awp._end_attempt(p_run_id, p_task_key, t.attempts, 'failed', true, NULL, 'child_run_failed',
                             format('child run %s %s', p_child, coalesce(c.status, 'no longer exists')),
                             'child_run_failed', true, 'completed', NULL);
  END IF;
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._settle_child_task(text, text, text) IS 'Settles a child-run task whose child ended (succeeded: its output; else child_run_failed, retried by its policy).';

-- awp._settle_children(isolate): the coordinator's step for child runs: every running child-run task whose child
-- ended is settled (awp._settle_child_task), its run taken without waiting (awp._try_run: a busy one is left to the
-- next pass); then the ready tasks run by the database that waited for room under their run's concurrency are
-- started (awp._start_database_tasks, runs from awp.ready_queue). With isolate, each run in a subtransaction of its own
-- (awp._pass_skip). Returns how many tasks were settled or started. Locks: each run, then as those functions.
CREATE OR REPLACE FUNCTION awp._settle_children(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  x   record;
  v_n integer := 0;
BEGIN
  FOR x IN
    SELECT t.run_id, t.task_key, t.child_run_id
      FROM awp.tasks t LEFT JOIN awp.runs c ON c.run_id = t.child_run_id
     WHERE t.status = 'running' AND t.child_run_id IS NOT NULL AND (c.run_id IS NULL OR c.finished_at IS NOT NULL)
     ORDER BY t.run_id, t.task_key
  LOOP
    CONTINUE WHEN NOT awp._try_run(x.run_id);
    IF NOT p_isolate THEN
      v_n := v_n + awp._settle_child_task(x.run_id, x.task_key, x.child_run_id)::integer;
    ELSE
      BEGIN
        v_n := v_n + awp._settle_child_task(x.run_id, x.task_key, x.child_run_id)::integer;
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        PERFORM awp._pass_skip('child run settle', x.run_id, SQLSTATE, SQLERRM);
      END;
    END IF;
  END LOOP;
  FOR x IN
    SELECT DISTINCT q.run_id FROM awp.ready_queue q WHERE q.executor_kind = ANY (awp._database_kinds()) ORDER BY q.run_id
  LOOP
    CONTINUE WHEN NOT awp._try_run(x.run_id);
    IF NOT p_isolate THEN
      v_n := v_n + awp._start_database_tasks(x.run_id);
    ELSE
      BEGIN
        v_n := v_n + awp._start_database_tasks(x.run_id);
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        PERFORM awp._pass_skip('child run start', x.run_id, SQLSTATE, SQLERRM);
      END;
    END IF;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._settle_children(boolean) IS 'Coordinator step: settles child-run tasks whose child ended, starts those that waited for room; returns the count.';
