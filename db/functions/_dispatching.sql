-- Private helpers that turn ready tasks into pending dispatches: the fairness order, the budget and the
-- one-dispatch step used by awp._create_dispatches (coordinator passes, run starts), the refill of the slot a
-- completion frees (awp._refill_slot, awp._refill_slots; docs/protocol.md, Refill and claim on complete), and
-- awp._notify_pending (the wake-up hint for waiting claims).

-- awp._fairness_order(kinds): the runs that may get a dispatch now, in the fairness order of docs/protocol.md
-- (rule 9) within each priority, higher priority first (docs/limits.md, Priority): runs never dispatched first, then
-- the run whose latest dispatch is oldest (last_dispatch_seq), then the oldest run. A run is listed while it is
-- pending or running, its cancellation was not requested and it has a ready task without limits of one of `kinds`
-- (none: no run); once per priority of those tasks, so a caller may meet a run again further on. The one definition of that order, for
-- awp._create_dispatches, awp._refill_slot, awp._refill_slots and the claim on complete: a cursor over the runs
-- in that order (FETCH it row by row, CLOSE it when done). A cursor, so that a caller that stops at the first run
-- it can serve reads only that far: a set-returning function with a SET clause is neither inlined nor read
-- lazily, and computed every live run each time (measured, 1,000 runs of 5 tasks: 3.1 instead of 2.0 ms of
-- backend CPU per completion).
-- It reads awp.ready_queue (db/functions/_ready_queue.sql), whose index carries the order per kind, so it never
-- looks at a run without a ready task of those kinds: walking the live runs and probing each (AWP issue 46) read
-- every run of a backlog no worker serves for each dispatch (18-20 ms per completion at 1,000 such runs). One
-- kind: one ordered index scan; several: one scan per kind merged in order (a Merge Append, planned at each open:
-- EXECUTE), a run listed once. enable_sort = off (the cursor is planned at its OPEN, under the function's
-- settings): the order must come from the index, never from a sort of every queued run.
-- Locks: none (callers lock each run with SKIP LOCKED).
CREATE OR REPLACE FUNCTION awp._fairness_order(p_kinds text[]) RETURNS refcursor
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET enable_sort = off AS $$
DECLARE
  c refcursor;
BEGIN
  IF cardinality(p_kinds) = 1 THEN
    OPEN c NO SCROLL FOR SELECT q.run_id FROM awp.ready_queue q
     WHERE q.executor_kind = p_kinds[1]
       AND (SELECT x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL
              FROM awp.runs x WHERE x.run_id = q.run_id)
     ORDER BY q.executor_kind, q.priority DESC, q.last_dispatch_seq NULLS FIRST, q.created_at, q.run_id;
  ELSE
    OPEN c NO SCROLL FOR EXECUTE format(
      'SELECT DISTINCT ON (m.p, m.s, m.c, m.run_id) m.run_id FROM (%s) m'
      ' WHERE (SELECT x.status IN (''pending'', ''running'') AND x.cancel_requested_at IS NULL'
      '          FROM awp.runs x WHERE x.run_id = m.run_id)'
      ' ORDER BY m.p DESC, m.s NULLS FIRST, m.c, m.run_id',
      coalesce((SELECT string_agg(format('SELECT q.run_id, q.priority AS p, q.last_dispatch_seq AS s, q.created_at AS c'
                                         ' FROM awp.ready_queue q WHERE q.executor_kind = %L', k), ' UNION ALL ')
                  FROM (SELECT DISTINCT u.k FROM unnest(p_kinds) u(k) WHERE u.k IS NOT NULL) d(k)),
               'SELECT NULL::text AS run_id, NULL::smallint AS p, NULL::bigint AS s, NULL::timestamptz AS c WHERE false'));
  END IF;
  RETURN c;
END $$;
COMMENT ON FUNCTION awp._fairness_order(text[]) IS 'A cursor over the runs that may get a dispatch now (a ready task of one of kinds), in fairness order.';

-- awp._kinds_with_room(kinds): the executor kinds of a budget's `kinds` ({kind: free slots}) with a free slot.
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._kinds_with_room(p_kinds jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN ARRAY(SELECT k.key FROM jsonb_each_text(p_kinds) k WHERE k.value::integer > 0 ORDER BY 1);
END $$;
COMMENT ON FUNCTION awp._kinds_with_room(jsonb) IS 'The executor kinds of a dispatch budget that have a free slot.';

-- awp._dispatch_budget(): how many dispatches may be created right now:
--   global_free  dispatch_limit - (pending + leased)
--   worker_free  free slots of active workers - pending dispatches
--   kinds        per executor kind: free slots of active workers supporting it - pending of that kind
-- Takes no locks (a slightly stale budget only delays or slightly over-offers pending dispatches;
-- claims re-check every worker's capacity under its lock).
CREATE OR REPLACE FUNCTION awp._dispatch_budget(OUT global_free integer, OUT worker_free integer, OUT kinds jsonb)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  WITH live AS MATERIALIZED (   -- two arms so each uses its partial index, not a scan of all history
    SELECT d.status, d.executor_kind, d.worker_id FROM awp.dispatches d WHERE d.status = 'pending'
    UNION ALL
    SELECT d.status, d.executor_kind, d.worker_id FROM awp.dispatches d WHERE d.status = 'leased'
  ), leased AS (
    SELECT l.worker_id, count(*) AS n FROM live l WHERE l.status = 'leased' GROUP BY 1
  ), free AS MATERIALIZED (
    SELECT w.executor_kinds, greatest(w.max_concurrency - coalesce(l.n, 0), 0) AS n
      FROM awp.workers w LEFT JOIN leased l ON l.worker_id = w.worker_id
     WHERE w.status = 'active'
  ), pending AS MATERIALIZED (
    SELECT l.executor_kind, count(*) AS n FROM live l WHERE l.status = 'pending' GROUP BY 1
  )
  SELECT (SELECT s.dispatch_limit FROM awp.settings s) - (SELECT count(*) FROM live)::integer,
         ((SELECT coalesce(sum(f.n), 0) FROM free f) - (SELECT coalesce(sum(p.n), 0) FROM pending p))::integer,
         (SELECT coalesce(jsonb_object_agg(k.kind, k.n), '{}') FROM (
            SELECT u.kind, sum(f.n) - coalesce(max(p.n), 0) AS n
              FROM free f CROSS JOIN LATERAL unnest(f.executor_kinds) AS u(kind)
              LEFT JOIN pending p ON p.executor_kind = u.kind
             GROUP BY u.kind) k)
    INTO global_free, worker_free, kinds;
END $$;
COMMENT ON FUNCTION awp._dispatch_budget() IS 'The dispatch budget now: global, worker and per-kind free capacity.';

-- awp._dispatch_one(run, kinds): creates one pending dispatch (awp._dispatch_task) for the run's first ready task
-- without limits (higher priority first, then definition order) whose executor kind has budget in `kinds`, unless
-- the run's queued + running tasks already reach its concurrency. The caller holds the run's row lock. Returns the
-- executor kind dispatched, or NULL. (Tasks with limits: awp._pick_limited, db/functions/_rate_limits.sql.)
-- enable_sort = off: the first ready task must come from an index in ordinal order (tasks_ready_idx or
-- tasks_unfinished_idx). On a young table (no statistics yet) the planner otherwise takes the primary
-- key and sorts every task of the run, finished ones included: measured 0.37 ms per call at 1,000
-- tasks into a 2,000-task run, growing with the run, instead of a few microseconds.
CREATE OR REPLACE FUNCTION awp._dispatch_one(p_run_id text, p_kinds jsonb) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_sort = off AS $$
DECLARE
  r     record;
  t     record;
BEGIN
  SELECT x.status, x.concurrency INTO r FROM awp.runs x
   WHERE x.run_id = p_run_id AND x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL;
  IF NOT FOUND OR (SELECT count(*) FROM awp.tasks y
                    WHERE y.run_id = p_run_id AND y.status IN ('queued', 'running')) >= r.concurrency THEN
    RETURN NULL;
  END IF;
  SELECT y.task_key INTO t FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.status = 'ready' AND coalesce((p_kinds->>y.executor)::integer, 0) > 0
     AND y.limit_buckets IS NULL
     AND awp._action_served(y.executor, y.action)   -- routing by action (db/functions/_routing.sql)
   ORDER BY y.priority DESC, y.ordinal LIMIT 1
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  RETURN awp._dispatch_task(p_run_id, t.task_key);
END $$;
COMMENT ON FUNCTION awp._dispatch_one(text, jsonb) IS 'Creates one pending dispatch for a run (caller holds the run lock) within its concurrency; returns the executor kind or NULL.';

-- awp._dispatch_task(run, task): creates the pending dispatch of a ready task the caller chose (holding the run's
-- row lock and the task's): moves the task to queued and a pending run to running, records the run's place in
-- the fairness order and writes the events (the NOTIFY comes from awp._notify_pending at the end of the public
-- call). Returns the task's executor kind.
CREATE OR REPLACE FUNCTION awp._dispatch_task(p_run_id text, p_task_key text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r     record;
  t     record;
  v_id  text;
  v_now timestamptz := awp._now();
BEGIN
  SELECT x.status INTO r FROM awp.runs x WHERE x.run_id = p_run_id;
  SELECT y.task_key, y.executor INTO t FROM awp.tasks y WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
  v_id := awp._new_dispatch_id(p_run_id);
  INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
  VALUES (v_id, p_run_id, t.task_key, t.executor, v_now);
  -- Remembered for awp._notify_pending (a transaction-local setting: rolled back with the transaction).
  PERFORM set_config('awp.new_dispatches', coalesce(current_setting('awp.new_dispatches', true), '') || v_id || ' ', true);
  UPDATE awp.tasks y SET status = 'queued', updated_at = v_now
   WHERE y.run_id = p_run_id AND y.task_key = t.task_key;
  UPDATE awp.runs x SET last_dispatch_seq = nextval('awp.dispatch_order_seq'),
                        status = 'running', started_at = coalesce(x.started_at, v_now)
   WHERE x.run_id = p_run_id;
  IF r.status = 'pending' THEN
    PERFORM awp._append_events(p_run_id, '{run,task,dispatch}', ARRAY[p_run_id, t.task_key, v_id], '{pending,ready,NULL}',
                               '{running,queued,pending}', '{"first dispatch","dispatch created","dispatch created"}');
  ELSE
    PERFORM awp._append_events(p_run_id, '{task,dispatch}', ARRAY[t.task_key, v_id], '{ready,NULL}',
                               '{queued,pending}', '{"dispatch created","dispatch created"}');
  END IF;
  RETURN t.executor;
END $$;
COMMENT ON FUNCTION awp._dispatch_task(text, text) IS 'Creates the pending dispatch of a chosen ready task (caller holds its run and row); returns its executor kind.';

-- awp._dispatch_new_run(run): dispatch on start (docs/protocol.md, Refill and claim on complete): the new run's own
-- ready tasks, within the three limits (as awp._create_dispatches: under its advisory lock, one budget; those with
-- rate limits first, awp._dispatch_limited). Other
-- runs are left to the coordinator's passes and to refills, so a start costs the same however many runs wait
-- (a backlog of a kind without a free slot included). Returns the number created. Locks: the advisory lock of
-- awp._create_dispatches, then the run's row (the caller created it), then its tasks.
CREATE OR REPLACE FUNCTION awp._dispatch_new_run(p_run_id text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  b       record;
  v_kinds jsonb;
  v_left  integer;
  v_kind  text;
  v_n     integer := 0;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('awp.create_dispatches'));
  b := awp._dispatch_budget();
  v_kinds := b.kinds;
  v_left := least(b.global_free, b.worker_free);
  SELECT l.kinds, l.created INTO v_kinds, v_n FROM awp._dispatch_limited(v_kinds, v_left, p_run_id) l;
  v_left := v_left - v_n;
  WHILE v_left > 0 LOOP
    v_kind := awp._dispatch_one(p_run_id, v_kinds);
    EXIT WHEN v_kind IS NULL;
    v_kinds := jsonb_set(v_kinds, ARRAY[v_kind], to_jsonb((v_kinds->>v_kind)::integer - 1));
    v_left := v_left - 1;
    v_n := v_n + 1;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._dispatch_new_run(text) IS 'Creates pending dispatches for a new run''s ready tasks within the limits; returns the count.';

-- awp._notify_pending(): one NOTIFY awp_dispatch per dispatch this transaction created and left
-- pending (payload "<executor kind> <dispatch id>", so PostgreSQL does not fold them into one): the
-- ids come from the transaction-local setting awp.new_dispatches that awp._dispatch_one appends to
-- (no scan of the pending dispatches); the
-- gateway wakes one waiting claim per notification. Called last by every public function that
-- creates dispatches, so a dispatch the same transaction already leased (complete_and_claim) wakes
-- nobody. A hint only: waiting claims also re-check on their own.
CREATE OR REPLACE FUNCTION awp._notify_pending() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_ids text := current_setting('awp.new_dispatches', true);
  v_n   integer;
BEGIN
  PERFORM awp._log_flush();   -- called last by every public function that creates dispatches
  IF v_ids IS NULL OR v_ids = '' THEN
    RETURN 0;
  END IF;
  PERFORM set_config('awp.new_dispatches', '', true);
  SELECT count(pg_notify('awp_dispatch', d.executor_kind || ' ' || d.dispatch_id)) INTO v_n
    FROM awp.dispatches d
   WHERE d.dispatch_id = ANY (string_to_array(rtrim(v_ids), ' ')) AND d.status = 'pending';
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._notify_pending() IS 'Sends one NOTIFY awp_dispatch per dispatch created and still pending in this transaction.';

-- awp._try_run(run): takes a run for a refill without waiting: its transaction advisory lock (the queue of its
-- completions, see awp._complete_task) with pg_try_advisory_xact_lock, then its row FOR UPDATE SKIP LOCKED. False
-- (nothing held or waited for) when the run is busy elsewhere: a completion of that run is under way or queued
-- behind one, or a claim holds its row. Refills go to the next run in fairness order then; taking the row
-- alone would make that run's queued completions wait for the refill's whole transaction (measured: 8 runs x
-- 125 tasks, 16 workers spent 2.6 ms per task waiting for run rows held by refills from other runs).
-- Locks: as said; a run this transaction holds already is taken again at once.
CREATE OR REPLACE FUNCTION awp._try_run(p_run_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT pg_try_advisory_xact_lock(hashtextextended(p_run_id, 0)) THEN
    RETURN false;
  END IF;
  PERFORM 1 FROM awp.runs x WHERE x.run_id = p_run_id FOR UPDATE SKIP LOCKED;
  RETURN FOUND;
END $$;
COMMENT ON FUNCTION awp._try_run(text) IS 'Takes a run (advisory lock, then row) for a refill without waiting; false when it is busy elsewhere.';

-- awp._refill_slot(worker): the refill (docs/protocol.md, Refill and claim on complete). A completion frees
-- one slot of an active worker; it is refilled at once with one dispatch: a ready task with rate limits that have
-- room (awp._dispatch_limited: limits already bound what those take), else for the first run in fairness
-- order (awp._fairness_order) that has a ready task of a kind that worker runs and room under its
-- concurrency. Pending + leased and the worker's capacity are thus
-- unchanged, so no global budget (nor the advisory lock of awp._create_dispatches) is needed, and
-- run concurrency is checked under the run's lock. Runs busy elsewhere are skipped (SKIP LOCKED).
-- Returns true when a dispatch was created.
CREATE OR REPLACE FUNCTION awp._refill_slot(p_worker awp.workers) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_kinds jsonb;
  v_run   text;
  c       refcursor;
BEGIN
  IF p_worker.status <> 'active' THEN
    RETURN false;
  END IF;
  SELECT jsonb_object_agg(k, 1) INTO v_kinds FROM unnest(p_worker.executor_kinds) k;
  IF (awp._dispatch_limited(v_kinds, 1)).created > 0 THEN
    RETURN true;
  END IF;
  c := awp._fairness_order(p_worker.executor_kinds);
  LOOP
    FETCH c INTO v_run;
    EXIT WHEN NOT FOUND;
    CONTINUE WHEN NOT awp._try_run(v_run);
    IF awp._dispatch_one(v_run, v_kinds) IS NOT NULL THEN
      CLOSE c;
      RETURN true;
    END IF;
  END LOOP;
  CLOSE c;
  RETURN false;
END $$;
COMMENT ON FUNCTION awp._refill_slot(awp.workers) IS 'Refills the slot a completion freed with one dispatch (fairness order, that worker''s kinds).';

-- awp._dispatch_many(run, kinds, n): awp._dispatch_one for up to n tasks at once (the run's first ready
-- tasks without limits, higher priority first, then in definition order, whose executor is in `kinds`), within the
-- run's concurrency: one INSERT,
-- one UPDATE of the tasks, one of the run row (its place in the fairness order) and one _append_events,
-- instead of n of each. The caller holds the run's row lock. Returns the number created.
CREATE OR REPLACE FUNCTION awp._dispatch_many(p_run_id text, p_kinds text[], p_n integer) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_sort = off AS $$   -- see awp._dispatch_one
DECLARE
  r      record;
  v_room integer;
  v_keys text[];
  v_ids  text[];
  v_n    integer;
  v_now  timestamptz := awp._now();
BEGIN
  SELECT x.status, x.concurrency INTO r FROM awp.runs x
   WHERE x.run_id = p_run_id AND x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  v_room := least(p_n, r.concurrency - (SELECT count(*) FROM awp.tasks y
                                          WHERE y.run_id = p_run_id AND y.status IN ('queued', 'running')));
  IF v_room <= 0 THEN
    RETURN 0;
  END IF;
  WITH pick AS MATERIALIZED (
    SELECT y.task_key, y.executor, y.ordinal, y.priority, awp._new_dispatch_id(p_run_id) AS dispatch_id FROM awp.tasks y
     WHERE y.run_id = p_run_id AND y.status = 'ready' AND y.executor = ANY (p_kinds) AND y.limit_buckets IS NULL
       AND awp._action_served(y.executor, y.action)   -- routing by action (db/functions/_routing.sql)
     ORDER BY y.priority DESC, y.ordinal LIMIT v_room
       FOR UPDATE
  ), ins AS (
    INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
    SELECT k.dispatch_id, p_run_id, k.task_key, k.executor, v_now FROM pick k
  ), upd AS (
    UPDATE awp.tasks y SET status = 'queued', updated_at = v_now
      FROM pick k WHERE y.run_id = p_run_id AND y.task_key = k.task_key
  )
  SELECT array_agg(k.task_key ORDER BY k.priority DESC, k.ordinal), array_agg(k.dispatch_id ORDER BY k.priority DESC, k.ordinal)
    INTO v_keys, v_ids
    FROM pick k;
  v_n := coalesce(cardinality(v_keys), 0);
  IF v_n = 0 THEN
    RETURN 0;
  END IF;
  UPDATE awp.runs x SET last_dispatch_seq = nextval('awp.dispatch_order_seq'),
                        status = 'running', started_at = coalesce(x.started_at, v_now)
   WHERE x.run_id = p_run_id;
  -- The events of _dispatch_one, in the same order: (task queued, dispatch pending) per task.
  PERFORM awp._append_events(p_run_id,
    CASE WHEN r.status = 'pending' THEN '{run}'::text[] ELSE '{}' END || array_agg(e.t ORDER BY e.i, e.j),
    CASE WHEN r.status = 'pending' THEN ARRAY[p_run_id] ELSE '{}' END || array_agg(e.k ORDER BY e.i, e.j),
    CASE WHEN r.status = 'pending' THEN '{pending}'::text[] ELSE '{}' END || array_agg(e.f ORDER BY e.i, e.j),
    CASE WHEN r.status = 'pending' THEN '{running}'::text[] ELSE '{}' END || array_agg(e.s ORDER BY e.i, e.j),
    CASE WHEN r.status = 'pending' THEN '{"first dispatch"}'::text[] ELSE '{}' END || array_agg('dispatch created'::text ORDER BY e.i, e.j))
    FROM (SELECT i, 1 AS j, 'task'::text AS t, v_keys[i] AS k, 'ready'::text AS f, 'queued'::text AS s FROM generate_subscripts(v_keys, 1) i
          UNION ALL
          SELECT i, 2, 'dispatch', v_ids[i], NULL, 'pending' FROM generate_subscripts(v_ids, 1) i) e;
  PERFORM set_config('awp.new_dispatches',
                     coalesce(current_setting('awp.new_dispatches', true), '') || array_to_string(v_ids, ' ') || ' ', true);
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._dispatch_many(text, text[], integer) IS 'Creates up to n pending dispatches for a run at once (caller holds the run lock) within its concurrency; returns the count.';

-- awp._refill_slots(worker, n): awp._refill_slot for the n slots a batch of completions
-- freed: ready tasks with rate limits that have room first (awp._dispatch_limited), then the slots left go round-robin to the runs in fairness order that have a ready task of a kind
-- that worker runs (as n single refills would), and each run gets its share in one
-- awp._dispatch_many call. Runs busy elsewhere are skipped (SKIP LOCKED). Returns the number created.
CREATE OR REPLACE FUNCTION awp._refill_slots(p_worker awp.workers, p_n integer) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_runs  text[] := '{}';
  v_run   text;
  v_share integer;
  v_i     integer;
  v_done  integer := 0;
  c       refcursor;
BEGIN
  IF p_worker.status <> 'active' OR p_n < 1 THEN
    RETURN 0;
  END IF;
  v_done := (awp._dispatch_limited((SELECT jsonb_object_agg(k, p_n) FROM unnest(p_worker.executor_kinds) k), p_n)).created;
  IF v_done >= p_n THEN
    RETURN v_done;
  END IF;
  p_n := p_n - v_done;
  c := awp._fairness_order(p_worker.executor_kinds);
  WHILE cardinality(v_runs) < p_n LOOP
    FETCH c INTO v_run;
    EXIT WHEN NOT FOUND;
    v_runs := v_runs || v_run;
  END LOOP;
  CLOSE c;
  FOR v_i IN 1 .. cardinality(v_runs) LOOP
    -- Round-robin share of run i among k runs: one each, the first (n mod k) runs one more.
    v_share := p_n / cardinality(v_runs) + CASE WHEN v_i <= p_n % cardinality(v_runs) THEN 1 ELSE 0 END;
    CONTINUE WHEN NOT awp._try_run(v_runs[v_i]);
    v_done := v_done + awp._dispatch_many(v_runs[v_i], p_worker.executor_kinds, v_share);
  END LOOP;
  RETURN v_done;
END $$;
COMMENT ON FUNCTION awp._refill_slots(awp.workers, integer) IS 'Refills up to n slots a batch of completions freed (round-robin over runs in fairness order).';
