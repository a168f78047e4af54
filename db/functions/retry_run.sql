-- Re-running a run that failed or was canceled (AWP issue 41; docs/protocol.md, Re-run): its failed, canceled and
-- skipped tasks (or the tasks named, and every task that depends on them) are reset to wait again with fresh
-- attempts, the tasks that succeeded keep their outputs, and the run goes back to running. Locks: the run (its
-- advisory lock, then its row), then its task rows (docs/architecture.md, Lock order).

-- awp.retry_run(run_id, task_keys): re-runs a failed or canceled run: the tasks to run again are task_keys (NULL:
-- every failed, canceled or skipped task) and everything that depends on them, transitively; each becomes
-- waiting_dependencies, or ready when nothing it depends on is left to do (events `<status> -> ready | waiting_dependencies`,
-- reason "retry requested"), with max_attempts fresh attempts (its max_attempts grows by the counted attempts it made:
-- at most 100 in all, AWREQ past that); its output, error and skip reason are cleared. The run: `<status> -> running`,
-- its cancellation, end, output and stored task counts cleared. The coordinator's next pass dispatches (woken). A run
-- with a for_each task among those to re-run is refused (AWREQ: its instances would have to go; not built). AWNTF for
-- an unknown run, AWREQ for a run that is not failed or canceled, an unknown task key or an empty list. Returns the
-- run's status and the keys re-run, in definition order.
CREATE OR REPLACE FUNCTION awp.retry_run(p_run_id text, p_task_keys text[] DEFAULT NULL)
RETURNS TABLE (run_id text, status text, task_keys text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r      record;
  v_now  timestamptz := awp._now();
  v_bad  text;
  v_keys text[];
  v_from text[];
  v_to   text[];
  v_def  jsonb;
BEGIN
  IF p_task_keys IS NOT NULL AND cardinality(p_task_keys) = 0 THEN
    PERFORM awp._raise_invalid_request('invalid task keys', 'task_keys must name at least one task (or be null: every failed one)');
  END IF;
  PERFORM pg_advisory_xact_lock(hashtextextended(p_run_id, 0));
  SELECT x.status, x.workflow_id, x.workflow_version INTO r FROM awp.runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
  IF r.status NOT IN ('failed', 'canceled') THEN
    PERFORM awp._raise_invalid_request('run not retryable',
      format('run %s is %s: only a failed or canceled run can be re-run', p_run_id, r.status));
  END IF;
  SELECT string_agg(k, ', ' ORDER BY k) INTO v_bad FROM unnest(p_task_keys) k
   WHERE NOT EXISTS (SELECT 1 FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = k);
  IF v_bad IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('unknown task', format('run %s has no task %s', p_run_id, v_bad));
  END IF;

  -- The tasks to run again: the named ones (or every failed, canceled, skipped one) and their descendants.
  WITH RECURSIVE s(task_key) AS (
    SELECT t.task_key FROM awp.tasks t
     WHERE t.run_id = p_run_id
       AND CASE WHEN p_task_keys IS NULL THEN t.status IN ('failed', 'canceled', 'skipped')
                ELSE t.task_key = ANY (p_task_keys) END
    UNION
    SELECT unnest(t.dependants) FROM awp.tasks t JOIN s ON t.run_id = p_run_id AND t.task_key = s.task_key
  )
  SELECT array_agg(t.task_key ORDER BY t.ordinal) INTO v_keys
    FROM awp.tasks t JOIN s USING (task_key) WHERE t.run_id = p_run_id;
  IF EXISTS (SELECT 1 FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = ANY (v_keys)
                AND (t.for_each IS NOT NULL OR t.mapped_task IS NOT NULL)) THEN
    PERFORM awp._raise_invalid_request('run not retryable',
      'a for_each task or one of its instances would run again: re-running them is not supported (start a new run)');
  END IF;
  IF coalesce(cardinality(v_keys), 0) = 0 THEN
    PERFORM awp._raise_invalid_request('nothing to re-run', format('run %s has no failed, canceled or skipped task', p_run_id));
  END IF;
  SELECT wv.definition INTO v_def FROM awp.workflow_versions wv
   WHERE wv.workflow_id = r.workflow_id AND wv.version = r.workflow_version;
  SELECT string_agg(t.task_key, ', ' ORDER BY t.ordinal) INTO v_bad FROM awp.tasks t
   WHERE t.run_id = p_run_id AND t.task_key = ANY (v_keys)
     AND t.attempts - t.uncounted_attempts + awp._defined_max_attempts(v_def, t.task_key) > 100;
  IF v_bad IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('too many attempts', format('tasks %s would pass 100 attempts in all', v_bad));
  END IF;

  -- Each task reset; pending_deps: its dependencies that will not be done (re-run, or not succeeded and not
  -- skipped by a condition). A task with a when or a for_each waits for awp._resolve_run even with none left.
  WITH l AS (
    SELECT t.task_key, t.status AS from_status, t.ordinal,
           (SELECT count(*) FROM unnest(t.depends_on) d
             WHERE d = ANY (v_keys)
                OR NOT EXISTS (SELECT 1 FROM awp.tasks y WHERE y.run_id = p_run_id AND y.task_key = d
                                 AND (y.status = 'succeeded' OR y.skip_reason = 'condition_false')))::integer AS pending
      FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = ANY (v_keys)
       FOR UPDATE
  ), u AS (
    UPDATE awp.tasks t
       SET status = CASE WHEN l.pending = 0 AND t.condition IS NULL THEN 'ready' ELSE 'waiting_dependencies' END,
           pending_deps = l.pending,
           max_attempts = t.attempts - t.uncounted_attempts + awp._defined_max_attempts(v_def, t.task_key),
           finished_at = NULL, ready_at = NULL, updated_at = v_now, wait_until = NULL,
           output = NULL, error_code = NULL, error_message = NULL, skip_reason = NULL
      FROM l WHERE t.run_id = p_run_id AND t.task_key = l.task_key
    RETURNING t.task_key, l.from_status, t.status, l.ordinal
  )
  SELECT array_agg(u.task_key ORDER BY u.ordinal), array_agg(u.from_status ORDER BY u.ordinal),
         array_agg(u.status ORDER BY u.ordinal)
    INTO v_keys, v_from, v_to FROM u;
  PERFORM awp._append_events(p_run_id, array_fill('task'::text, ARRAY[cardinality(v_keys)]), v_keys, v_from, v_to,
                             array_fill('retry requested'::text, ARRAY[cardinality(v_keys)]));
  UPDATE awp.runs x SET status = 'running', finished_at = NULL, cancel_requested_at = NULL, final_task_counts = NULL,
                        output = NULL, output_truncated = false
   WHERE x.run_id = p_run_id;
  PERFORM awp._unfinished_add(p_run_id, cardinality(v_keys));
  PERFORM awp._append_event(p_run_id, 'run', p_run_id, r.status, 'running', 'retry requested');
  PERFORM awp._resolve_run(p_run_id);   -- conditions with nothing left to wait for, child runs and waits to start
  PERFORM awp._log_flush();
  PERFORM awp._wake('awp_coordinator', 'run_retried');
  RETURN QUERY SELECT p_run_id, x.status, v_keys FROM awp.runs x WHERE x.run_id = p_run_id;
END $$;
COMMENT ON FUNCTION awp.retry_run(text, text[]) IS 'Re-runs a failed or canceled run: its failed/canceled/skipped tasks (or those named) and their dependants wait again with fresh attempts; AWREQ/AWNTF.';

-- awp._defined_max_attempts(definition, task_key): a task's retry.max_attempts in its workflow's definition (1 when
-- none). Locks: none.
CREATE OR REPLACE FUNCTION awp._defined_max_attempts(p_definition jsonb, p_task_key text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN coalesce((SELECT (t->'retry'->>'max_attempts')::integer FROM jsonb_array_elements(p_definition->'tasks') t
                    WHERE t->>'key' = p_task_key LIMIT 1), 1);
END $$;
COMMENT ON FUNCTION awp._defined_max_attempts(jsonb, text) IS 'A task''s max_attempts as its workflow defines it.';

-- awp.retry_run_idempotent(idempotency_key, request_hash, run_id, task_keys): awp.retry_run behind an idempotency key
-- (scope 'retries'): a replay returns the first answer. Raises what retry_run raises, AWIDM.
CREATE OR REPLACE FUNCTION awp.retry_run_idempotent(p_idempotency_key text, p_request_hash text, p_run_id text,
                                                    p_task_keys text[] DEFAULT NULL)
RETURNS TABLE (run_id text, status text, task_keys text[], replayed boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_old jsonb := awp._idempotency_begin('retries', p_idempotency_key, p_request_hash);
  a     record;
BEGIN
  IF v_old IS NOT NULL THEN
    RETURN QUERY SELECT v_old->>'run_id', v_old->>'status', ARRAY(SELECT jsonb_array_elements_text(v_old->'task_keys')), true;
    RETURN;
  END IF;
  SELECT * INTO a FROM awp.retry_run(p_run_id, p_task_keys);
  PERFORM awp._idempotency_finish('retries', p_idempotency_key,
    jsonb_build_object('run_id', a.run_id, 'status', a.status, 'task_keys', to_jsonb(a.task_keys)));
  RETURN QUERY SELECT a.run_id, a.status, a.task_keys, false;
END $$;
COMMENT ON FUNCTION awp.retry_run_idempotent(text, text, text, text[]) IS 'retry_run behind an Idempotency-Key: a replay returns the first answer; AWIDM when the key was used for another request.';
