-- Private helpers that turn ready tasks into pending dispatches, shared by the coordinator
-- (awp.create_dispatches) and the completion fast path (awp._dispatch_inline).

-- awp._dispatch_budget(): how many dispatches may be created right now:
--   global_free  dispatch_limit - (pending + leased)
--   worker_free  free slots of active workers - pending dispatches
--   kinds        per executor kind: free slots of active workers supporting it - pending of that kind
-- Takes no locks (a slightly stale budget only delays or slightly over-offers pending dispatches;
-- claims re-check every worker's capacity under its lock).
CREATE OR REPLACE FUNCTION awp._dispatch_budget(OUT global_free integer, OUT worker_free integer, OUT kinds jsonb)
LANGUAGE sql STABLE SET search_path = '' AS $$
  WITH live AS (
    SELECT d.status, d.executor_kind, d.worker_id FROM awp.dispatches d WHERE d.status IN ('pending', 'leased')
  ), free AS (
    SELECT w.executor_kinds,
           greatest(w.max_concurrency - (SELECT count(*) FROM live l WHERE l.worker_id = w.worker_id AND l.status = 'leased'), 0) AS n
      FROM awp.workers w WHERE w.status = 'active'
  ), pending AS (
    SELECT l.executor_kind, count(*) AS n FROM live l WHERE l.status = 'pending' GROUP BY 1
  )
  SELECT (SELECT s.dispatch_limit FROM awp.settings s) - (SELECT count(*) FROM live)::integer,
         ((SELECT coalesce(sum(n), 0) FROM free) - (SELECT coalesce(sum(n), 0) FROM pending))::integer,
         (SELECT coalesce(jsonb_object_agg(k.kind, k.n), '{}') FROM (
            SELECT u.kind, sum(f.n) - coalesce(max(p.n), 0) AS n
              FROM free f, unnest(f.executor_kinds) AS u(kind)
              LEFT JOIN pending p ON p.executor_kind = u.kind
             GROUP BY u.kind) k)
$$;
COMMENT ON FUNCTION awp._dispatch_budget() IS 'The dispatch budget now: global, worker and per-kind free capacity.';

-- awp._dispatch_one(run, kinds): creates one pending dispatch for the run's first ready task (in
-- definition order) whose executor kind has budget in `kinds`, unless the run's queued + running
-- tasks already reach its concurrency. The caller holds the run's row lock. Moves the task to
-- queued and a pending run to running, records the run's place in the fairness order, writes the
-- events and a NOTIFY awp_dispatch. Returns the executor kind dispatched, or NULL.
CREATE OR REPLACE FUNCTION awp._dispatch_one(p_run_id text, p_kinds jsonb) RETURNS text
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  r     record;
  t     record;
  v_id  text;
  v_now timestamptz := awp._now();
BEGIN
  SELECT x.status, x.concurrency INTO r FROM awp.runs x
   WHERE x.run_id = p_run_id AND x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL;
  IF NOT FOUND OR (SELECT count(*) FROM awp.tasks y
                    WHERE y.run_id = p_run_id AND y.status IN ('queued', 'running')) >= r.concurrency THEN
    RETURN NULL;
  END IF;
  SELECT y.task_key, y.executor INTO t FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.status = 'ready' AND coalesce((p_kinds->>y.executor)::integer, 0) > 0
   ORDER BY y.ordinal LIMIT 1
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  v_id := awp._new_id('dsp');
  INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
  VALUES (v_id, p_run_id, t.task_key, t.executor, v_now);
  UPDATE awp.tasks y SET status = 'queued', updated_at = v_now
   WHERE y.run_id = p_run_id AND y.task_key = t.task_key;
  UPDATE awp.runs x SET last_dispatch_seq = nextval('awp.dispatch_order_seq'),
                        status = 'running', started_at = coalesce(x.started_at, v_now)
   WHERE x.run_id = p_run_id;
  IF r.status = 'pending' THEN
    PERFORM awp._logn(p_run_id, '{run,task,dispatch}', ARRAY[p_run_id, t.task_key, v_id], '{pending,ready,NULL}',
                      '{running,queued,pending}', '{"first dispatch","dispatch created","dispatch created"}');
  ELSE
    PERFORM awp._logn(p_run_id, '{task,dispatch}', ARRAY[t.task_key, v_id], '{ready,NULL}',
                      '{queued,pending}', '{"dispatch created","dispatch created"}');
  END IF;
  PERFORM awp._wake('awp_dispatch', t.executor);
  RETURN t.executor;
END $$;
COMMENT ON FUNCTION awp._dispatch_one(text, jsonb) IS 'Creates one pending dispatch for a run (caller holds the run lock) within its concurrency; returns the executor kind or NULL.';

-- awp._dispatch_inline(run): the fast path of SPEC section 9: right after a completion, the run
-- (locked by the caller) may get one new dispatch in the same transaction, but only when every
-- limit allows it and the fairness rule would pick this run anyway: no other live run with
-- ready tasks is ahead of it (never dispatched, or its latest dispatch is older). Otherwise the
-- coordinator does it on its next pass. Returns true when a dispatch was created.
CREATE OR REPLACE FUNCTION awp._dispatch_inline(p_run_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  v_seq bigint;
  b     record;
BEGIN
  SELECT r.last_dispatch_seq INTO v_seq FROM awp.runs r
   WHERE r.run_id = p_run_id AND r.status = 'running' AND r.cancel_requested_at IS NULL;
  IF NOT FOUND
     OR NOT EXISTS (SELECT 1 FROM awp.tasks y WHERE y.run_id = p_run_id AND y.status = 'ready')
     OR EXISTS (SELECT 1 FROM awp.runs x
                 WHERE x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL
                   AND x.run_id <> p_run_id AND (x.last_dispatch_seq IS NULL OR x.last_dispatch_seq < v_seq)
                   AND EXISTS (SELECT 1 FROM awp.tasks y WHERE y.run_id = x.run_id AND y.status = 'ready')) THEN
    RETURN false;
  END IF;
  b := awp._dispatch_budget();
  IF b.global_free <= 0 OR b.worker_free <= 0 THEN
    RETURN false;
  END IF;
  RETURN awp._dispatch_one(p_run_id, b.kinds) IS NOT NULL;
END $$;
COMMENT ON FUNCTION awp._dispatch_inline(text) IS 'Creates one dispatch for a just-completed run when the limits and the fairness rule allow it.';
