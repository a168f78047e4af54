-- awp.check_invariants(run_ids): inspects the tables and returns one row per violated invariant,
-- with the offending ids; no row means every invariant holds. For DBAs and for the fault tests,
-- also while the system runs: it is one SQL statement, so it reads one snapshot.
-- Checks (docs/protocol.md, State machines and Rules):
--   run_tasks_terminal       a terminal run has only terminal tasks
--   unfinished_count         runs.unfinished_tasks equals the number of its tasks not terminal
--   final_task_counts        a terminal run's runs.final_task_counts equals its tasks' counts by status; a live
--                            run has none (migration 0011_final_task_counts)
--   one_success_per_task     at most one succeeded attempt per task, from the completed dispatch
--   attempt_dispatch_match   a settled-by-result attempt belongs to a completed dispatch; a running
--                            attempt to a leased one; a not_received one to an expired one; a leased
--                            dispatch has a running attempt
--   accepted_after_expiry    no result accepted at or after its lease expiry or attempt deadline
--   attempts_within_max      counted attempts per task <= max_attempts, tasks.attempts = attempts made and
--                            tasks.uncounted_attempts = attempts not counted (docs/protocol.md, Lease recovery)
--   started_before_deps      no attempt started before every dependency had succeeded
--   task_dispatch_match      queued <-> one pending dispatch; running <-> one leased dispatch (tasks run by workers)
--   database_task            a task of executor signal or sleep has no dispatch; a running sleep has its end
--                            (wait_until), a task not running none (docs/waits.md)
--   child_run                a task of executor workflow has no dispatch; running, its child_run_id names a run
--                            started by it (parent_run_id, parent_task_key), one level deeper (docs/dynamic.md)
--   events_contiguous        per-run event sequences are 1..n
--   events_match_status      each entity's last event names its current status
--   illegal_transition       every event is a transition allowed by docs/protocol.md, State machines
--   run_concurrency          queued + running tasks of a run <= its concurrency
--   worker_capacity          leases of a worker <= its max_concurrency
--   dispatch_limit           pending + leased dispatches <= dispatch_limit
--   for_each_instances       a mapped task (docs/dynamic.md) has item_count instances "<key>[0..n-1]" (none before it
--                            is expanded); while it waits its pending_deps counts those not succeeded; succeeded,
--                            all of them succeeded
--   ready_queue              awp.ready_queue has one row per (run, executor kind, priority) with ready tasks without
--                            limits, holding their count and the run's last_dispatch_seq and created_at, and no
--                            other row (migrations 0015_ready_queue, 0020_limits_and_priority)
--   rate_limit               a limit's bucket has at most max_in_flight queued + running tasks, counting only when
--                            all of them were dispatched after the limit was last set (lowering a limit withdraws
--                            nothing); a task with limits that is running has its start in awp.limit_starts while
--                            its limit's window counts it (docs/limits.md)
--   orphan_row               every task, dispatch, event, signal, progress row, log line and output counter belongs
--                            to a run (a dispatch to a task): no foreign keys hold it since migration 0023
--   history_partitions       each time range of awp.history_partitions has its partition in each of the eight
--                            partitioned tables, with the range's bounds, and no other time partition exists
--                            (db/functions/_partitions.sql)
-- Takes no locks; raises nothing.

-- awp.transitions(): every allowed (entity_type, from_status, to_status); from NULL = creation.
-- The one list of the state machines of docs/protocol.md, State machines (plus the run's "cancel requested" note,
-- which keeps its status).
CREATE OR REPLACE FUNCTION awp.transitions()
RETURNS TABLE (entity_type text, from_status text, to_status text)
LANGUAGE sql IMMUTABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  VALUES ('run', NULL, 'pending'), ('run', 'pending', 'running'), ('run', 'pending', 'canceled'),
         ('run', 'running', 'succeeded'), ('run', 'running', 'failed'), ('run', 'running', 'canceled'),
         ('run', 'pending', 'pending'), ('run', 'running', 'running'),
         ('task', NULL, 'ready'), ('task', NULL, 'waiting_dependencies'),
         ('task', 'waiting_dependencies', 'ready'), ('task', 'waiting_dependencies', 'canceled'),
         ('task', 'waiting_dependencies', 'skipped'),
         ('task', 'waiting_dependencies', 'succeeded'), ('task', 'waiting_dependencies', 'failed'),
         ('task', 'ready', 'queued'), ('task', 'ready', 'canceled'), ('task', 'ready', 'skipped'),
         ('task', 'ready', 'running'),
         -- a re-run (awp.retry_run): a task settled waits again, its run runs again
         ('task', 'failed', 'ready'), ('task', 'failed', 'waiting_dependencies'),
         ('task', 'canceled', 'ready'), ('task', 'canceled', 'waiting_dependencies'),
         ('task', 'skipped', 'ready'), ('task', 'skipped', 'waiting_dependencies'),
         ('task', 'succeeded', 'ready'), ('task', 'succeeded', 'waiting_dependencies'),
         ('run', 'failed', 'running'), ('run', 'canceled', 'running'),
         ('task', 'queued', 'running'), ('task', 'queued', 'ready'), ('task', 'queued', 'canceled'),
         ('task', 'running', 'succeeded'), ('task', 'running', 'waiting_retry'),
         ('task', 'running', 'failed'), ('task', 'running', 'canceled'),
         ('task', 'waiting_retry', 'ready'), ('task', 'waiting_retry', 'failed'),
         ('task', 'waiting_retry', 'canceled'),
         ('attempt', NULL, 'running'), ('attempt', 'running', 'succeeded'), ('attempt', 'running', 'failed'),
         ('attempt', 'running', 'timed_out'), ('attempt', 'running', 'interrupted'),
         ('attempt', 'running', 'canceled'), ('attempt', 'running', 'not_received'),
         ('dispatch', NULL, 'pending'), ('dispatch', 'pending', 'leased'), ('dispatch', 'pending', 'canceled'),
         ('dispatch', 'leased', 'completed'), ('dispatch', 'leased', 'expired'), ('dispatch', 'leased', 'canceled')
$$;
COMMENT ON FUNCTION awp.transitions() IS 'The allowed state transitions of runs, tasks, attempts and dispatches (docs/protocol.md, State machines).';

CREATE OR REPLACE FUNCTION awp.check_invariants(p_run_ids text[] DEFAULT NULL)
RETURNS TABLE (invariant text, run_id text, entity_key text, detail text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH runs AS (
    SELECT r.* FROM awp.runs r WHERE p_run_ids IS NULL OR r.run_id = ANY (p_run_ids)
  ), tasks AS (
    SELECT t.* FROM awp.tasks t JOIN runs r USING (run_id)
  ), attempts AS (
    SELECT a.* FROM awp.attempts a JOIN runs r USING (run_id)
  ), dispatches AS (
    SELECT d.* FROM awp.dispatches d JOIN runs r USING (run_id)
  ), events AS (
    SELECT e.* FROM awp.events e JOIN runs r USING (run_id)
  ), last_events AS (
    SELECT DISTINCT ON (e.run_id, e.entity_type, e.entity_key)
           e.run_id, e.entity_type, e.entity_key, e.to_status
      FROM events e
     ORDER BY e.run_id, e.entity_type, e.entity_key, e.sequence DESC
  ), current AS (
    SELECT r.run_id, 'run' AS entity_type, r.run_id AS entity_key, r.status FROM runs r
    UNION ALL SELECT t.run_id, 'task', t.task_key, t.status FROM tasks t
    UNION ALL SELECT a.run_id, 'attempt', a.task_key || '#' || a.attempt, a.status FROM attempts a
    UNION ALL SELECT d.run_id, 'dispatch', d.dispatch_id, d.status FROM dispatches d
  )
  SELECT 'run_tasks_terminal', t.run_id, t.task_key, format('run is %s, task is %s', r.status, t.status)
    FROM runs r JOIN tasks t USING (run_id)
   WHERE r.status IN ('succeeded', 'failed', 'canceled')
     AND t.status NOT IN ('succeeded', 'failed', 'canceled', 'skipped')
  UNION ALL
  SELECT 'unfinished_count', r.run_id, NULL,
         format('runs.unfinished_tasks = %s, tasks not terminal = %s', r.unfinished_tasks, coalesce(u.n, 0))
    FROM runs r
    -- counted once for all runs (a count per run scanned the whole tasks CTE each time: 8.9 s at 10,000 runs)
    LEFT JOIN (SELECT t.run_id, count(*) AS n FROM tasks t
                WHERE t.status NOT IN ('succeeded', 'failed', 'canceled', 'skipped')
                GROUP BY t.run_id) u ON u.run_id = r.run_id
   WHERE r.unfinished_tasks <> coalesce(u.n, 0)
  UNION ALL
  SELECT 'final_task_counts', r.run_id, NULL,
         format('run is %s, runs.final_task_counts = %s, tasks counted = %s', r.status,
                coalesce(r.final_task_counts::text, 'NULL'), awp._task_counts(r.run_id))
    FROM runs r
   WHERE CASE WHEN r.status IN ('succeeded', 'failed', 'canceled')
              THEN r.final_task_counts IS DISTINCT FROM awp._task_counts(r.run_id)
              ELSE r.final_task_counts IS NOT NULL END
  UNION ALL
  SELECT 'one_success_per_task', a.run_id, a.task_key, format('%s succeeded attempts', count(*))
    FROM attempts a WHERE a.status = 'succeeded' GROUP BY a.run_id, a.task_key HAVING count(*) > 1
  UNION ALL
  SELECT 'attempt_dispatch_match', a.run_id, a.task_key || '#' || a.attempt,
         format('attempt %s but dispatch %s is %s', a.status, d.dispatch_id, coalesce(d.status, 'missing'))
    FROM attempts a LEFT JOIN dispatches d ON d.dispatch_id = a.dispatch_id
   WHERE d.dispatch_id IS NULL
      OR (a.status IN ('succeeded', 'failed') AND d.status <> 'completed')
      OR (a.status = 'running' AND d.status <> 'leased')
      OR (a.status = 'not_received' AND d.status <> 'expired')
      OR (d.status = 'completed' AND a.status NOT IN ('succeeded', 'failed'))
      OR a.attempt <> d.attempt OR a.worker_id <> d.worker_id
  UNION ALL
  SELECT 'attempt_dispatch_match', d.run_id, d.dispatch_id, 'leased dispatch without a running attempt'
    FROM dispatches d
   WHERE d.status = 'leased'
     AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.dispatch_id = d.dispatch_id AND a.status = 'running')
  UNION ALL
  SELECT 'accepted_after_expiry', d.run_id, d.dispatch_id,
         format('completed at %s, lease expired %s, deadline %s', d.finished_at, d.lease_expires_at, d.attempt_deadline)
    FROM dispatches d
   WHERE d.status = 'completed' AND (d.finished_at >= d.lease_expires_at OR d.finished_at >= d.attempt_deadline)
  UNION ALL
  SELECT 'attempts_within_max', t.run_id, t.task_key,
         format('%s attempts made (%s not counted), tasks.attempts = %s (%s not counted), max_attempts = %s',
                count(a.*), count(a.*) FILTER (WHERE NOT a.counted), t.attempts, t.uncounted_attempts, t.max_attempts)
    FROM tasks t LEFT JOIN attempts a ON a.run_id = t.run_id AND a.task_key = t.task_key
   GROUP BY t.run_id, t.task_key, t.attempts, t.uncounted_attempts, t.max_attempts, t.executor
  HAVING count(a.*) FILTER (WHERE a.counted) > t.max_attempts
      OR (count(a.*) <> t.attempts AND t.executor <> ALL (awp._database_kinds()))   -- run by the database: no attempt rows
      OR count(a.*) FILTER (WHERE NOT a.counted) <> t.uncounted_attempts
  UNION ALL
  SELECT 'started_before_deps', a.run_id, a.task_key || '#' || a.attempt, format('dependency %s', dep)
    FROM attempts a JOIN tasks t ON t.run_id = a.run_id AND t.task_key = a.task_key,
         unnest(t.depends_on) dep
   WHERE NOT EXISTS (SELECT 1 FROM attempts x
                      WHERE x.run_id = a.run_id AND x.task_key = dep AND x.status = 'succeeded'
                        AND x.finished_at <= a.started_at)
     AND NOT EXISTS (SELECT 1 FROM tasks y   -- done without an attempt: a mapped task, a condition skip
                      WHERE y.run_id = a.run_id AND y.task_key = dep AND y.finished_at <= a.started_at
                        AND ((y.status = 'succeeded' AND (y.attempts = 0 OR y.executor = ANY (awp._database_kinds())))
                             OR y.skip_reason = 'condition_false'))
  UNION ALL
  SELECT 'task_dispatch_match', t.run_id, t.task_key,
         format('task %s with %s pending and %s leased dispatches', t.status,
                count(d.*) FILTER (WHERE d.status = 'pending'), count(d.*) FILTER (WHERE d.status = 'leased'))
    FROM tasks t LEFT JOIN dispatches d
      ON d.run_id = t.run_id AND d.task_key = t.task_key AND d.status IN ('pending', 'leased')
   WHERE t.executor <> ALL (awp._database_kinds())   -- run by the database: database_task below
   GROUP BY t.run_id, t.task_key, t.status
  HAVING count(d.*) FILTER (WHERE d.status = 'pending') <> (t.status = 'queued')::integer
      OR count(d.*) FILTER (WHERE d.status = 'leased') <> (t.status = 'running')::integer
  UNION ALL
  SELECT 'events_contiguous', e.run_id, NULL, format('%s events, sequences %s..%s', count(*), min(e.sequence), max(e.sequence))
    FROM events e GROUP BY e.run_id HAVING count(*) <> max(e.sequence) OR min(e.sequence) <> 1
  UNION ALL
  SELECT 'events_match_status', c.run_id, c.entity_type || ' ' || c.entity_key,
         format('status %s, last event says %s', c.status, coalesce(l.to_status, 'nothing'))
    FROM current c LEFT JOIN last_events l USING (run_id, entity_type, entity_key)
   WHERE l.to_status IS DISTINCT FROM c.status
  UNION ALL
  SELECT 'illegal_transition', e.run_id, e.entity_type || ' ' || e.entity_key,
         format('event %s: %s -> %s', e.sequence, coalesce(e.from_status, 'created'), e.to_status)
    FROM events e
   WHERE NOT EXISTS (SELECT 1 FROM awp.transitions() x
                      WHERE x.entity_type = e.entity_type AND x.from_status IS NOT DISTINCT FROM e.from_status
                        AND x.to_status = e.to_status)
  UNION ALL
  SELECT 'run_concurrency', r.run_id, NULL, format('%s queued + running > concurrency %s', count(*), r.concurrency)
    FROM runs r JOIN tasks t ON t.run_id = r.run_id AND t.status IN ('queued', 'running')
   GROUP BY r.run_id, r.concurrency HAVING count(*) > r.concurrency
  UNION ALL
  SELECT 'worker_capacity', NULL, w.worker_id, format('%s leases > max_concurrency %s', count(*), w.max_concurrency)
    FROM awp.workers w JOIN awp.dispatches d ON d.worker_id = w.worker_id AND d.status = 'leased'
   GROUP BY w.worker_id, w.max_concurrency HAVING count(*) > w.max_concurrency
  UNION ALL
  SELECT 'dispatch_limit', NULL, NULL, format('%s pending + leased > dispatch_limit %s', count(*), s.dispatch_limit)
    FROM awp.dispatches d, awp.settings s
   WHERE d.status IN ('pending', 'leased')
   GROUP BY s.dispatch_limit HAVING count(*) > s.dispatch_limit
  UNION ALL
  SELECT 'database_task', t.run_id, t.task_key,
         format('task %s of executor %s: %s live dispatches, wait_until %s', t.status, t.executor, count(d.*),
                coalesce(t.wait_until::text, 'NULL'))
    FROM tasks t LEFT JOIN dispatches d ON d.run_id = t.run_id AND d.task_key = t.task_key
   WHERE t.executor IN ('signal', 'sleep')
   GROUP BY t.run_id, t.task_key, t.status, t.executor, t.wait_until
  HAVING count(d.*) > 0 OR (t.status = 'running' AND t.executor = 'sleep' AND t.wait_until IS NULL)
      OR (t.status <> 'running' AND t.wait_until IS NOT NULL)
  UNION ALL
  SELECT 'child_run', t.run_id, t.task_key,
         format('task %s, child_run_id %s: %s', t.status, coalesce(t.child_run_id, 'NULL'),
                CASE WHEN count(d.*) > 0 THEN format('%s live dispatches', count(d.*))
                     WHEN c.run_id IS NULL THEN 'no such run'
                     ELSE format('child run of %s / %s at depth %s (parent depth %s)', c.parent_run_id, c.parent_task_key,
                                 c.depth, p.depth) END)
    FROM tasks t JOIN runs p ON p.run_id = t.run_id
    LEFT JOIN awp.runs c ON c.run_id = t.child_run_id
    LEFT JOIN dispatches d ON d.run_id = t.run_id AND d.task_key = t.task_key
   WHERE t.executor = 'workflow'
   GROUP BY t.run_id, t.task_key, t.status, t.child_run_id, c.run_id, c.parent_run_id, c.parent_task_key, c.depth, p.depth
  HAVING count(d.*) > 0
      OR (t.status = 'running' AND (c.run_id IS NULL OR c.parent_run_id IS DISTINCT FROM t.run_id
                                    OR c.parent_task_key IS DISTINCT FROM t.task_key OR c.depth <> p.depth + 1))
  UNION ALL
  SELECT 'for_each_instances', m.run_id, m.task_key,
         format('mapped task %s, item_count %s, pending_deps %s: %s instances (indexes %s..%s), %s succeeded',
                m.status, m.item_count, m.pending_deps, count(i.*), min(i.item_index), max(i.item_index),
                count(*) FILTER (WHERE i.status = 'succeeded'))
    FROM tasks m LEFT JOIN tasks i ON i.run_id = m.run_id AND i.mapped_task = m.task_key
   WHERE m.for_each IS NOT NULL
   GROUP BY m.run_id, m.task_key, m.status, m.item_count, m.pending_deps
  HAVING count(i.*) <> coalesce(m.item_count, 0)
      OR (count(i.*) > 0 AND (min(i.item_index) <> 0 OR max(i.item_index) <> count(i.*) - 1
                              OR bool_or(i.task_key <> m.task_key || '[' || i.item_index || ']')))
      OR (m.status = 'waiting_dependencies' AND m.item_count IS NOT NULL
          AND m.pending_deps <> count(*) FILTER (WHERE i.status <> 'succeeded'))
      OR (m.status = 'succeeded' AND count(*) FILTER (WHERE i.status <> 'succeeded') > 0)
  UNION ALL
  SELECT 'ready_queue', coalesce(e.run_id, q.run_id), coalesce(e.executor_kind, q.executor_kind),
         format('priority %s: %s ready tasks (run seq %s, created %s); ready_queue row: %s', coalesce(e.priority, q.priority),
                coalesce(e.n, 0),
                coalesce(e.last_dispatch_seq::text, 'NULL'), e.created_at,
                coalesce(format('%s ready, seq %s, created %s', q.ready_tasks, coalesce(q.last_dispatch_seq::text, 'NULL'),
                                q.created_at), 'none'))
    FROM (SELECT t.run_id, t.executor AS executor_kind, t.priority, count(*) AS n, r.last_dispatch_seq, r.created_at
            FROM tasks t JOIN runs r USING (run_id) WHERE t.status = 'ready' AND t.limit_buckets IS NULL
           GROUP BY t.run_id, t.executor, t.priority, r.last_dispatch_seq, r.created_at) e
    FULL JOIN (SELECT q.* FROM awp.ready_queue q WHERE p_run_ids IS NULL OR q.run_id = ANY (p_run_ids)) q
      ON q.run_id = e.run_id AND q.executor_kind = e.executor_kind AND q.priority = e.priority
   WHERE e.n IS DISTINCT FROM q.ready_tasks::bigint OR e.last_dispatch_seq IS DISTINCT FROM q.last_dispatch_seq
      OR e.created_at IS DISTINCT FROM q.created_at
  UNION ALL
  SELECT 'rate_limit', NULL, f.bucket,
         format('%s queued or running tasks hold bucket %s, over max_in_flight %s (set at %s)', f.n, f.bucket,
                l.max_in_flight, l.updated_at)
    FROM (SELECT b.bucket, count(*) AS n, min(d.created_at) AS first_dispatched
            FROM awp.tasks t CROSS JOIN LATERAL unnest(t.limit_buckets) AS b(bucket)
            JOIN awp.dispatches d ON d.run_id = t.run_id AND d.task_key = t.task_key AND d.status IN ('pending', 'leased')
           WHERE t.status IN ('queued', 'running') AND t.limit_buckets IS NOT NULL
           GROUP BY b.bucket) f
    JOIN awp.limits l ON l.name = awp._bucket_limit(f.bucket)
   WHERE p_run_ids IS NULL AND f.n > l.max_in_flight AND f.first_dispatched >= l.updated_at
  UNION ALL
  SELECT 'rate_limit', t.run_id, t.task_key,
         format('running since %s with bucket %s of a limit with a %s ms window, but no start recorded', d.leased_at,
                b.bucket, l.window_ms)
    FROM tasks t CROSS JOIN LATERAL unnest(t.limit_buckets) AS b(bucket)
    JOIN awp.dispatches d ON d.run_id = t.run_id AND d.task_key = t.task_key AND d.status = 'leased'
    JOIN awp.limits l ON l.name = awp._bucket_limit(b.bucket) AND l.window_ms IS NOT NULL
   WHERE t.status = 'running' AND t.limit_buckets IS NOT NULL
     AND d.leased_at > awp._now() - make_interval(secs => l.window_ms / 1000.0)
     AND NOT EXISTS (SELECT 1 FROM awp.limit_starts s WHERE s.bucket = b.bucket AND s.started_at = d.leased_at)
  UNION ALL
  -- No foreign keys between the run-scoped tables since they are partitioned (migration 0023): no row without its run
  -- (or, for a dispatch, its task).
  SELECT 'orphan_row', o.run_id, o.entity_key, o.detail
    FROM (SELECT t.run_id, t.task_key AS entity_key, 'a task of no run' AS detail FROM awp.tasks t
           WHERE NOT EXISTS (SELECT 1 FROM awp.runs r WHERE r.run_id = t.run_id)
          UNION ALL
          SELECT d.run_id, d.dispatch_id, 'a dispatch of no task' FROM awp.dispatches d
           WHERE NOT EXISTS (SELECT 1 FROM awp.tasks t WHERE t.run_id = d.run_id AND t.task_key = d.task_key)
          UNION ALL
          SELECT x.run_id, x.what, x.what || ' of no run'
            FROM (SELECT DISTINCT e.run_id, 'events' AS what FROM awp.events e
                  UNION SELECT g.run_id, 'a signal' FROM awp.signals g
                  UNION SELECT o.run_id, 'log lines or chunks' FROM awp.task_output o
                  UNION SELECT p.run_id, 'progress' FROM awp.task_progress p
                  UNION SELECT u.run_id, 'an output counter' FROM awp.run_outputs u) x
           WHERE NOT EXISTS (SELECT 1 FROM awp.runs r WHERE r.run_id = x.run_id)) o
   -- IN (SELECT unnest(...)), not = ANY: a hashed subplan. Each row of history is tested, and = ANY over a list
   -- of 1,000 runs compared each row with every element (5 s a call with 220,000 events, AWP issue 46's bench).
   WHERE p_run_ids IS NULL OR o.run_id IN (SELECT unnest(p_run_ids))
  UNION ALL
  -- Each time range of history has its partition in each of the eight tables, with the range's bounds, and no other
  -- partition has a time bound (db/functions/_partitions.sql).
  SELECT 'history_partitions', NULL, coalesce(h.suffix, p.suffix),
         CASE WHEN p.suffix IS NULL THEN format('range %s has no partition of awp.%s', h.suffix, h.tab)
              WHEN h.suffix IS NULL THEN format('partition %s is of no range of awp.history_partitions', p.relname)
              ELSE format('partition %s has bounds %s, not %s', p.relname, p.bound, h.bound) END
    FROM (SELECT x.suffix, t.tab, format('FOR VALUES FROM (%L) TO (%L)', awp._time_key(t.prefix, x.lower_ms),
                                         awp._time_key(t.prefix, x.upper_ms)) AS bound
            FROM awp.history_partitions x CROSS JOIN awp._history_tables() t) h
    FULL JOIN (SELECT c.relname, t.tab, substr(c.relname, length(t.tab) + 3) AS suffix,
                      pg_get_expr(c.relpartbound, c.oid) AS bound
                 FROM awp._history_tables() t
                 JOIN pg_inherits i ON i.inhparent = format('awp.%I', t.tab)::regclass
                 JOIN pg_class c ON c.oid = i.inhrelid
                WHERE c.relname NOT IN (t.tab || '_legacy', t.tab || '_default')) p
      ON p.tab = h.tab AND p.suffix = h.suffix
   WHERE p_run_ids IS NULL AND (p.suffix IS NULL OR h.suffix IS NULL OR p.bound <> h.bound)
$$;
COMMENT ON FUNCTION awp.check_invariants(text[]) IS 'Every violated invariant (one row each, with ids); empty when all hold. Optional run filter.';
