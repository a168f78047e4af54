-- awp.start_run(workflow_id, version, idempotency_key, input, priority): creates a run of a workflow version
-- (the latest when version is null) with one task per definition task: roots `ready`, the
-- others `waiting_dependencies`. `priority` (0-9, optional) replaces every task's own (docs/limits.md, Priority);
-- each task's `limits` become its buckets, keys read from the input (awp._buckets_of). `input` is the run's input, a JSON object of at most 64 KiB (NULL
-- means {}); every lease of the run carries it as `run_input` (docs/data-flow.md). The same
-- idempotency key for the same workflow with the same input returns the same run; with another input
-- it raises AWIDM. Defaults are applied here (concurrency 10, max_attempts 1,
-- interval_ms 1000, timeout_ms 300000, input {}, action = key). Raises AWNTF for an unknown workflow
-- or version, AWREQ for a bad key or input.
-- Locks: with a key, the transaction advisory lock (hashtext('awp.run_key'), hashtext(workflow/key)), which
-- serialises two starts with one key; inserts; then as awp._dispatch_new_run (the new run only).
-- A child run (docs/dynamic.md) is started by awp._start_database_tasks with its parent run and task and its depth: it is
-- not dispatched here (the coordinator's next pass does it, woken), since its parent's lock is held and the
-- dispatch budget's advisory lock comes before any run's (docs/architecture.md, Lock order).
CREATE OR REPLACE FUNCTION awp._start_run(p_workflow_id text, p_version integer, p_idempotency_key text,
                                          p_input jsonb, p_schedule_id text, p_parent_run_id text DEFAULT NULL,
                                          p_parent_task_key text DEFAULT NULL, p_depth integer DEFAULT 0,
                                          p_priority integer DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_def    jsonb;
  v_ver    integer;
  v_run_id text;
  v_now    timestamptz := awp._now();
  v_input  jsonb := coalesce(p_input, '{}'::jsonb);
  v_seqscan text;   -- the session's enable_seqscan, restored after the reads of the new run's rows
  v_db     boolean;  -- a root task runs by the database
BEGIN
  PERFORM awp._check_input(v_input, 'run input');
  IF p_priority NOT BETWEEN 0 AND 9 THEN
    PERFORM awp._raise_invalid_request('invalid priority', 'priority must be an integer from 0 to 9 (higher first)');
  END IF;
  IF p_idempotency_key IS NOT NULL AND length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
    PERFORM awp._raise_invalid_request('invalid idempotency key', 'idempotency key must have 1-255 characters');
  END IF;
  IF p_idempotency_key IS NOT NULL THEN
    -- One start per key at a time: a second start with the key waits here, then finds the first one's run (runs
    -- are partitioned by run id, so (workflow_id, idempotency_key) cannot be a unique index: migration 0023).
    PERFORM pg_advisory_xact_lock(hashtext('awp.run_key'), hashtext(p_workflow_id || '/' || p_idempotency_key));
    v_run_id := awp._existing_run(p_workflow_id, p_idempotency_key, v_input);
    IF v_run_id IS NOT NULL THEN
      RETURN v_run_id;
    END IF;
  END IF;
  SELECT wv.version, wv.definition INTO v_ver, v_def
    FROM awp.workflow_versions wv
   WHERE wv.workflow_id = p_workflow_id AND (p_version IS NULL OR wv.version = p_version)
   ORDER BY wv.version DESC LIMIT 1;
  IF NOT FOUND THEN
    IF NOT EXISTS (SELECT 1 FROM awp.workflows w WHERE w.workflow_id = p_workflow_id) THEN
      PERFORM awp._raise_not_found('workflow not found', format('no workflow %s', p_workflow_id));
    END IF;
    PERFORM awp._raise_not_found('workflow version not found',
                                 format('workflow %s has no version %s', p_workflow_id, p_version));
  END IF;

  v_run_id := awp._new_time_id('run');   -- sorts by time: its partition (db/functions/_partitions.sql)
  INSERT INTO awp.runs (run_id, workflow_id, workflow_version, concurrency, unfinished_tasks, idempotency_key,
                        input, schedule_id, created_at, parent_run_id, parent_task_key, depth, priority)
  VALUES (v_run_id, p_workflow_id, v_ver, coalesce((v_def->>'concurrency')::integer, 10),
          jsonb_array_length(v_def->'tasks'), p_idempotency_key, v_input, p_schedule_id, v_now, p_parent_run_id,
          p_parent_task_key, p_depth, p_priority);

  -- The new run's tasks, their events and its ready queue rows are read and written by the run's key with
  -- enable_seqscan off (set around them, restored below): with the tables ANALYZEd while nearly empty, their plans
  -- scanned every task (and the queue's trigger every run) for each start, and a transaction that started 10,000
  -- runs read all the ones it had started so far for each: 26 s instead of 6 (AWP issue 46).
  v_seqscan := current_setting('enable_seqscan');
  PERFORM set_config('enable_seqscan', 'off', true);
  WITH defs AS (
    SELECT x.o::integer AS ordinal, x.t
      FROM jsonb_array_elements(v_def->'tasks') WITH ORDINALITY AS x(t, o)
  ), deps AS (
    SELECT d.t->>'key' AS task_key, array_agg(e.dep ORDER BY e.i) AS depends_on
      FROM defs d, jsonb_array_elements_text(coalesce(d.t->'depends_on', '[]')) WITH ORDINALITY AS e(dep, i)
     GROUP BY 1
  ), dependants AS (
    SELECT e.dep AS task_key, array_agg(d.t->>'key' ORDER BY d.ordinal) AS dependants
      FROM defs d, jsonb_array_elements_text(coalesce(d.t->'depends_on', '[]')) AS e(dep)
     GROUP BY 1
  )
  INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants,
                         pending_deps, max_attempts, interval_ms, timeout_ms, status, updated_at,
                         condition, for_each, max_items, backoff, max_interval_ms, jitter, limit_buckets, priority)
  SELECT v_run_id, d.t->>'key', d.ordinal, d.t->>'executor', coalesce(d.t->>'action', d.t->>'key'),
         coalesce(d.t->'input', '{}'::jsonb),
         coalesce(dp.depends_on, '{}'), coalesce(dn.dependants, '{}'),
         coalesce(cardinality(dp.depends_on), 0),
         coalesce((d.t->'retry'->>'max_attempts')::integer, 1),
         coalesce((d.t->'retry'->>'interval_ms')::integer, 1000),
         coalesce((d.t->>'timeout_ms')::integer, 300000),
         CASE WHEN dp.depends_on IS NULL THEN 'ready' ELSE 'waiting_dependencies' END, v_now,
         d.t->'when', d.t->>'for_each',
         CASE WHEN d.t ? 'for_each' THEN coalesce((d.t->>'max_items')::integer, 1000) END,
         coalesce((d.t->'retry'->>'backoff')::numeric, 1), (d.t->'retry'->>'max_interval_ms')::integer,
         coalesce((d.t->'retry'->>'jitter')::numeric, 0),
         awp._buckets_of(d.t->'limits', v_input), coalesce(p_priority, (d.t->>'priority')::integer, 5)
    FROM defs d
    LEFT JOIN deps dp ON dp.task_key = d.t->>'key'
    LEFT JOIN dependants dn ON dn.task_key = d.t->>'key';

  PERFORM awp._append_event(v_run_id, 'run', v_run_id, NULL, 'pending', 'run started');
  PERFORM awp._append_events_alike(v_run_id, 'task', array_agg(t.task_key ORDER BY t.ordinal), NULL,
                                   'ready', 'task created')
     FROM awp.tasks t WHERE t.run_id = v_run_id AND t.status = 'ready';
  PERFORM awp._append_events_alike(v_run_id, 'task', array_agg(t.task_key ORDER BY t.ordinal), NULL,
                                   'waiting_dependencies', 'task created')
     FROM awp.tasks t WHERE t.run_id = v_run_id AND t.status = 'waiting_dependencies';
  -- Its root tasks run by the database start (a child run, a wait; docs/dynamic.md), within the run's concurrency.
  v_db := EXISTS (SELECT 1 FROM awp.ready_queue q WHERE q.run_id = v_run_id AND q.executor_kind = ANY (awp._database_kinds()));
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF v_db THEN
    PERFORM awp._start_database_tasks(v_run_id);
  END IF;
  IF p_parent_run_id IS NOT NULL THEN   -- a child run: dispatched by the coordinator's next pass (see above)
    PERFORM awp._wake('awp_coordinator', 'run_started');
    RETURN v_run_id;
  END IF;
  -- Dispatch on start (docs/protocol.md, Refill and claim on complete): the run's own ready tasks, within the
  -- limits, so an idle worker's long-poll wakes without waiting for a coordinator pass.
  IF awp._dispatch_new_run(v_run_id) = 0 THEN
    PERFORM awp._wake('awp_coordinator', 'run_started');
  END IF;
  PERFORM awp._notify_pending();
  RETURN v_run_id;
END $$;
COMMENT ON FUNCTION awp._start_run(text, integer, text, jsonb, text, text, text, integer, integer) IS 'awp.start_run, also recording the schedule (or the parent run and task) that started the run.';

CREATE OR REPLACE FUNCTION awp.start_run(p_workflow_id text, p_version integer DEFAULT NULL,
                                         p_idempotency_key text DEFAULT NULL, p_input jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._start_run(p_workflow_id, p_version, p_idempotency_key, p_input, NULL)
$$;
COMMENT ON FUNCTION awp.start_run(text, integer, text, jsonb) IS 'Starts a run of a workflow version (latest when null) with an input object; the same idempotency key and input return the same run (another input: AWIDM); AWNTF when unknown.';

-- awp.start_run(workflow_id, version, idempotency_key, input, priority): the same with a priority (0-9, or NULL for
-- the tasks' own), all five arguments given (an overload without defaults, so a call with four stays the one above).
CREATE OR REPLACE FUNCTION awp.start_run(p_workflow_id text, p_version integer, p_idempotency_key text, p_input jsonb,
                                         p_priority integer)
RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._start_run(p_workflow_id, p_version, p_idempotency_key, p_input, NULL, NULL, NULL, 0, p_priority)
$$;
COMMENT ON FUNCTION awp.start_run(text, integer, text, jsonb, integer) IS 'start_run with a priority (0-9) for all its tasks; AWREQ out of range.';

-- awp._check_input(input, what): AWREQ unless input is a JSON object of at most awp._limit_input_bytes() bytes
-- of jsonb text (the rule of a task's input); `what` names it in the message ('run input', 'schedule input').
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._check_input(p_input jsonb, p_what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF jsonb_typeof(p_input) IS DISTINCT FROM 'object' THEN
    PERFORM awp._raise_invalid_request('invalid ' || p_what, 'input must be a JSON object');
  END IF;
  IF octet_length(p_input::text) > awp._limit_input_bytes() THEN
    PERFORM awp._raise_invalid_request(p_what || ' too large',
      format('input is %s bytes, over the %s-byte limit', octet_length(p_input::text), awp._limit_input_bytes()));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_input(jsonb, text) IS 'Validates a run or schedule input (AWREQ unless an object of at most 64 KiB).';

-- awp._existing_run(workflow_id, idempotency_key, input): the run started earlier with this key, NULL
-- when none; AWIDM when that run was started with another input.
CREATE OR REPLACE FUNCTION awp._existing_run(p_workflow_id text, p_idempotency_key text, p_input jsonb)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run_id text;
  v_input  jsonb;
BEGIN
  SELECT r.run_id, r.input INTO v_run_id, v_input FROM awp.runs r
   WHERE r.workflow_id = p_workflow_id AND r.idempotency_key = p_idempotency_key;
  IF FOUND AND v_input IS DISTINCT FROM p_input THEN
    PERFORM awp._raise_idempotency_conflict('idempotency key reused with a different input',
                                            format('run %s was started with key %s and another input', v_run_id, p_idempotency_key));
  END IF;
  RETURN v_run_id;
END $$;
COMMENT ON FUNCTION awp._existing_run(text, text, jsonb) IS 'The run started with an idempotency key (NULL when none); AWIDM when its input differs.';

-- awp._check_run_items(items, keys): AWREQ unless items is a JSON array of 1 to awp._limit_batch_runs() objects
-- whose fields are among `keys` (input: an object, idempotency_key and request_hash: strings); the item's own
-- rules (input size, key length) are awp._start_run's. Locks: none.
CREATE OR REPLACE FUNCTION awp._check_run_items(p_items jsonb, p_keys text[]) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_err text;
BEGIN
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' OR jsonb_array_length(p_items) NOT BETWEEN 1 AND awp._limit_batch_runs() THEN
    PERFORM awp._raise_invalid_request('invalid runs',
      format('runs must be an array of 1-%s objects', awp._limit_batch_runs()));
  END IF;
  SELECT format('runs[%s]: %s', i.o - 1, CASE
           WHEN jsonb_typeof(i.x) <> 'object' THEN 'must be an object'
           WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(i.x) k WHERE k <> ALL (p_keys))
             THEN 'unknown fields: ' || (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(i.x) k WHERE k <> ALL (p_keys))
           WHEN i.x ? 'input' AND jsonb_typeof(i.x->'input') NOT IN ('object', 'null') THEN 'input must be a JSON object'
           WHEN i.x ? 'idempotency_key' AND jsonb_typeof(i.x->'idempotency_key') <> 'string' THEN 'idempotency_key must be a string'
           WHEN i.x ? 'priority' AND NOT awp._int_ok(i.x->'priority', 0, 9) THEN 'priority must be an integer from 0 to 9'
           WHEN 'request_hash' = ANY (p_keys) AND jsonb_typeof(i.x->'request_hash') IS DISTINCT FROM 'string' THEN 'request_hash must be a string'
           WHEN 'request_hash' = ANY (p_keys) AND jsonb_typeof(i.x->'idempotency_key') IS DISTINCT FROM 'string' THEN 'idempotency_key is required'
         END)
    INTO v_err
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS i(x, o)
   WHERE jsonb_typeof(i.x) <> 'object'
      OR EXISTS (SELECT 1 FROM jsonb_object_keys(i.x) k WHERE k <> ALL (p_keys))
      OR (i.x ? 'input' AND jsonb_typeof(i.x->'input') NOT IN ('object', 'null'))
      OR (i.x ? 'idempotency_key' AND jsonb_typeof(i.x->'idempotency_key') <> 'string')
      OR (i.x ? 'priority' AND NOT awp._int_ok(i.x->'priority', 0, 9))
      OR ('request_hash' = ANY (p_keys) AND (jsonb_typeof(i.x->'request_hash') IS DISTINCT FROM 'string'
                                             OR jsonb_typeof(i.x->'idempotency_key') IS DISTINCT FROM 'string'))
   ORDER BY i.o LIMIT 1;
  IF v_err IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid runs', v_err);
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_run_items(jsonb, text[]) IS 'Validates the items of a batch of run starts (AWREQ naming the first bad item).';

-- awp._reraise_for_item(item, sqlstate, message, detail): raises an error of a batch's item again, its detail naming the
-- item ("runs[3]: ..."), with its SQLSTATE (awp.start_runs, awp.start_runs_idempotent). Locks: none.
CREATE OR REPLACE FUNCTION awp._reraise_for_item(p_item integer, p_sqlstate text, p_message text, p_detail text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message
    USING ERRCODE = p_sqlstate, DETAIL = format('runs[%s]: %s', p_item, coalesce(nullif(p_detail, ''), p_message));
END $$;
COMMENT ON FUNCTION awp._reraise_for_item(integer, text, text, text) IS 'Raises a batch item''s error again, naming the item.';

-- awp.start_runs(workflow_id, version, items): starts several runs of one workflow version (the latest when version
-- is null) in one call, all or nothing. items: a JSON array of 1-1,000 objects {"input"?: object,
-- "idempotency_key"?: string, "priority"?: 0-9}, each started as awp.start_run(workflow_id, version, idempotency_key,
-- input, priority) starts
-- one (the same limits and defaults; a key used before with the same input returns that run, with another input
-- AWIDM). Returns one row per item in order: item (0-based), run_id, status. An error names its item in its
-- DETAIL ("runs[3]: ...") and starts nothing. Locks: as awp.start_run, item after item.
CREATE OR REPLACE FUNCTION awp.start_runs(p_workflow_id text, p_version integer, p_items jsonb)
RETURNS TABLE (item integer, run_id text, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_i     integer := 0;
  v_ids   text[] := '{}';
  v_item  jsonb;
  v_state text;
  v_msg   text;
  v_det   text;
BEGIN
  PERFORM awp._check_run_items(p_items, '{input,idempotency_key,priority}');
  BEGIN
    FOR v_item IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
      v_ids := v_ids || awp._start_run(p_workflow_id, p_version, v_item->>'idempotency_key',
                                       CASE WHEN jsonb_typeof(v_item->'input') = 'object' THEN v_item->'input' END, NULL,
                                       NULL, NULL, 0, (v_item->>'priority')::integer);
      v_i := v_i + 1;
    END LOOP;
  EXCEPTION WHEN OTHERS THEN   -- name the item; the whole call is undone
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_det = PG_EXCEPTION_DETAIL;
    PERFORM awp._reraise_for_item(v_i, v_state, v_msg, v_det);
  END;
  RETURN QUERY SELECT (u.o - 1)::integer, u.id, r.status
                 FROM unnest(v_ids) WITH ORDINALITY AS u(id, o) JOIN awp.runs r ON r.run_id = u.id ORDER BY u.o;
END $$;
COMMENT ON FUNCTION awp.start_runs(text, integer, jsonb) IS 'Starts 1-1000 runs of a workflow version in one call, all or nothing (items: input, idempotency_key as start_run); one row per item in order.';
