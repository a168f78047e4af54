-- awp.ready_queue (migrations 0015_ready_queue, 0020_limits_and_priority): the runs with a ready task without
-- limits, per executor kind and priority, in fairness order; read by awp._fairness_order. A ready task with limits
-- (docs/limits.md) is not in it: a full limit would keep its run in every refill's walk; awp._pick_limited reaches
-- those tasks. Kept by the triggers below in the transaction that changes a task's status or a
-- run's place in the fairness order, so every function that makes a task ready or takes it out of ready (start,
-- dependencies met, retry due, dispatch, lease recovery, skip, cancel, prune) keeps it without knowing it.
-- Every write of a run's rows happens while the caller holds that run's row lock (docs/architecture.md, Lock order: task
-- and run rows are changed only under it), so two transactions never write the same queue row at once and the
-- queue adds no lock order of its own.

-- awp._ready_queue_track(): trigger function on tasks.
--   tasks, row UPDATE OF status (WHEN the task enters or leaves ready) and row DELETE (WHEN it was ready):
--     +1 / -1 on the (run, kind, priority) row; the row is inserted at its first ready task (with the run's place in
--     the fairness order) and deleted when its last one leaves. Tasks with limits: never (the triggers' WHEN).
--   tasks, statement INSERT (transition table `born`): +n per (run, kind, priority) of the ready tasks without
--     limits inserted (a run start inserts all its tasks in one statement).
--   tasks, TRUNCATE: the queue is emptied.
-- Locks: the run's queue rows (the caller holds the run's row).
CREATE OR REPLACE FUNCTION awp._ready_queue_track() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM awp.ready_queue;
  ELSIF TG_LEVEL = 'STATEMENT' THEN
    INSERT INTO awp.ready_queue AS q (run_id, executor_kind, priority, ready_tasks, last_dispatch_seq, created_at)
    SELECT b.run_id, b.executor, b.priority, b.n, r.last_dispatch_seq, r.created_at
      FROM (SELECT t.run_id, t.executor, t.priority, count(*)::integer AS n FROM born t
             WHERE t.status = 'ready' AND t.limit_buckets IS NULL GROUP BY 1, 2, 3) b
     CROSS JOIN LATERAL (SELECT x.last_dispatch_seq, x.created_at FROM awp.runs x WHERE x.run_id = b.run_id
                          OFFSET 0) r   -- OFFSET 0: probe each run by key, never hash every run (stale statistics)
    ON CONFLICT (run_id, executor_kind, priority) DO UPDATE SET ready_tasks = q.ready_tasks + excluded.ready_tasks;
  ELSIF TG_OP = 'UPDATE' AND NEW.status = 'ready' THEN
    INSERT INTO awp.ready_queue AS q (run_id, executor_kind, priority, ready_tasks, last_dispatch_seq, created_at)
    SELECT NEW.run_id, NEW.executor, NEW.priority, 1, r.last_dispatch_seq, r.created_at
      FROM awp.runs r WHERE r.run_id = NEW.run_id
    ON CONFLICT (run_id, executor_kind, priority) DO UPDATE SET ready_tasks = q.ready_tasks + 1;
  ELSE   -- OLD left ready (UPDATE) or went (DELETE)
    -- By the primary key, run first: kind and priority are compared with IS NOT DISTINCT FROM (the same rows: both
    -- are NOT NULL), which no index serves, so ready_queue_order_idx (kind, priority, ...) cannot be chosen. A plan
    -- made while the queue had no statistics read the kind's whole fairness order through it at every completion
    -- (63 buffers at 1,000 runs).
    UPDATE awp.ready_queue q SET ready_tasks = q.ready_tasks - 1
     WHERE q.run_id = OLD.run_id AND (q.executor_kind, q.priority) IS NOT DISTINCT FROM (OLD.executor, OLD.priority)
       AND q.ready_tasks > 1;
    IF NOT FOUND THEN
      DELETE FROM awp.ready_queue q
       WHERE q.run_id = OLD.run_id AND (q.executor_kind, q.priority) IS NOT DISTINCT FROM (OLD.executor, OLD.priority);
    END IF;
  END IF;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._ready_queue_track() IS 'Trigger on tasks: keeps awp.ready_queue (ready tasks per run and executor kind).';

-- awp._ready_queue_place(): trigger function on runs.
--   row UPDATE OF last_dispatch_seq (WHEN it changes): the run's queue rows follow its new place.
--   TRUNCATE: the queue is emptied.
-- Locks: the run's queue rows (the caller holds the run's row).
CREATE OR REPLACE FUNCTION awp._ready_queue_place() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM awp.ready_queue;
  ELSE
    UPDATE awp.ready_queue q SET last_dispatch_seq = NEW.last_dispatch_seq WHERE q.run_id = NEW.run_id;
  END IF;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._ready_queue_place() IS 'Trigger on runs: moves a run''s awp.ready_queue rows with its place in fairness order.';

-- The triggers, and the queue rebuilt from the tables in the same transaction: CREATE TRIGGER takes SHARE ROW
-- EXCLUSIVE on tasks and runs, so nothing changes between the rebuild and the triggers (every migrate re-does
-- this; it also repairs the queue after a manual change with triggers off).
DROP TRIGGER IF EXISTS tasks_ready_queue_upd ON awp.tasks;
DROP TRIGGER IF EXISTS tasks_ready_queue_ins ON awp.tasks;
DROP TRIGGER IF EXISTS tasks_ready_queue_del ON awp.tasks;
DROP TRIGGER IF EXISTS tasks_ready_queue_trunc ON awp.tasks;
DROP TRIGGER IF EXISTS runs_ready_queue_seq ON awp.runs;
DROP TRIGGER IF EXISTS runs_ready_queue_trunc ON awp.runs;
CREATE TRIGGER tasks_ready_queue_upd AFTER UPDATE OF status ON awp.tasks
  FOR EACH ROW WHEN ((OLD.status = 'ready') <> (NEW.status = 'ready') AND NEW.limit_buckets IS NULL)
  EXECUTE FUNCTION awp._ready_queue_track();
CREATE TRIGGER tasks_ready_queue_ins AFTER INSERT ON awp.tasks
  REFERENCING NEW TABLE AS born FOR EACH STATEMENT EXECUTE FUNCTION awp._ready_queue_track();
CREATE TRIGGER tasks_ready_queue_del AFTER DELETE ON awp.tasks
  FOR EACH ROW WHEN (OLD.status = 'ready' AND OLD.limit_buckets IS NULL) EXECUTE FUNCTION awp._ready_queue_track();
CREATE TRIGGER tasks_ready_queue_trunc AFTER TRUNCATE ON awp.tasks
  FOR EACH STATEMENT EXECUTE FUNCTION awp._ready_queue_track();
CREATE TRIGGER runs_ready_queue_seq AFTER UPDATE OF last_dispatch_seq ON awp.runs
  FOR EACH ROW WHEN (OLD.last_dispatch_seq IS DISTINCT FROM NEW.last_dispatch_seq)
  EXECUTE FUNCTION awp._ready_queue_place();
CREATE TRIGGER runs_ready_queue_trunc AFTER TRUNCATE ON awp.runs
  FOR EACH STATEMENT EXECUTE FUNCTION awp._ready_queue_place();

DELETE FROM awp.ready_queue;
INSERT INTO awp.ready_queue (run_id, executor_kind, priority, ready_tasks, last_dispatch_seq, created_at)
SELECT t.run_id, t.executor, t.priority, count(*), r.last_dispatch_seq, r.created_at
  FROM awp.tasks t JOIN awp.runs r ON r.run_id = t.run_id
 WHERE t.status = 'ready' AND t.limit_buckets IS NULL
 GROUP BY t.run_id, t.executor, t.priority, r.last_dispatch_seq, r.created_at;
