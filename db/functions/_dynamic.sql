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
--                                                    element and index on its lease), and the mapped task waits
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
                           max_attempts, interval_ms, timeout_ms, status, updated_at, mapped_task, item, item_index)
    SELECT p_run_id, p_task_key || '[' || (e.o - 1) || ']', v_after + e.o::integer, x.executor, x.action, x.input,
           x.depends_on, ARRAY[p_task_key], 0, x.max_attempts, x.interval_ms, x.timeout_ms, 'ready', p_now,
           p_task_key, e.v, (e.o - 1)::integer
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
-- file. Locks: as above; the caller holds the run.
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
          LEFT JOIN awp.attempts a ON a.run_id = p_run_id AND a.task_key = i.task_key AND a.attempt = i.attempts
                                  AND a.status = 'succeeded'
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
  PERFORM awp._settle_run(p_run_id);
END $$;
COMMENT ON FUNCTION awp._resolve_run(text) IS 'Resolves the dynamic tasks of a run whose dependencies are done (conditions, for_each), then settles the run.';
