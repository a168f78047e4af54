-- Small read functions the HTTP gateway needs besides the SQL API listed in docs/sql-api.md.
-- None changes state, none returns a token or a hash.

-- awp.check_worker_session(worker_id, session_token): the worker's status when the session is
-- valid; AWSES otherwise. The gateway calls it before answering a malformed worker request, so an
-- invalid session wins over every other error (python/awp/openapi.yaml). Locks: none.
CREATE OR REPLACE FUNCTION awp.check_worker_session(p_worker_id text, p_session_token text)
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN (awp._session(p_worker_id, p_session_token, false)).status;
END $$;
COMMENT ON FUNCTION awp.check_worker_session(text, text) IS 'The status of a valid worker session; AWSES when unknown, offline or stopped.';

-- awp.get_task(run_id, task_key): one task (the columns of awp.run_tasks) with its attempts
-- (the rows of awp.task_attempts, oldest first) as a jsonb array, then wait_reason and wait_detail
-- (what holds it while it waits: awp.run_waits, docs/limits.md), its priority and its rate limits' buckets
-- (limits: name or name=key; NULL for none), then progress and progress_at: the latest progress value its latest
-- attempt reported (docs/progress.md; NULL when none). AWNTF when unknown. Locks: none.
CREATE OR REPLACE FUNCTION awp.get_task(p_run_id text, p_task_key text)
RETURNS TABLE (task_key text, status text, attempts integer, ready_at timestamptz, executor text,
               action text, depends_on text[], max_attempts integer, timeout_ms integer,
               updated_at timestamptz, finished_at timestamptz, attempt_history jsonb,
               wait_reason text, wait_detail text, mapped_task text, item_index integer, item jsonb,
               item_count integer, instances_succeeded integer, skip_reason text, output jsonb, error_code text,
               error_message text, child_run_id text, priority integer, limits text[], progress jsonb,
               progress_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_history jsonb;
BEGIN
  SELECT coalesce(jsonb_agg(to_jsonb(a) ORDER BY a.attempt), '[]'::jsonb) INTO v_history
    FROM awp.task_attempts(p_run_id, p_task_key) a;
  RETURN QUERY
  SELECT t.task_key, t.status, t.attempts, t.ready_at, t.executor, t.action, t.depends_on,
         t.max_attempts, t.timeout_ms, t.updated_at, t.finished_at, v_history, w.reason, w.detail,
         t.mapped_task, t.item_index, t.item, t.item_count, awp._instances_succeeded(p_run_id, t.task_key, t.item_count),
         t.skip_reason, t.output, t.error_code, t.error_message, t.child_run_id, t.priority::integer, t.limit_buckets,
         g.progress, g.progress_at
    FROM awp.tasks t
    LEFT JOIN awp.task_progress g ON g.run_id = t.run_id AND g.task_key = t.task_key AND g.attempt = t.attempts
    LEFT JOIN awp._task_waits(CASE WHEN t.status IN ('waiting_dependencies', 'waiting_retry', 'ready', 'queued')
                                        OR (t.status = 'running' AND t.executor IN ('signal', 'sleep'))
                                   THEN p_run_id END) w ON w.task_key = t.task_key
   WHERE t.run_id = p_run_id AND t.task_key = p_task_key;
END $$;
COMMENT ON FUNCTION awp.get_task(text, text) IS 'One task of a run with its attempts as a jsonb array and what holds it while it waits; AWNTF when unknown.';

-- awp.metrics_snapshot(): counts for the gateway's /metrics gauges:
-- {"runs": {status: n}, "dispatches": {status: n}, "workers": {status: n}, "leases_active": n,
--  "ready_without_worker": {executor kind: ready tasks that no active worker offers},
--  "rate_limits": {limit name: {"in_flight", "held"}}, one entry per defined limit (docs/limits.md)).
-- Bounded: runs and workers by status come from awp.status_counts (maintained by triggers, folded by the
-- coordinator: db/functions/_status_counts.sql), the other gauges from live rows through partial indexes
-- (pending / leased dispatches), so a scrape costs the same with 100 or 100,000 finished runs; the ready tasks
-- are summed from awp.ready_queue (one row per run and kind: a backlog of 100,000 ready tasks over 1,000 runs is
-- 1,000 rows, not 100,000). Terminal dispatches are not counted. Locks: none.
CREATE OR REPLACE FUNCTION awp.metrics_snapshot()
RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object(
    'runs', awp._counts_by_status('run'),
    'dispatches', (SELECT coalesce(jsonb_object_agg(x.status, x.n), '{}') FROM
               (SELECT d.status, count(*) AS n FROM awp.dispatches d
                 WHERE d.status IN ('pending', 'leased') GROUP BY 1) x),
    'workers', awp._counts_by_status('worker'),
    'leases_active', (SELECT count(*) FROM awp.dispatches d WHERE d.status = 'leased'),
    'ready_without_worker', (SELECT coalesce(jsonb_object_agg(x.executor, x.n), '{}') FROM
               (SELECT q.executor_kind AS executor, sum(q.ready_tasks) AS n FROM awp.ready_queue q
                 WHERE q.executor_kind <> ALL (awp._database_kinds())
                   AND NOT EXISTS (SELECT 1 FROM awp.workers w
                                    WHERE w.status = 'active' AND q.executor_kind = ANY (w.executor_kinds))
                 GROUP BY 1) x),
    'rate_limits', (SELECT coalesce(jsonb_object_agg(l.name, jsonb_build_object('in_flight', l.in_flight, 'held', l.held)), '{}')
                      FROM awp._rate_limit_rows(NULL) l))
$$;
COMMENT ON FUNCTION awp.metrics_snapshot() IS 'Counts of runs, live dispatches, workers by status and active leases, for /metrics.';
