-- Read functions for DBAs and the gateway's GET routes. None changes state; none returns a
-- token or a token hash. Unknown ids raise AWNTF (rather than returning a row of NULLs).

-- Paging: every list function takes keyset arguments with defaults (NULL: from the start, and every row
-- when the limit is NULL too, so calls without them keep working): the sort key of the last row of the
-- previous page, and a limit (1-1000, AWREQ otherwise). Keys are whole sort keys, not row ids looked
-- up, so a page follows its cursor even when that row was pruned meanwhile, and rows added while a
-- client pages do not shift the pages it has not read yet.

-- awp._check_page(limit): AWREQ unless the limit is NULL or from 1 to 1000. Locks: none.
CREATE OR REPLACE FUNCTION awp._check_page(p_limit integer) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_limit IS NOT NULL AND p_limit NOT BETWEEN 1 AND awp._limit_page_rows() THEN
    PERFORM awp._raise_invalid_request('invalid limit', format('limit must be from 1 to %s', awp._limit_page_rows()));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_page(integer) IS 'AWREQ unless a page limit is null or 1-1000.';

-- awp._worker_rows(worker_id, after_registered_at, after_worker_id, limit): worker summary rows (all
-- workers when worker_id is null), by (registered_at, worker_id), after that key when given.
CREATE OR REPLACE FUNCTION awp._worker_rows(p_worker_id text, p_after_registered_at timestamptz DEFAULT NULL,
                                            p_after_worker_id text DEFAULT NULL, p_limit integer DEFAULT NULL)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[],
               max_concurrency integer, active_leases integer, last_heartbeat_at timestamptz,
               registered_at timestamptz, stopped_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT w.worker_id, w.display_name, w.status, w.executor_kinds, w.max_concurrency,
         (SELECT count(*)::integer FROM awp.dispatches d WHERE d.worker_id = w.worker_id AND d.status = 'leased'),
         w.last_heartbeat_at, w.registered_at, w.stopped_at
    FROM awp.workers w
   WHERE (p_worker_id IS NULL OR w.worker_id = p_worker_id)
     AND (p_after_worker_id IS NULL
          OR (w.registered_at, w.worker_id) > (p_after_registered_at, p_after_worker_id))
   ORDER BY w.registered_at, w.worker_id
   LIMIT p_limit
$$;
COMMENT ON FUNCTION awp._worker_rows(text, timestamptz, text, integer) IS 'Worker summary rows, never a token, keyset-paged.';

-- awp.list_workers(after_registered_at, after_worker_id, limit): worker sessions, oldest first, with
-- their active lease counts (no tokens). Page on with the registered_at and worker_id of the last row
-- (both or neither: AWREQ). Locks: none.
CREATE OR REPLACE FUNCTION awp.list_workers(p_after_registered_at timestamptz DEFAULT NULL,
                                            p_after_worker_id text DEFAULT NULL,
                                            p_limit integer DEFAULT NULL)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[],
               max_concurrency integer, active_leases integer, last_heartbeat_at timestamptz,
               registered_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_page(p_limit);
  IF (p_after_registered_at IS NULL) <> (p_after_worker_id IS NULL) THEN
    PERFORM awp._raise_invalid_request('invalid cursor', 'give both after_registered_at and after_worker_id, or neither');
  END IF;
  RETURN QUERY SELECT * FROM awp._worker_rows(NULL, p_after_registered_at, p_after_worker_id, p_limit);
END $$;
COMMENT ON FUNCTION awp.list_workers(timestamptz, text, integer) IS 'Worker sessions, oldest first, with their active lease counts (no tokens); keyset-paged.';

CREATE OR REPLACE FUNCTION awp.get_worker(p_worker_id text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[],
               max_concurrency integer, active_leases integer, last_heartbeat_at timestamptz,
               registered_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY SELECT * FROM awp._worker_rows(p_worker_id);
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('worker not found', format('no worker %s', p_worker_id));
  END IF;
END $$;
COMMENT ON FUNCTION awp.get_worker(text) IS 'One worker session (no tokens); AWNTF when unknown.';

-- awp._run_rows(run_id, workflow_id, status, after_run_id, limit, after_created_at): run rows, newest
-- first, after the key (after_created_at, after_run_id); without after_created_at that run's created_at
-- is looked up (no row when it does not exist).
CREATE OR REPLACE FUNCTION awp._run_rows(p_run_id text, p_workflow_id text, p_status text,
                                         p_after text, p_limit integer, p_after_created_at timestamptz DEFAULT NULL)
RETURNS TABLE (run_id text, workflow_id text, workflow_version integer, status text, revision bigint,
               cancel_requested_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, concurrency integer, idempotency_key text, task_counts jsonb,
               schedule_id text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT r.run_id, r.workflow_id, r.workflow_version, r.status, r.revision, r.cancel_requested_at,
         r.created_at, r.started_at, r.finished_at, r.concurrency, r.idempotency_key,
         coalesce(r.final_task_counts, awp._task_counts(r.run_id)),   -- counted only while the run is live
         r.schedule_id
    FROM awp.runs r
   WHERE (p_run_id IS NULL OR r.run_id = p_run_id)
     AND (p_workflow_id IS NULL OR r.workflow_id = p_workflow_id)
     AND (p_status IS NULL OR r.status = p_status)
     AND (p_after IS NULL OR (r.created_at, r.run_id) <
          (coalesce(p_after_created_at, (SELECT a.created_at FROM awp.runs a WHERE a.run_id = p_after)), p_after))
   ORDER BY r.created_at DESC, r.run_id DESC
   LIMIT p_limit
$$;
COMMENT ON FUNCTION awp._run_rows(text, text, text, text, integer, timestamptz) IS 'Run rows, newest first, with keyset paging.';

-- awp.get_run(run_id): one run: the columns of awp.list_runs, plus its `input`, its `output` (set when
-- it succeeded, else NULL; `output_truncated` when it was cut at 1 MiB) and `waiting_for_executors`:
-- the executor kinds of its ready or queued tasks that no active worker offers (such a task waits
-- until a worker with that kind registers; empty when none), and `waiting`: its waiting tasks counted
-- by reason code (awp.run_waits, docs/limits.md; {} when none waits); a child run (docs/dynamic.md) names its
-- parent_run_id and parent_task_key, and its depth (0 for a run started by a caller or a schedule). AWNTF when
-- unknown. Locks: none.
CREATE OR REPLACE FUNCTION awp.get_run(p_run_id text)
RETURNS TABLE (run_id text, workflow_id text, workflow_version integer, status text, revision bigint,
               cancel_requested_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, concurrency integer, idempotency_key text, task_counts jsonb,
               schedule_id text, input jsonb, output jsonb, output_truncated boolean,
               waiting_for_executors text[], waiting jsonb, parent_run_id text, parent_task_key text, depth integer)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  SELECT x.*, r.input, r.output, r.output_truncated,
         CASE WHEN r.status IN ('pending', 'running') THEN awp._waiting_for_executors(r.run_id) ELSE '{}' END,
         CASE WHEN r.status IN ('pending', 'running') THEN awp._run_wait_counts(r.run_id) ELSE '{}' END,
         r.parent_run_id, r.parent_task_key, r.depth
    FROM awp._run_rows(p_run_id, NULL, NULL, NULL, 1) x JOIN awp.runs r ON r.run_id = x.run_id;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
END $$;
COMMENT ON FUNCTION awp.get_run(text) IS 'One run with its revision, task counts, input, output, the executor kinds it waits for and its waiting tasks by reason; AWNTF when unknown.';

-- awp.run_revision(run_id): the run's revision and status alone, one primary-key read. For a reader that
-- polls for changes (the dashboard's run page, python/awp/server/ui/pages.py): awp.get_run also counts the run's tasks
-- and what holds its waiting ones, passes over every task (30-150 ms at 10,000 tasks on this project's machine),
-- which an unchanged revision makes needless. AWNTF when unknown. Locks: none.
CREATE OR REPLACE FUNCTION awp.run_revision(p_run_id text)
RETURNS TABLE (revision bigint, status text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY SELECT r.revision, r.status FROM awp.runs r WHERE r.run_id = p_run_id;
  IF NOT FOUND THEN
    PERFORM awp._require_run(p_run_id);   -- raises AWNTF (its message written once, there)
  END IF;
END $$;
COMMENT ON FUNCTION awp.run_revision(text) IS 'A run''s revision and status (one row read), for polling; AWNTF when unknown.';

-- awp._waiting_for_executors(run_id): executor kinds of the run's ready or queued tasks that no active
-- worker offers, sorted. Locks: none.
CREATE OR REPLACE FUNCTION awp._waiting_for_executors(p_run_id text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(array_agg(DISTINCT t.executor ORDER BY t.executor), '{}')
    FROM awp.tasks t
   WHERE t.run_id = p_run_id AND t.status IN ('ready', 'queued') AND t.executor <> ALL (awp._database_kinds())
     AND NOT EXISTS (SELECT 1 FROM awp.workers w WHERE w.status = 'active' AND t.executor = ANY (w.executor_kinds))
$$;
COMMENT ON FUNCTION awp._waiting_for_executors(text) IS 'Executor kinds a run''s ready tasks wait for because no active worker offers them.';

-- awp.list_runs(workflow_id, status, after_run_id, limit, after_created_at): newest first; page on with
-- the last run_id of a page as p_after (and its created_at as p_after_created_at: then the page follows
-- even when that run was pruned meanwhile). limit 1-1000 (AWREQ otherwise). task_counts: a live run's are
-- counted from its tasks, a finished run's read from runs.final_task_counts (stored when it finished: a page of
-- 10 finished 10,000-task runs took 93 ms when every run's tasks were counted, 2.1 ms since, on this project's
-- machine in a slow phase).
CREATE OR REPLACE FUNCTION awp.list_runs(p_workflow_id text DEFAULT NULL, p_status text DEFAULT NULL,
                                         p_after text DEFAULT NULL, p_limit integer DEFAULT 50,
                                         p_after_created_at timestamptz DEFAULT NULL)
RETURNS TABLE (run_id text, workflow_id text, workflow_version integer, status text, revision bigint,
               cancel_requested_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, concurrency integer, idempotency_key text, task_counts jsonb,
               schedule_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_page(coalesce(p_limit, 0));   -- a NULL limit is refused too: list_runs always pages
  IF p_status IS NOT NULL AND p_status NOT IN ('pending', 'running', 'succeeded', 'failed', 'canceled') THEN
    PERFORM awp._raise_invalid_request('invalid status', 'status must be a run status');
  END IF;
  IF p_after_created_at IS NOT NULL AND p_after IS NULL THEN
    PERFORM awp._raise_invalid_request('invalid cursor', 'after_created_at needs after (a run id)');
  END IF;
  RETURN QUERY SELECT * FROM awp._run_rows(NULL, p_workflow_id, p_status, p_after, p_limit, p_after_created_at);
END $$;
COMMENT ON FUNCTION awp.list_runs(text, text, text, integer, timestamptz) IS 'Runs, newest first, filtered by workflow and status, keyset-paged after a run id.';

CREATE OR REPLACE FUNCTION awp._require_run(p_run_id text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM awp.runs r WHERE r.run_id = p_run_id) THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
END $$;
COMMENT ON FUNCTION awp._require_run(text) IS 'AWNTF unless the run exists.';

-- awp._instances_succeeded(run, task, item_count): how many instances of a mapped task (docs/dynamic.md) succeeded;
-- NULL for a task that is not mapped or not yet expanded (item_count NULL). Locks: none.
CREATE OR REPLACE FUNCTION awp._instances_succeeded(p_run_id text, p_task_key text, p_item_count integer) RETURNS integer
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_item_count IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN (SELECT count(*) FROM awp.tasks i
           WHERE i.run_id = p_run_id AND i.mapped_task = p_task_key AND i.status = 'succeeded');
END $$;
COMMENT ON FUNCTION awp._instances_succeeded(text, text, integer) IS 'The succeeded instances of a mapped task (NULL unless expanded).';

-- awp.run_tasks(run_id, after_task_key, limit): the tasks of a run in definition order; page on with
-- the task_key of the last row (AWREQ when the run has no such task). AWNTF for an unknown run.
-- wait_reason and wait_detail say what holds a waiting task (awp.run_waits, docs/limits.md; NULL for
-- a running or finished one). Dynamic workflows (docs/dynamic.md): an instance of a for_each task has its mapped
-- task and item_index (instances follow the run's other tasks); a mapped task its item_count (NULL until its
-- instances exist) and instances_succeeded; a skipped task its skip_reason (condition_false, dependency_failed); a
-- task of executor workflow the child run of its latest attempt (child_run_id).
-- Locks: none.
CREATE OR REPLACE FUNCTION awp.run_tasks(p_run_id text, p_after_task_key text DEFAULT NULL,
                                         p_limit integer DEFAULT NULL)
RETURNS TABLE (task_key text, status text, attempts integer, ready_at timestamptz, executor text,
               action text, depends_on text[], max_attempts integer, timeout_ms integer,
               updated_at timestamptz, finished_at timestamptz, wait_reason text, wait_detail text,
               mapped_task text, item_index integer, item_count integer, instances_succeeded integer,
               skip_reason text, child_run_id text, priority integer, limits text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_after integer := -1;
BEGIN
  PERFORM awp._require_run(p_run_id);
  PERFORM awp._check_page(p_limit);
  IF p_after_task_key IS NOT NULL THEN
    SELECT t.ordinal INTO v_after FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = p_after_task_key;
    IF NOT FOUND THEN
      PERFORM awp._raise_invalid_request('invalid cursor', format('run %s has no task %s', p_run_id, p_after_task_key));
    END IF;
  END IF;
  RETURN QUERY
  SELECT t.task_key, t.status, t.attempts, t.ready_at, t.executor, t.action, t.depends_on,
         t.max_attempts, t.timeout_ms, t.updated_at, t.finished_at, w.reason, w.detail,
         t.mapped_task, t.item_index, t.item_count, awp._instances_succeeded(p_run_id, t.task_key, t.item_count),
         t.skip_reason, t.child_run_id, t.priority::integer, t.limit_buckets
    FROM awp.tasks t LEFT JOIN awp._task_waits(p_run_id) w ON w.task_key = t.task_key
   WHERE t.run_id = p_run_id AND t.ordinal > v_after ORDER BY t.ordinal
   LIMIT p_limit;
END $$;
COMMENT ON FUNCTION awp.run_tasks(text, text, integer) IS 'The tasks of a run in definition order with their status and attempts made, keyset-paged; AWNTF when unknown.';

CREATE OR REPLACE FUNCTION awp.task_attempts(p_run_id text, p_task_key text)
RETURNS TABLE (attempt integer, status text, worker_id text, dispatch_id text, started_at timestamptz,
               finished_at timestamptz, output jsonb, error_code text, error_message text,
               fencing_token bigint, deadline timestamptz, counted boolean, error_detail text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM awp.tasks t WHERE t.run_id = p_run_id AND t.task_key = p_task_key) THEN
    PERFORM awp._require_run(p_run_id);
    PERFORM awp._raise_not_found('task not found', format('run %s has no task %s', p_run_id, p_task_key));
  END IF;
  RETURN QUERY
  SELECT a.attempt, a.status, a.worker_id, a.dispatch_id, a.started_at, a.finished_at, a.output,
         a.error_code, a.error_message, a.fencing_token, a.deadline, a.counted, a.error_detail
    FROM awp.attempts a WHERE a.run_id = p_run_id AND a.task_key = p_task_key ORDER BY a.attempt;
END $$;
COMMENT ON FUNCTION awp.task_attempts(text, text) IS 'The attempts of one task, oldest first (counted: whether it counts against max_attempts; error_detail: a failed handler''s traceback); AWNTF when unknown.';

CREATE OR REPLACE FUNCTION awp.run_events(p_run_id text, p_after_sequence bigint DEFAULT 0,
                                          p_limit integer DEFAULT NULL)
RETURNS TABLE (sequence bigint, revision bigint, entity_type text, entity_key text, from_status text,
               to_status text, reason text, occurred_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._require_run(p_run_id);
  RETURN QUERY
  SELECT e.sequence, e.revision, e.entity_type, e.entity_key, e.from_status, e.to_status, e.reason, e.occurred_at
    FROM awp.events e
   WHERE e.run_id = p_run_id AND e.sequence > coalesce(p_after_sequence, 0)
   ORDER BY e.sequence
   LIMIT p_limit;
END $$;
COMMENT ON FUNCTION awp.run_events(text, bigint, integer) IS 'The events of a run after a sequence number, in order; AWNTF when unknown.';

-- awp._workflow_rows(workflow_id, after_workflow_id, limit): workflows (one, or all by id after a key)
-- with their latest version (updated_at = when it was stored). Locks: none.
CREATE OR REPLACE FUNCTION awp._workflow_rows(p_workflow_id text, p_after text, p_limit integer)
RETURNS TABLE (workflow_id text, latest_version integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT w.workflow_id, v.version, w.created_at, v.created_at
    FROM awp.workflows w
    CROSS JOIN LATERAL (SELECT x.version, x.created_at FROM awp.workflow_versions x
                         WHERE x.workflow_id = w.workflow_id ORDER BY x.version DESC LIMIT 1) v
   WHERE (p_workflow_id IS NULL OR w.workflow_id = p_workflow_id)
     AND (p_after IS NULL OR w.workflow_id > p_after)
   ORDER BY w.workflow_id
   LIMIT p_limit
$$;
COMMENT ON FUNCTION awp._workflow_rows(text, text, integer) IS 'Workflows with their latest version, by id, keyset-paged.';

-- awp.list_workflows(after_workflow_id, limit): workflows by id with their latest version; page on with
-- the workflow_id of the last row. Locks: none.
CREATE OR REPLACE FUNCTION awp.list_workflows(p_after text DEFAULT NULL, p_limit integer DEFAULT NULL)
RETURNS TABLE (workflow_id text, latest_version integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_page(p_limit);
  RETURN QUERY SELECT * FROM awp._workflow_rows(NULL, p_after, p_limit);
END $$;
COMMENT ON FUNCTION awp.list_workflows(text, integer) IS 'Workflows with their latest version, by id, keyset-paged.';

CREATE OR REPLACE FUNCTION awp.get_workflow(p_workflow_id text)
RETURNS TABLE (workflow_id text, latest_version integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY SELECT * FROM awp._workflow_rows(p_workflow_id, NULL, 1);
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('workflow not found', format('no workflow %s', p_workflow_id));
  END IF;
END $$;
COMMENT ON FUNCTION awp.get_workflow(text) IS 'One workflow with its latest version; AWNTF when unknown.';

-- awp.workflow_versions(workflow_id, after_version, limit): the versions of a workflow, oldest first;
-- page on with the version of the last row. AWNTF when the workflow is unknown. Locks: none.
CREATE OR REPLACE FUNCTION awp.workflow_versions(p_workflow_id text, p_after_version integer DEFAULT NULL,
                                                 p_limit integer DEFAULT NULL)
RETURNS TABLE (workflow_id text, version integer, definition_hash text, task_count integer,
               created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_page(p_limit);
  IF NOT EXISTS (SELECT 1 FROM awp.workflows w WHERE w.workflow_id = p_workflow_id) THEN
    PERFORM awp._raise_not_found('workflow not found', format('no workflow %s', p_workflow_id));
  END IF;
  RETURN QUERY SELECT v.workflow_id, v.version, v.definition_hash, v.task_count, v.created_at
                 FROM awp.workflow_versions v
                WHERE v.workflow_id = p_workflow_id AND v.version > coalesce(p_after_version, 0)
                ORDER BY v.version
                LIMIT p_limit;
END $$;
COMMENT ON FUNCTION awp.workflow_versions(text, integer, integer) IS 'The versions of a workflow, oldest first, keyset-paged; AWNTF when unknown.';

CREATE OR REPLACE FUNCTION awp.get_workflow_version(p_workflow_id text, p_version integer)
RETURNS TABLE (workflow_id text, version integer, definition_hash text, task_count integer,
               created_at timestamptz, definition jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY SELECT v.workflow_id, v.version, v.definition_hash, v.task_count, v.created_at, v.definition
                 FROM awp.workflow_versions v WHERE v.workflow_id = p_workflow_id AND v.version = p_version;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('workflow version not found',
                                 format('workflow %s has no version %s', p_workflow_id, p_version));
  END IF;
END $$;
COMMENT ON FUNCTION awp.get_workflow_version(text, integer) IS 'One workflow version with its definition; AWNTF when unknown.';
