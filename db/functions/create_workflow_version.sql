-- Workflow definitions: validation (awp._validate_definition), awp.apply_workflow and
-- awp.create_workflow_version. A definition is validated completely before anything is written;
-- every violation raises AWREQ with a DETAIL naming what is wrong (limits, duplicate keys,
-- unknown dependency, cycle with its path, unknown executor, oversize input).
-- Locks: the workflows row FOR UPDATE (serialises versions of one workflow).

-- awp._int_ok(value, lo, hi): is a JSON value an integer within [lo, hi]?
-- PL/pgSQL: its expression's plan is cached (validation calls it for every task of a 10,000-task definition).
CREATE OR REPLACE FUNCTION awp._int_ok(p jsonb, p_lo bigint, p_hi bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN CASE WHEN jsonb_typeof(p) = 'number'
              THEN p::numeric = trunc(p::numeric) AND p::numeric BETWEEN p_lo AND p_hi
              ELSE false END;
END $$;
COMMENT ON FUNCTION awp._int_ok(jsonb, bigint, bigint) IS 'True when a JSON value is an integer in a range.';

-- awp._did_you_mean(word, known): " (did you mean X?)" for the known word nearest to a misspelt one (an edit distance
-- of at most a third of its length, at least 1; the first of equals), else ''. Only on the way to an error. Locks:
-- none.
CREATE OR REPLACE FUNCTION awp._did_you_mean(p_word text, p_known text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_best text;
  v_best_d integer;
  v_k    text;
  v_d    integer;
  v_prev integer[];
  v_cur  integer[];
  i integer;
  j integer;
BEGIN
  FOREACH v_k IN ARRAY p_known LOOP   -- Levenshtein distance, two rows at a time
    v_prev := ARRAY(SELECT generate_series(0, length(v_k)));
    FOR i IN 1 .. length(p_word) LOOP
      v_cur := ARRAY[i];
      FOR j IN 1 .. length(v_k) LOOP
        v_cur := v_cur || least(v_prev[j + 1] + 1, v_cur[j] + 1,
                                v_prev[j] + CASE WHEN substr(p_word, i, 1) = substr(v_k, j, 1) THEN 0 ELSE 1 END);
      END LOOP;
      v_prev := v_cur;
    END LOOP;
    v_d := v_prev[length(v_k) + 1];
    IF v_best_d IS NULL OR v_d < v_best_d THEN
      v_best := v_k;
      v_best_d := v_d;
    END IF;
  END LOOP;
  RETURN CASE WHEN v_best_d <= greatest(1, length(p_word) / 3) THEN format(' (did you mean %s?)', v_best) ELSE '' END;
END $$;
COMMENT ON FUNCTION awp._did_you_mean(text, text[]) IS 'A hint naming the known word nearest to a misspelt one, or empty.';

-- awp._condition_error(when): what is wrong with a task's `when` (docs/dynamic.md), or NULL when it is valid:
-- an object {"task": "<dependency key>", "path": [keys or indexes] (optional), and exactly one of "equals" and
-- "not_equals" (any JSON)}. Whether task names a dependency is checked by the caller. Locks: none.
CREATE OR REPLACE FUNCTION awp._condition_error(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN CASE
    WHEN jsonb_typeof(p) IS DISTINCT FROM 'object'
      THEN 'when must be an object {"task", "path", "equals" or "not_equals"}'
    WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(p) k WHERE k NOT IN ('task', 'path', 'equals', 'not_equals'))
      THEN 'when has unknown fields (allowed: task, path, equals, not_equals)'
    WHEN jsonb_typeof(p->'task') IS DISTINCT FROM 'string'
      THEN 'when.task must be the key of one of the task''s dependencies'
    WHEN p ? 'path' AND (jsonb_typeof(p->'path') IS DISTINCT FROM 'array' OR jsonb_array_length(p->'path') > 32
                         OR EXISTS (SELECT 1 FROM jsonb_array_elements(p->'path') e
                                     WHERE jsonb_typeof(e) <> 'string' AND NOT awp._int_ok(e, 0, 100000)))
      THEN 'when.path must be an array of at most 32 object keys (strings) or array indexes (integers from 0 to 100000)'
    WHEN (p ? 'equals') = (p ? 'not_equals')
      THEN 'when needs exactly one of equals and not_equals'
  END;
END $$;
COMMENT ON FUNCTION awp._condition_error(jsonb) IS 'What is wrong with a task''s when condition, or NULL.';

-- awp._validate_definition(definition): AWREQ (with a DETAIL naming the problem) unless the definition is
-- valid. It only checks: defaults are applied by awp.start_run, and the stored definition is the one given,
-- so its hash is that of the given JSON. Locks: none.
CREATE OR REPLACE FUNCTION awp._validate_definition(p jsonb) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_err    text;
  v_n      integer;
  v_keys   text[];
  v_index  jsonb;
  -- graph (1-based node numbers in definition order)
  v_indeg  integer[];
  v_out    integer[];   -- dependants, grouped by dependency
  v_ostart integer[];
  v_dep    integer[];   -- dependencies, grouped by dependant
  v_dstart integer[];
  v_queue  integer[];
  v_head   integer := 1;
  v_tail   integer := 0;
  v_u      integer;
  v_j      integer;
  v_seen   integer[];
  v_path   integer[];
  v_step   integer;
  v_kinds  text[] := awp._executor_kinds() || awp._database_kinds();
  v_edges  bigint;
BEGIN
  IF p IS NULL OR jsonb_typeof(p) <> 'object' THEN
    PERFORM awp._raise_invalid_request('definition must be a JSON object');
  END IF;
  SELECT string_agg(k || awp._did_you_mean(k, '{id,concurrency,tasks}'), ', ' ORDER BY k) INTO v_err
    FROM jsonb_object_keys(p) k WHERE k NOT IN ('id', 'concurrency', 'tasks');
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('unknown fields', 'unknown fields: ' || v_err);
  END IF;
  IF jsonb_typeof(p->'id') IS DISTINCT FROM 'string' OR (p->>'id') !~ '^[A-Za-z0-9._-]{1,128}$' THEN
    PERFORM awp._raise_invalid_request('invalid workflow id',
      'id must be a string of 1-128 characters from [A-Za-z0-9._-]');
  END IF;
  IF p ? 'concurrency' AND NOT awp._int_ok(p->'concurrency', 1, 10000) THEN
    PERFORM awp._raise_invalid_request('invalid concurrency', 'concurrency must be an integer from 1 to 10000');
  END IF;
  IF jsonb_typeof(p->'tasks') IS DISTINCT FROM 'array' THEN
    PERFORM awp._raise_invalid_request('invalid tasks', 'tasks must be an array of 1-10000 task objects');
  END IF;
  v_n := jsonb_array_length(p->'tasks');
  IF v_n < 1 OR v_n > 10000 THEN
    PERFORM awp._raise_invalid_request('invalid tasks',
      format('tasks must hold 1-10000 tasks, got %s', v_n));
  END IF;
  -- Counted before anything walks the graph, so a dense one is refused at once.
  SELECT coalesce(sum(jsonb_array_length(t->'depends_on')), 0) INTO v_edges
    FROM jsonb_array_elements(p->'tasks') t WHERE jsonb_typeof(t->'depends_on') = 'array';
  IF v_edges > awp._limit_definition_edges() THEN
    PERFORM awp._raise_invalid_request('too many dependencies',
      format('the tasks'' depends_on hold %s entries in all, over the limit of %s', v_edges,
             awp._limit_definition_edges()));
  END IF;

  -- Per-task shape: the first offending task, in definition order.
  SELECT format('tasks[%s]%s: %s', e.o - 1,
                CASE WHEN jsonb_typeof(e.t->'key') = 'string' THEN format(' (key %s)', e.t->>'key') ELSE '' END,
                e.err)
    INTO v_err
    FROM (SELECT o, t,
            CASE
              WHEN jsonb_typeof(t) <> 'object' THEN 'must be an object'
              WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(t) k
                            WHERE k NOT IN ('key', 'executor', 'action', 'input', 'depends_on', 'retry', 'timeout_ms',
                                            'for_each', 'max_items', 'when', 'limits', 'priority'))
                THEN 'unknown fields: ' || (SELECT string_agg(k || awp._did_you_mean(k, '{key,executor,action,input,depends_on,retry,timeout_ms,for_each,max_items,when,limits,priority}'), ', ' ORDER BY k)
                                            FROM jsonb_object_keys(t) k
                            WHERE k NOT IN ('key', 'executor', 'action', 'input', 'depends_on', 'retry', 'timeout_ms',
                                            'for_each', 'max_items', 'when', 'limits', 'priority'))
              WHEN jsonb_typeof(t->'key') IS DISTINCT FROM 'string'
                   OR length(t->>'key') NOT BETWEEN 1 AND 128 OR (t->>'key') ~ '[[:cntrl:]/]'
                THEN 'key must be a string of 1-128 characters without "/" or control characters'
              WHEN (t->>'key') ~ '\[[0-9]+\]$'
                THEN 'key must not end in [<number>]: such keys name the instances of a for_each task'
              WHEN jsonb_typeof(t->'executor') IS DISTINCT FROM 'string'
                THEN 'executor must be a string'
              WHEN NOT (t->>'executor') = ANY (v_kinds)
                THEN format('unknown executor %s (known: %s)', t->>'executor', array_to_string(v_kinds, ', '))
              WHEN t ? 'action' AND (jsonb_typeof(t->'action') IS DISTINCT FROM 'string'
                                     OR length(t->>'action') NOT BETWEEN 1 AND 256)
                THEN 'action must be a string of 1-256 characters'
              WHEN t ? 'input' AND octet_length((t->'input')::text) > awp._limit_input_bytes()
                THEN format('input is %s bytes, over the %s-byte limit', octet_length((t->'input')::text),
                            awp._limit_input_bytes())
              WHEN t ? 'depends_on' AND jsonb_typeof(t->'depends_on') IS DISTINCT FROM 'array'
                THEN 'depends_on must be an array of task keys'
              WHEN t ? 'depends_on' AND EXISTS (SELECT 1 FROM jsonb_array_elements(t->'depends_on') d
                                                 WHERE jsonb_typeof(d) <> 'string')
                THEN 'depends_on must be an array of task keys'
              WHEN t ? 'retry' AND jsonb_typeof(t->'retry') IS DISTINCT FROM 'object'
                THEN 'retry must be an object'
              WHEN t ? 'retry' AND EXISTS (SELECT 1 FROM jsonb_object_keys(t->'retry') k
                                            WHERE k NOT IN ('max_attempts', 'interval_ms', 'backoff', 'max_interval_ms',
                                                            'jitter'))
                THEN 'retry has unknown fields (allowed: max_attempts, interval_ms, backoff, max_interval_ms, jitter)'
              WHEN t->'retry' ? 'backoff' AND (jsonb_typeof(t->'retry'->'backoff') IS DISTINCT FROM 'number'
                                              OR (t->'retry'->>'backoff')::numeric NOT BETWEEN 1 AND 10)
                THEN 'retry.backoff must be a number from 1 to 10 (1: the same interval every time)'
              WHEN t->'retry' ? 'max_interval_ms' AND NOT awp._int_ok(t->'retry'->'max_interval_ms', 0, 86400000)
                THEN 'retry.max_interval_ms must be an integer from 0 to 86400000'
              WHEN t->'retry' ? 'jitter' AND (jsonb_typeof(t->'retry'->'jitter') IS DISTINCT FROM 'number'
                                             OR (t->'retry'->>'jitter')::numeric NOT BETWEEN 0 AND 1)
                THEN 'retry.jitter must be a number from 0 to 1 (the part of each wait that may be taken off at random)'
              WHEN t->'retry' ? 'max_attempts' AND NOT awp._int_ok(t->'retry'->'max_attempts', 1, 100)
                THEN 'retry.max_attempts must be an integer from 1 to 100'
              WHEN t->'retry' ? 'interval_ms' AND NOT awp._int_ok(t->'retry'->'interval_ms', 0, 86400000)
                THEN 'retry.interval_ms must be an integer from 0 to 86400000'
              WHEN t ? 'timeout_ms' AND NOT awp._int_ok(t->'timeout_ms', 1, 86400000)
                THEN 'timeout_ms must be an integer from 1 to 86400000'
              WHEN t ? 'for_each' AND jsonb_typeof(t->'for_each') IS DISTINCT FROM 'string'
                THEN 'for_each must be the key of one of the task''s dependencies'
              WHEN t ? 'max_items' AND NOT t ? 'for_each'
                THEN 'max_items needs for_each'
              WHEN t ? 'max_items' AND NOT awp._int_ok(t->'max_items', 1, 10000)
                THEN 'max_items must be an integer from 1 to 10000'
              WHEN t ? 'when' AND awp._condition_error(t->'when') IS NOT NULL THEN awp._condition_error(t->'when')
              WHEN t ? 'priority' AND NOT awp._int_ok(t->'priority', 0, 9)
                THEN 'priority must be an integer from 0 to 9 (higher first; default 5)'
              WHEN t ? 'limits' AND awp._limits_error(t->'limits', t->>'executor') IS NOT NULL
                THEN awp._limits_error(t->'limits', t->>'executor')
              WHEN t ? 'limits' AND awp._limits_duplicate(t->'limits') IS NOT NULL
                THEN format('limits names %s twice', awp._limits_duplicate(t->'limits'))
              WHEN t->>'executor' = 'workflow' THEN awp._workflow_input_error(t->'input')
              WHEN t->>'executor' IN ('signal', 'sleep') THEN awp._wait_input_error(t->>'executor', t->'input')
            END AS err
          FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o)) e
   WHERE e.err IS NOT NULL
   ORDER BY e.o
   LIMIT 1;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid task', v_err);
  END IF;

  SELECT format('tasks[%s] (key %s): depends_on names %s twice', x.o - 1, x.t->>'key', d) INTO v_err
    FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o),
         jsonb_array_elements_text(coalesce(x.t->'depends_on', '[]')) d
   GROUP BY x.o, x.t->>'key', d HAVING count(*) > 1
   ORDER BY x.o LIMIT 1;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid task', v_err);
  END IF;

  SELECT array_agg(t->>'key' ORDER BY o) INTO v_keys
    FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o);
  SELECT string_agg(k, ', ' ORDER BY k) INTO v_err
    FROM (SELECT k FROM unnest(v_keys) k GROUP BY k HAVING count(*) > 1) d;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('duplicate task keys', 'duplicate task keys: ' || v_err);
  END IF;
  SELECT jsonb_object_agg(k, o) INTO v_index FROM unnest(v_keys) WITH ORDINALITY AS u(k, o);

  SELECT format('task %s depends on unknown task %s', t->>'key', d) INTO v_err
    FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o),
         jsonb_array_elements_text(coalesce(t->'depends_on', '[]')) d
   WHERE NOT v_index ? d
   ORDER BY o
   LIMIT 1;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('unknown dependency', v_err);
  END IF;

  -- for_each and when name a dependency of their task (docs/dynamic.md).
  SELECT format('tasks[%s] (key %s): %s names %s, which is not one of its dependencies (depends_on)', o - 1, t->>'key',
                CASE WHEN t ? 'for_each' AND NOT coalesce(t->'depends_on', '[]') ? (t->>'for_each')
                     THEN 'for_each' ELSE 'when.task' END,
                CASE WHEN t ? 'for_each' AND NOT coalesce(t->'depends_on', '[]') ? (t->>'for_each')
                     THEN t->>'for_each' ELSE t->'when'->>'task' END)
    INTO v_err
    FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o)
   WHERE (t ? 'for_each' AND NOT coalesce(t->'depends_on', '[]') ? (t->>'for_each'))
      OR (t ? 'when' AND NOT coalesce(t->'depends_on', '[]') ? (t->'when'->>'task'))
   ORDER BY o
   LIMIT 1;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid task', v_err);
  END IF;

  -- Cycle check: Kahn's algorithm over compact arrays, O(tasks + edges).
  -- v_out: dependants grouped by dependency; v_dep: dependencies grouped by dependant;
  -- v_ostart/v_dstart: where each node's group starts (length n + 1).
  WITH edges AS MATERIALIZED (
    SELECT (v_index->>d)::integer AS src, x.o::integer AS dst
      FROM jsonb_array_elements(p->'tasks') WITH ORDINALITY AS x(t, o),
           jsonb_array_elements_text(coalesce(t->'depends_on', '[]')) d
  ), outdeg AS (SELECT src, count(*) AS n FROM edges GROUP BY src),
     indeg AS (SELECT dst, count(*) AS n FROM edges GROUP BY dst)
  SELECT (SELECT coalesce(array_agg(dst ORDER BY src, dst), '{}') FROM edges),
         (SELECT coalesce(array_agg(src ORDER BY dst, src), '{}') FROM edges),
         (SELECT array_agg(coalesce(o.n, 0)::integer ORDER BY g)
            FROM generate_series(1, v_n + 1) g LEFT JOIN outdeg o ON o.src = g),
         (SELECT array_agg(coalesce(i.n, 0)::integer ORDER BY g)
            FROM generate_series(1, v_n) g LEFT JOIN indeg i ON i.dst = g)
    INTO v_out, v_dep, v_ostart, v_indeg;
  v_dstart := v_indeg || 0;
  v_j := 1;
  FOR v_u IN 1 .. v_n + 1 LOOP
    v_step := v_ostart[v_u]; v_ostart[v_u] := v_j; v_j := v_j + v_step;
  END LOOP;
  v_j := 1;
  FOR v_u IN 1 .. v_n + 1 LOOP
    v_step := v_dstart[v_u]; v_dstart[v_u] := v_j; v_j := v_j + v_step;
  END LOOP;

  v_queue := array_fill(0, ARRAY[v_n]);
  FOR v_u IN 1 .. v_n LOOP
    IF v_indeg[v_u] = 0 THEN
      v_tail := v_tail + 1; v_queue[v_tail] := v_u;
    END IF;
  END LOOP;
  WHILE v_head <= v_tail LOOP
    v_u := v_queue[v_head]; v_head := v_head + 1;
    FOR v_j IN v_ostart[v_u] .. v_ostart[v_u + 1] - 1 LOOP
      v_step := v_out[v_j];
      v_indeg[v_step] := v_indeg[v_step] - 1;
      IF v_indeg[v_step] = 0 THEN
        v_tail := v_tail + 1; v_queue[v_tail] := v_step;
      END IF;
    END LOOP;
  END LOOP;

  IF v_tail < v_n THEN
    -- Some task is on a cycle: walk dependencies among unfinished tasks until one repeats.
    v_seen := array_fill(0, ARRAY[v_n]);
    v_path := array_fill(0, ARRAY[v_n]);
    SELECT min(g) INTO v_u FROM generate_series(1, v_n) g WHERE v_indeg[g] > 0;
    v_step := 0;
    WHILE v_seen[v_u] = 0 LOOP
      v_step := v_step + 1;
      v_seen[v_u] := v_step;
      v_path[v_step] := v_u;
      FOR v_j IN v_dstart[v_u] .. v_dstart[v_u + 1] - 1 LOOP
        IF v_indeg[v_dep[v_j]] > 0 THEN
          v_u := v_dep[v_j];
          EXIT;
        END IF;
      END LOOP;
    END LOOP;
    SELECT string_agg(v_keys[n], ' -> ' ORDER BY i) INTO v_err
      FROM unnest(v_path[v_seen[v_u]:v_step] || v_u) WITH ORDINALITY AS c(n, i);
    PERFORM awp._raise_invalid_request('dependency cycle', 'dependency cycle: ' || v_err);
  END IF;
END $$;
COMMENT ON FUNCTION awp._validate_definition(jsonb) IS 'Checks a workflow definition: AWREQ with details unless it is valid.';

-- awp.apply_workflow(definition): like create_workflow_version, plus whether a version was created.
CREATE OR REPLACE FUNCTION awp.apply_workflow(p_definition jsonb)
RETURNS TABLE (workflow_id text, version integer, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_def    jsonb := p_definition;   -- stored as given
  v_id     text := v_def->>'id';
  v_hash   text := encode(sha256(convert_to(v_def::text, 'UTF8')), 'hex');
  v_latest record;
  v_now    timestamptz := awp._now();
BEGIN
  PERFORM awp._validate_definition(v_def);   -- before anything is written
  INSERT INTO awp.workflows AS w (workflow_id, created_at) VALUES (v_id, v_now) ON CONFLICT DO NOTHING;
  PERFORM 1 FROM awp.workflows w WHERE w.workflow_id = v_id FOR UPDATE;
  SELECT wv.version, wv.definition_hash INTO v_latest
    FROM awp.workflow_versions wv WHERE wv.workflow_id = v_id ORDER BY wv.version DESC LIMIT 1;
  IF FOUND AND v_latest.definition_hash = v_hash THEN
    RETURN QUERY SELECT v_id, v_latest.version, false;
    RETURN;
  END IF;
  INSERT INTO awp.workflow_versions AS wv (workflow_id, version, definition, definition_hash, task_count, created_at)
  VALUES (v_id, coalesce(v_latest.version, 0) + 1, v_def, v_hash, jsonb_array_length(v_def->'tasks'), v_now);
  RETURN QUERY SELECT v_id, coalesce(v_latest.version, 0) + 1, true;
END $$;
COMMENT ON FUNCTION awp.apply_workflow(jsonb) IS 'Validates a definition and stores it as a new version unless identical to the latest; returns (workflow_id, version, created).';

-- awp.create_workflow_version(definition): the SQL API in docs/sql-api.md.
CREATE OR REPLACE FUNCTION awp.create_workflow_version(p_definition jsonb)
RETURNS TABLE (workflow_id text, version integer)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT a.workflow_id, a.version FROM awp.apply_workflow(p_definition) a
$$;
COMMENT ON FUNCTION awp.create_workflow_version(jsonb) IS 'Validates a workflow definition (AWREQ) and returns its new version, or the latest version when the definition is identical.';
