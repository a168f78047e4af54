-- awp.start_run(workflow_id, version, idempotency_key, input): creates a run of a workflow version
-- (the latest when version is null) with one task per definition task: roots `ready`, the
-- others `waiting_dependencies`. `input` is the run's input, a JSON object of at most 64 KiB (NULL
-- means {}); every lease of the run carries it as `run_input` (docs/data-flow.md). The same
-- idempotency key for the same workflow with the same input returns the same run; with another input
-- it raises AWIDM. Defaults are applied here (concurrency 10, max_attempts 1,
-- interval_ms 1000, timeout_ms 300000, input {}, action = key). Raises AWNTF for an unknown workflow
-- or version, AWREQ for a bad key or input.
-- Locks: inserts (the unique index serialises two starts with one key), then as awp._dispatch_new_run (the
-- new run only).
CREATE OR REPLACE FUNCTION awp._start_run(p_workflow_id text, p_version integer, p_idempotency_key text,
                                          p_input jsonb, p_schedule_id text)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_def    jsonb;
  v_ver    integer;
  v_run_id text;
  v_now    timestamptz := awp._now();
  v_input  jsonb := coalesce(p_input, '{}'::jsonb);
BEGIN
  PERFORM awp._check_input(v_input, 'run input');
  IF p_idempotency_key IS NOT NULL AND length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
    PERFORM awp._raise_invalid_request('invalid idempotency key', 'idempotency key must have 1-255 characters');
  END IF;
  IF p_idempotency_key IS NOT NULL THEN
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

  v_run_id := awp._new_id('run');
  INSERT INTO awp.runs (run_id, workflow_id, workflow_version, concurrency, unfinished_tasks, idempotency_key,
                        input, schedule_id, created_at)
  VALUES (v_run_id, p_workflow_id, v_ver, coalesce((v_def->>'concurrency')::integer, 10),
          jsonb_array_length(v_def->'tasks'), p_idempotency_key, v_input, p_schedule_id, v_now)
  ON CONFLICT (workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
  IF NOT FOUND THEN   -- a concurrent start with the same key won
    RETURN awp._existing_run(p_workflow_id, p_idempotency_key, v_input);
  END IF;

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
                         pending_deps, max_attempts, interval_ms, timeout_ms, status, updated_at)
  SELECT v_run_id, d.t->>'key', d.ordinal, d.t->>'executor', coalesce(d.t->>'action', d.t->>'key'),
         coalesce(d.t->'input', '{}'::jsonb),
         coalesce(dp.depends_on, '{}'), coalesce(dn.dependants, '{}'),
         coalesce(cardinality(dp.depends_on), 0),
         coalesce((d.t->'retry'->>'max_attempts')::integer, 1),
         coalesce((d.t->'retry'->>'interval_ms')::integer, 1000),
         coalesce((d.t->>'timeout_ms')::integer, 300000),
         CASE WHEN dp.depends_on IS NULL THEN 'ready' ELSE 'waiting_dependencies' END, v_now
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
  -- Dispatch on start (docs/protocol.md, Refill and claim on complete): the run's own ready tasks, within the
  -- limits, so an idle worker's long-poll wakes without waiting for a coordinator pass.
  IF awp._dispatch_new_run(v_run_id) = 0 THEN
    PERFORM awp._wake('awp_coordinator', 'run_started');
  END IF;
  PERFORM awp._notify_pending();
  RETURN v_run_id;
END $$;
COMMENT ON FUNCTION awp._start_run(text, integer, text, jsonb, text) IS 'awp.start_run, also recording the schedule that started the run.';

CREATE OR REPLACE FUNCTION awp.start_run(p_workflow_id text, p_version integer DEFAULT NULL,
                                         p_idempotency_key text DEFAULT NULL, p_input jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp._start_run(p_workflow_id, p_version, p_idempotency_key, p_input, NULL)
$$;
COMMENT ON FUNCTION awp.start_run(text, integer, text, jsonb) IS 'Starts a run of a workflow version (latest when null) with an input object; the same idempotency key and input return the same run (another input: AWIDM); AWNTF when unknown.';

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
