-- Idempotent POST routes of the gateway: one call per request does the key bookkeeping and the work
-- in one transaction. The first request with a key stores its answer; the same key with the same
-- request hash returns that answer again (no second effect); the same key with another request hash
-- raises AWIDM (idempotency_conflict). A request that raises stores nothing, so a retry runs again.
-- Locks: the idempotency_keys row (INSERT … ON CONFLICT; a concurrent request with the same key waits
-- for the first to commit and then reads its answer), then whatever the wrapped function locks.

-- awp._idempotency_begin(scope, key, request_hash): the stored answer for a replay, or NULL when
-- this request owns the key now (its row is inserted and locked until commit). AWIDM on a reused
-- key with a different request, AWREQ for a bad key.
CREATE OR REPLACE FUNCTION awp._idempotency_begin(p_scope text, p_key text, p_request_hash text)
RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k awp.idempotency_keys;
BEGIN
  IF p_key IS NULL OR length(p_key) NOT BETWEEN 1 AND 255 THEN
    PERFORM awp._raise_invalid_request('invalid idempotency key', 'Idempotency-Key must have 1-255 characters');
  END IF;
  INSERT INTO awp.idempotency_keys (scope, idempotency_key, request_hash, created_at)
  VALUES (p_scope, p_key, p_request_hash, awp._now())
  ON CONFLICT DO NOTHING;
  IF FOUND THEN
    RETURN NULL;
  END IF;
  SELECT * INTO k FROM awp.idempotency_keys x WHERE x.scope = p_scope AND x.idempotency_key = p_key;
  IF k.request_hash <> p_request_hash THEN
    PERFORM awp._raise_idempotency_conflict('idempotency key reused with a different request',
                                            format('Idempotency-Key %s was first used with another request', p_key));
  END IF;
  RETURN k.response;
END $$;
COMMENT ON FUNCTION awp._idempotency_begin(text, text, text) IS 'Claims an idempotency key or returns the answer stored for it; AWIDM when reused for another request.';

-- awp._idempotency_finish(scope, key, response): stores the answer of the request owning the key.
CREATE OR REPLACE FUNCTION awp._idempotency_finish(p_scope text, p_key text, p_response jsonb)
RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
  UPDATE awp.idempotency_keys x SET response = p_response
   WHERE x.scope = p_scope AND x.idempotency_key = p_key
$$;
COMMENT ON FUNCTION awp._idempotency_finish(text, text, jsonb) IS 'Stores the answer for an idempotency key.';

-- awp.apply_workflow_idempotent(idempotency_key, request_hash, definition): awp.apply_workflow
-- behind an idempotency key (scope 'workflows'). Returns (workflow_id, version, created, replayed);
-- a replay returns the first answer, including its `created`. Raises what apply_workflow raises,
-- AWIDM, AWREQ (bad key).
CREATE OR REPLACE FUNCTION awp.apply_workflow_idempotent(p_idempotency_key text, p_request_hash text,
                                                         p_definition jsonb)
RETURNS TABLE (workflow_id text, version integer, created boolean, replayed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_old jsonb := awp._idempotency_begin('workflows', p_idempotency_key, p_request_hash);
  a     record;
BEGIN
  IF v_old IS NOT NULL THEN
    RETURN QUERY SELECT v_old->>'workflow_id', (v_old->>'version')::integer, (v_old->>'created')::boolean, true;
    RETURN;
  END IF;
  SELECT * INTO a FROM awp.apply_workflow(p_definition);
  PERFORM awp._idempotency_finish('workflows', p_idempotency_key,
    jsonb_build_object('workflow_id', a.workflow_id, 'version', a.version, 'created', a.created));
  RETURN QUERY SELECT a.workflow_id, a.version, a.created, false;
END $$;
COMMENT ON FUNCTION awp.apply_workflow_idempotent(text, text, jsonb) IS 'apply_workflow behind an Idempotency-Key: a replay returns the first answer; AWIDM when the key was used for another request.';

-- awp.start_run_idempotent(idempotency_key, request_hash, workflow_id, version, input, priority): awp.start_run
-- behind an idempotency key (scope 'runs'); the key, the input and the priority are also passed to start_run. Returns
-- (run_id, status, replayed); a replay returns the first answer. Raises what start_run raises, AWIDM.
CREATE OR REPLACE FUNCTION awp.start_run_idempotent(p_idempotency_key text, p_request_hash text,
                                                    p_workflow_id text, p_version integer,
                                                    p_input jsonb, p_priority integer)
RETURNS TABLE (run_id text, status text, replayed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_old    jsonb := awp._idempotency_begin('runs', p_idempotency_key, p_request_hash);
  v_run_id text;
  v_status text;
BEGIN
  IF v_old IS NOT NULL THEN
    RETURN QUERY SELECT v_old->>'run_id', v_old->>'status', true;
    RETURN;
  END IF;
  v_run_id := awp._start_run(p_workflow_id, p_version, p_idempotency_key, p_input, NULL, NULL, NULL, 0, p_priority);
  SELECT r.status INTO v_status FROM awp.runs r WHERE r.run_id = v_run_id;
  PERFORM awp._idempotency_finish('runs', p_idempotency_key,
    jsonb_build_object('run_id', v_run_id, 'status', v_status));
  RETURN QUERY SELECT v_run_id, v_status, false;
END $$;
COMMENT ON FUNCTION awp.start_run_idempotent(text, text, text, integer, jsonb, integer) IS 'start_run (with a priority) behind an Idempotency-Key: a replay returns the first answer; AWIDM when the key was used for another request.';

-- awp.start_run_idempotent(idempotency_key, request_hash, workflow_id, version, input): the same without a priority.
CREATE OR REPLACE FUNCTION awp.start_run_idempotent(p_idempotency_key text, p_request_hash text,
                                                    p_workflow_id text, p_version integer,
                                                    p_input jsonb DEFAULT NULL)
RETURNS TABLE (run_id text, status text, replayed boolean)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp.start_run_idempotent(p_idempotency_key, p_request_hash, p_workflow_id, p_version, p_input,
                                         NULL::integer)
$$;
COMMENT ON FUNCTION awp.start_run_idempotent(text, text, text, integer, jsonb) IS 'start_run behind an Idempotency-Key: a replay returns the first answer; AWIDM when the key was used for another request.';

-- awp.start_runs_idempotent(workflow_id, version, items): awp.start_runs behind one Idempotency-Key per item (scope
-- 'runs', as awp.start_run_idempotent: a batch item and a single start with the same key and request are one
-- request). items: 1-1,000 objects {"idempotency_key": string, "request_hash": string, "input"?: object,
-- "priority"?: 0-9}. All or
-- nothing; an error names its item ("runs[3]: ..."). Returns one row per item in order: item, run_id, status,
-- replayed. Locks: as awp.start_run_idempotent, item after item.
CREATE OR REPLACE FUNCTION awp.start_runs_idempotent(p_workflow_id text, p_version integer, p_items jsonb)
RETURNS TABLE (item integer, run_id text, status text, replayed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_i     integer := 0;
  v_item  jsonb;
  a       record;
  v_rows  jsonb := '[]';
  v_state text;
  v_msg   text;
  v_det   text;
BEGIN
  PERFORM awp._check_run_items(p_items, '{input,idempotency_key,request_hash,priority}');
  BEGIN
    FOR v_item IN SELECT x FROM jsonb_array_elements(p_items) x LOOP
      SELECT * INTO a FROM awp.start_run_idempotent(v_item->>'idempotency_key', v_item->>'request_hash', p_workflow_id,
                                                    p_version, CASE WHEN jsonb_typeof(v_item->'input') = 'object'
                                                                    THEN v_item->'input' END,
                                                    (v_item->>'priority')::integer);
      v_rows := v_rows || jsonb_build_array(jsonb_build_array(a.run_id, a.status, a.replayed));
      v_i := v_i + 1;
    END LOOP;
  EXCEPTION WHEN OTHERS THEN   -- name the item; the whole call is undone
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT, v_det = PG_EXCEPTION_DETAIL;
    PERFORM awp._reraise_for_item(v_i, v_state, v_msg, v_det);
  END;
  RETURN QUERY SELECT (r.o - 1)::integer, r.x->>0, r.x->>1, (r.x->>2)::boolean
                 FROM jsonb_array_elements(v_rows) WITH ORDINALITY AS r(x, o) ORDER BY r.o;
END $$;
COMMENT ON FUNCTION awp.start_runs_idempotent(text, integer, jsonb) IS 'start_runs behind one Idempotency-Key per item (as start_run_idempotent); all or nothing; one row per item in order.';
