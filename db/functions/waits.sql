-- Why a task waits, and the cluster-level signals (docs/limits.md). Read-only: none of these takes a
-- lock or changes state, and every one reads live rows only (ready / queued / waiting tasks of
-- pending and running runs, pending and leased dispatches, active workers), never finished history.
--
-- A waiting task (waiting_dependencies, waiting_retry, ready, queued; and a running task of executor signal or
-- sleep, which waits without a worker) gets exactly one reason code,
-- from the same rules awp._create_dispatches, awp._dispatch_one and awp.withdraw_orphan_dispatches
-- apply, with the budget of awp._dispatch_budget():
--   cancel_requested        the run's cancellation was requested: it will be canceled, not dispatched
--   waiting_dependencies    a dependency has not succeeded yet (waiting_on: which); a for_each task: its instances
--                           (docs/dynamic.md)
--   waiting_signal          a running task of executor signal waits for its signal (awp.send_signal; docs/waits.md)
--   sleeping                a running task of executor sleep waits for its time
--   waiting_retry           an attempt failed; the retry becomes ready at ready_at
--   rate_limited            a ready task with limits (docs/limits.md): one of them is full, out of starts in its
--                           window, or not defined (the detail names it, and its key); a task with limits that
--                           none holds waits for what holds any other task (run_concurrency, dispatch_limit,
--                           workers_full) or for the next refill or pass (waiting_for_dispatch)
--   no_worker_for_executor  no active worker offers the task's executor kind (a queued task's dispatch
--                           is withdrawn by the next coordinator pass)
--   no_worker_for_action    active workers offer the kind, but none of them runs the task's action (they listed
--                           their actions and this one is not among them: routing by action, _routing.sql)
--   run_concurrency         the run's queued + running tasks reach its concurrency, or the places left
--                           go to its tasks before this one (definition order); a ready child-run task (executor
--                           workflow, run by the database) waits only for this
--   dispatch_limit          the global dispatch_limit (pending + leased dispatches) is reached, or the
--                           places left go to tasks before this one
--   workers_full            every active worker offering the kind is busy (its free slots are taken
--                           by leases and pending dispatches), or the free slots go to tasks before it
--   fairness                a capacity limit (the two above) holds it and tasks of other runs come
--                           first in the fair order (one task per run per round; the run whose latest
--                           dispatch is oldest first)
--   waiting_for_dispatch    nothing holds it: the coordinator's next pass dispatches it
--   waiting_for_claim       queued: its dispatch is pending until a worker offering the kind claims it
-- When several hold a task, the first in this order is given (for a queued task: cancel_requested,
-- no_worker_for_executor, no_worker_for_action, waiting_for_claim), except that of the two capacity limits the tighter is
-- named (workers_full when both are used up). Between two coordinator passes a
-- ready task can say waiting_for_dispatch for a moment; after a pass every ready task says what
-- holds it.

-- awp._wait_secs(interval): a short human duration ("850 ms", "4.9 s", "2 min 5 s", "3 h 20 min").
CREATE OR REPLACE FUNCTION awp._wait_secs(p interval) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE
           WHEN s < 1 THEN round(s * 1000)::bigint || ' ms'
           WHEN s < 60 THEN trim(to_char(s, 'FM990.0')) || ' s'
           WHEN s < 3600 THEN floor(s / 60)::bigint || ' min ' || floor(s)::bigint % 60 || ' s'
           ELSE floor(s / 3600)::bigint || ' h ' || floor(s / 60)::bigint % 60 || ' min'
         END
    FROM (SELECT greatest(extract(epoch FROM p), 0)::numeric AS s) x
$$;
COMMENT ON FUNCTION awp._wait_secs(interval) IS 'A short human-readable duration, for wait details.';

-- awp._wait_ts(ts): a timestamp as ISO 8601 UTC with milliseconds, for wait details.
CREATE OR REPLACE FUNCTION awp._wait_ts(p timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT to_char(p AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;
COMMENT ON FUNCTION awp._wait_ts(timestamptz) IS 'A timestamp as ISO 8601 UTC text, for wait details.';

-- awp._kind_capacity(): per executor kind offered by an active worker or named by a pending
-- dispatch: active workers offering it, their slots (max_concurrency), the slots they have free
-- (not leased, the per-worker rule of awp._dispatch_budget), and the pending and leased dispatches of
-- that kind. A worker offering several kinds counts for each. Locks: none.
CREATE OR REPLACE FUNCTION awp._kind_capacity()
RETURNS TABLE (executor_kind text, workers integer, slots integer, free_slots integer, pending integer,
               leased integer)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  WITH live AS MATERIALIZED (   -- two arms so each uses its partial index (as awp._dispatch_budget)
    SELECT d.status, d.executor_kind, d.worker_id FROM awp.dispatches d WHERE d.status = 'pending'
    UNION ALL
    SELECT d.status, d.executor_kind, d.worker_id FROM awp.dispatches d WHERE d.status = 'leased'
  ), held AS (
    SELECT l.worker_id, count(*) AS n FROM live l WHERE l.status = 'leased' GROUP BY 1
  ), k AS (
    SELECT u.kind, count(*) AS workers, sum(w.max_concurrency) AS slots,
           sum(greatest(w.max_concurrency - coalesce(h.n, 0), 0)) AS free
      FROM awp.workers w LEFT JOIN held h ON h.worker_id = w.worker_id
     CROSS JOIN LATERAL unnest(w.executor_kinds) AS u(kind)
     WHERE w.status = 'active'
     GROUP BY u.kind
  ), d AS (
    SELECT l.executor_kind AS kind, count(*) FILTER (WHERE l.status = 'pending') AS pending,
           count(*) FILTER (WHERE l.status = 'leased') AS leased
      FROM live l GROUP BY 1
  )
  SELECT coalesce(k.kind, d.kind), coalesce(k.workers, 0)::integer, coalesce(k.slots, 0)::integer,
         coalesce(k.free, 0)::integer, coalesce(d.pending, 0)::integer, coalesce(d.leased, 0)::integer
    FROM k FULL JOIN d ON d.kind = k.kind
   ORDER BY 1
$$;
COMMENT ON FUNCTION awp._kind_capacity() IS 'Per executor kind: active workers, slots, free slots, pending and leased dispatches.';

-- awp._task_waits(run_id): one row per waiting task of a live run, in definition order: its status,
-- reason code (see the top of this file), a one-line detail for people, and waiting_on (the
-- dependencies not yet succeeded, for waiting_dependencies; NULL otherwise). No rows for a finished
-- or unknown run. p_details false leaves detail NULL (cheaper, for counts). Locks: none.
CREATE OR REPLACE FUNCTION awp._task_waits(p_run_id text, p_details boolean DEFAULT true)
RETURNS TABLE (task_key text, status text, reason text, detail text, waiting_on text[])
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$   -- JIT would cost ~1 s on a 10,000-task run
#variable_conflict use_column
DECLARE
  r          awp.runs;
  b          record;
  v_limit    integer;
  v_tick     timestamptz;
  v_now      timestamptz := awp._now();
  v_inflight integer;
  v_room     integer;
  v_maxrank  integer := 0;
  v_cut      integer;   -- the definition order (ordinal) of the run's last candidate
  v_cap      integer;
  v_stale    text := '';
  v_lists    boolean;   -- some active worker lists its actions (routing by action): only then is a task's looked at
BEGIN
  SELECT * INTO r FROM awp.runs x WHERE x.run_id = p_run_id;
  IF NOT FOUND OR r.status NOT IN ('pending', 'running') THEN
    RETURN;
  END IF;
  b := awp._dispatch_budget();
  v_lists := EXISTS (SELECT 1 FROM awp.workers w WHERE w.status = 'active' AND w.actions IS NOT NULL);
  SELECT s.dispatch_limit, s.last_tick_at INTO v_limit, v_tick FROM awp.settings s;
  SELECT count(*)::integer INTO v_inflight FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.status IN ('queued', 'running');
  v_room := r.concurrency - v_inflight;
  IF r.cancel_requested_at IS NULL AND v_room > 0 THEN
    SELECT count(*)::integer, max(x.ordinal) INTO v_maxrank, v_cut FROM (
      SELECT y.ordinal FROM awp.tasks y
       WHERE y.run_id = p_run_id AND y.status = 'ready' AND b.kinds ? y.executor AND y.limit_buckets IS NULL
       ORDER BY y.ordinal LIMIT v_room) x;
  END IF;
  -- Another run contributes at most this many candidates: enough to decide every comparison below.
  v_cap := greatest(1, least(v_maxrank, greatest(b.global_free,
                                                 (SELECT max(v.value::integer) FROM jsonb_each_text(b.kinds) v), 0) + 1));
  IF v_tick IS NULL OR v_tick < v_now - interval '10 s' THEN
    v_stale := '; no coordinator pass ' || CASE WHEN v_tick IS NULL THEN 'yet' ELSE 'since ' || awp._wait_ts(v_tick) END
               || ': is a gateway with its coordinator (awp serve) running?';
  END IF;

  -- Only the candidates a pass could take now (the run's first v_maxrank ready tasks, at most its room, and the
  -- other runs' candidates) are ranked and compared; every other waiting task's reason follows from its status and
  -- its place, and a ready task past the candidates waits for run_concurrency. The two sets are put together with
  -- UNION ALL, never joined, so no plan depends on how many tasks the statistics expect of a run. Measured on a live
  -- 10,000-task run (this machine in a slow phase): awp._run_wait_counts 80-125 -> 35-60 ms, awp.get_run 95-140
  -- -> 45-80 ms; ranking every waiting task had cost three sorts of all of them per read.
  RETURN QUERY
  WITH kc AS MATERIALIZED (
    SELECT * FROM awp._kind_capacity()
  ), mine AS MATERIALIZED (     -- the run's waiting tasks; cand: one of its candidates
    SELECT t.task_key, t.status, t.executor, t.ordinal, t.depends_on, t.attempts, t.max_attempts, t.ready_at,
           (b.kinds ? t.executor) AS offered,
           (NOT v_lists OR t.status NOT IN ('ready', 'queued') OR NOT b.kinds ? t.executor
            OR awp._action_served(t.executor, t.action)) AS served,
           coalesce(t.status = 'ready' AND b.kinds ? t.executor AND t.ordinal <= v_cut AND t.limit_buckets IS NULL,
                    false) AS cand
      FROM awp.tasks t
     WHERE t.run_id = p_run_id
       AND (t.status IN ('waiting_dependencies', 'waiting_retry', 'ready', 'queued')
            OR (t.status = 'running' AND t.executor IN ('signal', 'sleep')))   -- a wait without a worker
  ), others AS (                -- the other runs the coordinator could dispatch for, with their room
    SELECT x.run_id, x.last_dispatch_seq, x.created_at,
           x.concurrency - (SELECT count(*)::integer FROM awp.tasks y
                             WHERE y.run_id = x.run_id AND y.status IN ('queued', 'running')) AS room
      FROM awp.runs x
     WHERE v_maxrank > 0 AND x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL
       AND x.run_id <> p_run_id
       AND (SELECT y.ordinal FROM awp.tasks y WHERE y.run_id = x.run_id AND y.status = 'ready'
             ORDER BY y.ordinal LIMIT 1) IS NOT NULL
  ), everyone AS (              -- the candidates: the run's (ranked in the order _dispatch_one takes them), the others'
    SELECT true AS me, m.task_key, m.status, m.executor, m.ordinal, m.depends_on, m.attempts, m.max_attempts,
           m.ready_at, m.offered, m.served, row_number() OVER (ORDER BY m.ordinal) AS rnk, r.last_dispatch_seq AS seq,
           r.created_at AS cat, p_run_id AS rid
      FROM mine m
     WHERE m.cand
    UNION ALL
    SELECT false, NULL, NULL, c.executor, NULL, NULL, NULL, NULL, NULL, true, true, c.rnk, o.last_dispatch_seq,
           o.created_at, o.run_id
      FROM others o CROSS JOIN LATERAL (
        SELECT y.executor, row_number() OVER (ORDER BY y.ordinal) AS rnk
          FROM awp.tasks y
         WHERE y.run_id = o.run_id AND y.status = 'ready' AND b.kinds ? y.executor AND y.limit_buckets IS NULL
         ORDER BY y.ordinal LIMIT greatest(least(o.room, v_cap), 0)) c
  ), placed AS (                -- a pass takes candidates in rounds (rank), runs in fairness order within a round;
    SELECT p.task_key, p.status, p.executor, p.ordinal, p.depends_on, p.attempts, p.max_attempts, p.ready_at, p.offered,
           p.served, p.rnk, p.ahead_all, p.other_all, p.ahead_kind, p.other_kind
      FROM (                    -- then the run's other waiting tasks, which no pass takes now
      SELECT e.me, e.task_key, e.status, e.executor, e.ordinal, e.depends_on, e.attempts, e.max_attempts, e.ready_at,
             e.offered, e.served, e.rnk,
             count(*) OVER w_all AS ahead_all,
             count(*) FILTER (WHERE NOT e.me) OVER w_all AS other_all,
             count(*) OVER w_kind AS ahead_kind,
             count(*) FILTER (WHERE NOT e.me) OVER w_kind AS other_kind
        FROM everyone e
      WINDOW w_all AS (ORDER BY e.rnk, e.seq NULLS FIRST, e.cat, e.rid
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
             w_kind AS (PARTITION BY e.executor ORDER BY e.rnk, e.seq NULLS FIRST, e.cat, e.rid
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) p
     WHERE p.me
    UNION ALL
    SELECT m.task_key, m.status, m.executor, m.ordinal, m.depends_on, m.attempts, m.max_attempts, m.ready_at, m.offered,
           m.served, NULL, NULL, NULL, NULL, NULL
      FROM mine m
     WHERE NOT m.cand
  ), judged AS (
    SELECT p.*, coalesce((b.kinds->>p.executor)::integer, 0) AS kind_free, lim.buckets,
           CASE
             WHEN r.cancel_requested_at IS NOT NULL THEN 'cancel_requested'
             WHEN p.status = 'running' THEN CASE p.executor WHEN 'signal' THEN 'waiting_signal' ELSE 'sleeping' END
             WHEN p.status = 'waiting_dependencies' THEN 'waiting_dependencies'
             WHEN p.status = 'waiting_retry' THEN 'waiting_retry'
             WHEN p.executor = ANY (awp._database_kinds()) THEN 'run_concurrency'   -- a ready child-run task
             WHEN NOT p.offered THEN 'no_worker_for_executor'
             WHEN NOT p.served THEN 'no_worker_for_action'
             WHEN p.status = 'queued' THEN 'waiting_for_claim'
             WHEN lim.buckets IS NOT NULL THEN   -- a ready task with limits: never one of the candidates above
               CASE WHEN awp._buckets_hold(lim.buckets, v_now) IS NOT NULL THEN 'rate_limited'
                    WHEN v_inflight >= r.concurrency THEN 'run_concurrency'
                    WHEN b.global_free <= 0 THEN 'dispatch_limit'
                    WHEN least(coalesce((b.kinds->>p.executor)::integer, 0), b.worker_free) <= 0 THEN 'workers_full'
                    ELSE 'waiting_for_dispatch' END
             WHEN v_inflight >= r.concurrency OR p.rnk IS NULL THEN 'run_concurrency'   -- past the candidates
             -- Both capacity limits may hold it: the tighter one is named (the workers when equal).
             WHEN p.ahead_all >= b.global_free
                  AND (p.ahead_kind < least(coalesce((b.kinds->>p.executor)::integer, 0), b.worker_free)
                       OR b.global_free < least(coalesce((b.kinds->>p.executor)::integer, 0), b.worker_free))
               THEN CASE WHEN p.other_all > 0 THEN 'fairness' ELSE 'dispatch_limit' END
             WHEN p.ahead_kind >= least(coalesce((b.kinds->>p.executor)::integer, 0), b.worker_free)
               THEN CASE WHEN p.other_kind > 0 THEN 'fairness' ELSE 'workers_full' END
             ELSE 'waiting_for_dispatch'
           END AS code
      FROM placed p
      LEFT JOIN LATERAL (SELECT x.limit_buckets AS buckets FROM awp.tasks x   -- one probe per ready task
                          WHERE p.status = 'ready' AND x.run_id = p_run_id AND x.task_key = p.task_key LIMIT 1) lim
        ON true
  )
  SELECT j.task_key, j.status, j.code,
         CASE WHEN NOT p_details THEN NULL ELSE CASE j.code
           WHEN 'waiting_dependencies' THEN
             CASE WHEN coalesce(dp.n, 0) = 0   -- a for_each task whose instances run (docs/dynamic.md)
               THEN (SELECT format('waiting for its %s instances (for_each over %s): %s of them not yet succeeded',
                                   x.item_count, x.for_each, x.pending_deps)
                       FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = j.task_key)
               ELSE format('waiting for %s of its %s dependencies: %s%s', dp.n, cardinality(j.depends_on), dp.listed,
                           CASE WHEN dp.n > 5 THEN format(' and %s more', dp.n - 5) ELSE '' END)
             END
           WHEN 'waiting_signal' THEN
             (SELECT format('waiting for a signal (awp.send_signal, POST /api/v1/runs/%s/tasks/%s/signal)%s', p_run_id,
                            j.task_key, CASE WHEN x.wait_until IS NULL THEN ''   -- no timeout
                                             ELSE format('; without one it times out at %s (in %s)', awp._wait_ts(x.wait_until),
                                                         awp._wait_secs(greatest(x.wait_until - v_now, interval '0'))) END)
                FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = j.task_key)
           WHEN 'sleeping' THEN
             (SELECT format('sleeping until %s (in %s)', awp._wait_ts(x.wait_until),
                            awp._wait_secs(greatest(x.wait_until - v_now, interval '0')))
                FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = j.task_key)
           WHEN 'waiting_retry' THEN
             CASE WHEN j.ready_at > v_now
               THEN format('attempt %s of %s failed; the retry is ready at %s (in %s)', j.attempts, j.max_attempts,
                           awp._wait_ts(j.ready_at), awp._wait_secs(j.ready_at - v_now))
               ELSE format('attempt %s of %s failed; the retry was due at %s: the next coordinator pass makes it ready%s',
                           j.attempts, j.max_attempts, awp._wait_ts(j.ready_at), v_stale)
             END
           WHEN 'rate_limited' THEN awp._buckets_hold(j.buckets, v_now)
           WHEN 'cancel_requested' THEN
             format('the run''s cancellation was requested at %s: this task will be canceled, not run',
                    awp._wait_ts(r.cancel_requested_at))
           WHEN 'no_worker_for_executor' THEN
             format('no active worker offers executor %s: the task waits until one registers%s', j.executor,
                    CASE WHEN j.status = 'queued' THEN ' (its dispatch is withdrawn by the next coordinator pass)' ELSE '' END)
           WHEN 'no_worker_for_action' THEN
             (SELECT format('no active worker runs action %s of executor %s (workers offering %s list their actions and'
                            ' this one is not among them: start one with a handler for it): the task waits until one'
                            ' registers%s', x.action, j.executor, j.executor,
                            CASE WHEN j.status = 'queued' THEN ' (its dispatch is withdrawn by the next coordinator pass)'
                                 ELSE '' END)
                FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = j.task_key)
           WHEN 'waiting_for_claim' THEN
             format('dispatched %s ago; waiting for a worker offering executor %s to claim it (%s)',
                    awp._wait_secs(v_now - dsp.created_at), j.executor,
                    CASE WHEN kc.free_slots > 0 THEN format('%s free slot(s) on %s active worker(s)', kc.free_slots, kc.workers)
                         ELSE format('all %s slot(s) of %s active worker(s) are busy', kc.slots, kc.workers) END)
           WHEN 'run_concurrency' THEN
             CASE WHEN v_inflight >= r.concurrency
               THEN format('the run''s concurrency is %s and %s of its tasks are queued or running', r.concurrency, v_inflight)
               ELSE format('the run''s concurrency is %s with %s of its tasks queued or running: the %s place(s) left go to its tasks before this one',
                           r.concurrency, v_inflight, v_room)
             END
           WHEN 'dispatch_limit' THEN
             CASE WHEN b.global_free <= 0
               THEN format('the global dispatch_limit %s is reached: %s dispatches are pending or leased', v_limit, v_limit - b.global_free)
               ELSE format('the global dispatch_limit %s allows %s more dispatch(es), which go to tasks before this one', v_limit, b.global_free)
             END
           WHEN 'workers_full' THEN
             format('every active worker offering executor %s is busy: %s of %s slot(s) on %s worker(s) leased, %s dispatch(es) pending%s',
                    j.executor, kc.slots - kc.free_slots, kc.slots, kc.workers, kc.pending,
                    CASE WHEN least(j.kind_free, b.worker_free) > 0
                         THEN format('; the %s slot(s) left go to tasks before this one', least(j.kind_free, b.worker_free)) ELSE '' END)
           WHEN 'fairness' THEN
             format('queued behind other runs: %s task(s) of other runs come first in the fair order, and %s',
                    CASE WHEN j.other_kind > 0 THEN j.other_kind ELSE j.other_all END,
                    CASE WHEN j.ahead_all >= b.global_free AND b.global_free < least(j.kind_free, b.worker_free)
                      THEN CASE WHEN b.global_free <= 0 THEN format('the global dispatch_limit %s is reached', v_limit)
                                ELSE format('the global dispatch_limit %s allows %s more', v_limit, b.global_free) END
                      ELSE CASE WHEN least(j.kind_free, b.worker_free) <= 0
                                THEN format('every active worker offering executor %s is busy (%s slot(s))', j.executor, kc.slots)
                                ELSE format('workers offering executor %s have %s slot(s) left', j.executor, least(j.kind_free, b.worker_free)) END
                    END)
           WHEN 'waiting_for_dispatch' THEN
             'nothing holds it: the next coordinator pass dispatches it' || v_stale
         END END,
         CASE WHEN j.code = 'waiting_dependencies' THEN dp.keys END
    FROM judged j
    LEFT JOIN kc ON p_details AND kc.executor_kind = j.executor
    LEFT JOIN LATERAL (
      SELECT array_agg(y.task_key ORDER BY y.ordinal) AS keys, count(*) AS n,
             string_agg(y.task_key || ' (' || replace(y.status, '_', ' ') || ')', ', ' ORDER BY y.ordinal)
               FILTER (WHERE y.n <= 5) AS listed
        -- One primary-key probe per dependency (LIMIT 1 keeps the subquery a probe, not a join the planner may
        -- turn around): never a scan of the run's tasks per waiting task. In a database of many small runs
        -- the planner expects a handful of tasks per run and scanned the run instead: 10,000 x 10,000 rows,
        -- 12 s, for a 10,000-task fan-in (python/tests/ui/test_ui.py, after the rest of the suite).
        FROM (SELECT z.task_key, z.status, z.ordinal, row_number() OVER (ORDER BY z.ordinal) AS n
                FROM unnest(j.depends_on) AS k(task_key)
                CROSS JOIN LATERAL (SELECT x.task_key, x.status, x.ordinal FROM awp.tasks x
                                     WHERE x.run_id = p_run_id AND x.task_key = k.task_key LIMIT 1) z
               WHERE z.status <> 'succeeded') y
       WHERE j.status = 'waiting_dependencies') dp ON true   -- waiting_on is given without details too
    LEFT JOIN LATERAL (
      SELECT d.created_at FROM awp.dispatches d
       WHERE p_details AND j.status = 'queued' AND d.run_id = p_run_id AND d.task_key = j.task_key AND d.status = 'pending') dsp ON true
   ORDER BY j.ordinal;
END $$;
COMMENT ON FUNCTION awp._task_waits(text, boolean) IS 'Why each waiting task of a run waits: one reason code and a detail per task (detail NULL unless p_details).';

-- awp.run_waits(run_id): the public read of awp._task_waits: one row per waiting task of the run
-- (none when it has finished), in definition order. AWNTF when unknown. Locks: none.
CREATE OR REPLACE FUNCTION awp.run_waits(p_run_id text)
RETURNS TABLE (task_key text, status text, reason text, detail text, waiting_on text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._require_run(p_run_id);
  RETURN QUERY SELECT * FROM awp._task_waits(p_run_id);
END $$;
COMMENT ON FUNCTION awp.run_waits(text) IS 'Why each waiting task of a run waits (reason code, detail, dependencies); AWNTF when unknown.';

-- awp._run_wait_counts(run_id): the run's waiting tasks by reason code, e.g. {"workers_full": 1800}
-- ({} when none waits).
CREATE OR REPLACE FUNCTION awp._run_wait_counts(p_run_id text) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(jsonb_object_agg(w.reason, w.n), '{}')
    FROM (SELECT x.reason, count(*) AS n FROM awp._task_waits(p_run_id, false) x GROUP BY 1) w
$$;
COMMENT ON FUNCTION awp._run_wait_counts(text) IS 'A run''s waiting tasks counted by reason code.';

-- awp._limits_held(): after a coordinator pass, the limits that still hold ready tasks back, as
-- sorted codes: no_worker_for_executor, no_worker_for_action, run_concurrency, dispatch_limit, workers_full: for each live
-- run, the limit that holds its next ready task (the first in definition order; a run's later tasks of
-- another kind are not looked at). Per live run with a ready task, one index probe and its in-flight count, plus
-- one budget: about 8 us a run (awp.coordinator_tick asks for it only every few seconds). Locks: none.
CREATE OR REPLACE FUNCTION awp._limits_held() RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET jit = off AS $$
  WITH b AS MATERIALIZED (   -- computed only when some run has a ready task (first use of the InitPlans below)
    SELECT x.global_free, x.worker_free, x.kinds,
           EXISTS (SELECT 1 FROM awp.workers w WHERE w.status = 'active' AND w.actions IS NOT NULL) AS lists
      FROM awp._dispatch_budget() x
  )
  SELECT coalesce(array_agg(DISTINCT c.code ORDER BY c.code) FILTER (WHERE c.code IS NOT NULL), '{}')
    FROM (
      SELECT CASE
               WHEN NOT (SELECT b.kinds FROM b) ? q.kind AND q.kind <> ALL (awp._database_kinds()) THEN 'no_worker_for_executor'
               WHEN q.kind <> ALL (awp._database_kinds()) AND (SELECT b.lists FROM b)
                    AND NOT awp._action_served(q.kind, q.action) THEN 'no_worker_for_action'
               WHEN q.concurrency <= (SELECT count(*) FROM awp.tasks y
                                       WHERE y.run_id = q.run_id AND y.status IN ('queued', 'running')) THEN 'run_concurrency'
               WHEN (SELECT b.global_free FROM b) <= 0 THEN 'dispatch_limit'
               WHEN (SELECT b.worker_free FROM b) <= 0
                    OR (coalesce(((SELECT b.kinds FROM b)->>q.kind)::integer, 0) <= 0
                        AND q.kind <> ALL (awp._database_kinds())) THEN 'workers_full'
             END AS code
        FROM (SELECT x.run_id, x.concurrency, f.kind, f.action
                FROM awp.runs x
                LEFT JOIN LATERAL (SELECT y.executor AS kind, y.action FROM awp.tasks y
                                    WHERE y.run_id = x.run_id AND y.status = 'ready' ORDER BY y.ordinal LIMIT 1) f ON true
               WHERE x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL) q
       WHERE q.kind IS NOT NULL) c
$$;
COMMENT ON FUNCTION awp._limits_held() IS 'The limits that hold ready tasks back right now (for the coordinator''s pass counts).';

-- awp.executor_stats(): per executor kind (offered by an active worker, named by a live dispatch,
-- or of a ready task): {"workers", "slots", "free_slots", "pending", "leased", "ready"} as jsonb,
-- for /metrics and `awp status`. Live rows only. Locks: none.
CREATE OR REPLACE FUNCTION awp.executor_stats() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH kc AS (SELECT * FROM awp._kind_capacity()),
  ready AS (
    SELECT t.executor AS kind, count(*) AS n FROM awp.tasks t
     WHERE t.status = 'ready' AND t.run_id IN (SELECT x.run_id FROM awp.runs x WHERE x.status IN ('pending', 'running'))
     GROUP BY 1
  )
  SELECT coalesce(jsonb_object_agg(coalesce(kc.executor_kind, ready.kind), jsonb_build_object(
           'workers', coalesce(kc.workers, 0), 'slots', coalesce(kc.slots, 0), 'free_slots', coalesce(kc.free_slots, 0),
           'pending', coalesce(kc.pending, 0), 'leased', coalesce(kc.leased, 0), 'ready', coalesce(ready.n, 0))), '{}')
    FROM kc FULL JOIN ready ON ready.kind = kc.executor_kind
$$;
COMMENT ON FUNCTION awp.executor_stats() IS 'Per executor kind: active workers, slots, free slots, pending and leased dispatches, ready tasks.';

-- awp.cluster_status(): one screen of the cluster for `awp status` and GET /api/v1/status:
-- {"dispatch_limit", "dispatches": {"pending", "leased"}, "workers": {"active", "draining"},
--  "runs": {"pending", "running"}, "executors": awp.executor_stats(), "last_tick_at",
--  "oldest_waiting": {run_id, task_key, status, executor, since, reason, detail} or null}.
-- The oldest waiting task is the ready or queued task of a live run that has been so the longest.
-- Live rows only. Locks: none.
CREATE OR REPLACE FUNCTION awp.cluster_status() RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s      awp.settings := awp._settings();
  o      record;
  w      record;
  v_wait jsonb;
BEGIN
  SELECT t.run_id, t.task_key, t.status, t.executor, t.updated_at INTO o
    FROM (SELECT y.run_id, y.task_key, y.status, y.executor, y.updated_at, y.ordinal    -- each arm on its
            FROM awp.tasks y WHERE y.status = 'ready'                                  -- partial index
          UNION ALL
          SELECT y.run_id, y.task_key, y.status, y.executor, y.updated_at, y.ordinal
            FROM awp.tasks y WHERE y.status = 'queued') t
    JOIN awp.runs x ON x.run_id = t.run_id
   WHERE x.status IN ('pending', 'running')
   ORDER BY t.updated_at, t.run_id, t.ordinal
   LIMIT 1;
  IF FOUND THEN
    SELECT * INTO w FROM awp._task_waits(o.run_id) x WHERE x.task_key = o.task_key;
    v_wait := jsonb_build_object('run_id', o.run_id, 'task_key', o.task_key, 'status', o.status,
                                 'executor', o.executor, 'since', o.updated_at, 'reason', w.reason, 'detail', w.detail);
  END IF;
  RETURN jsonb_build_object(
    'dispatch_limit', s.dispatch_limit,
    'dispatches', jsonb_build_object(
      'pending', (SELECT count(*) FROM awp.dispatches d WHERE d.status = 'pending'),
      'leased', (SELECT count(*) FROM awp.dispatches d WHERE d.status = 'leased')),
    'workers', jsonb_build_object(
      'active', (SELECT count(*) FROM awp.workers x WHERE x.status = 'active'),
      'draining', (SELECT count(*) FROM awp.workers x WHERE x.status = 'draining')),
    'runs', jsonb_build_object(
      'pending', (SELECT count(*) FROM awp.runs x WHERE x.status = 'pending'),
      'running', (SELECT count(*) FROM awp.runs x WHERE x.status = 'running')),
    'executors', awp.executor_stats(),
    'last_tick_at', s.last_tick_at,
    'oldest_waiting', v_wait);
END $$;
COMMENT ON FUNCTION awp.cluster_status() IS 'A one-screen summary: workers and slots by kind, live dispatches vs dispatch_limit, the oldest waiting task and why.';
