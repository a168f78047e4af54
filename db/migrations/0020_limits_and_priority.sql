-- 0020_limits_and_priority: named rate limits and concurrency keys, and task priority (docs/limits.md,
-- Rate limits and concurrency keys; Priority; db/functions/_rate_limits.sql; AWP issue 40).
-- awp.limits: one row per named limit (awp.set_limit): max_in_flight (queued + running tasks holding it, i.e.
--   pending + leased dispatches), per_window / window_ms (attempt starts in any window of that length); either or both.
-- awp.limit_starts: the attempt starts of tasks holding a limit with a window, per bucket (a limit's name, or
--   name=key for a limit keyed by the run input), kept for the longest window and pruned by coordinator passes.
-- awp.tasks:
--   limit_buckets  the buckets the task holds while queued or running (NULL: none), from its definition's `limits`
--                  with each key_from read from the run input when the run started
--   priority       0..9 (default 5; a run started with a priority gives it to all its tasks): higher first
-- awp.runs.priority: the priority the run was started with (NULL: its tasks' own).
-- awp.ready_queue gains priority (a run has one row per kind and priority of its ready tasks), in its key and its
-- order, and holds tasks without limits only: tasks with limits are reached through their runs' other rows or
-- the coordinator's pass over tasks_ready_limited_idx (db/functions/_ready_queue.sql).

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.limits (
  name          text PRIMARY KEY,
  max_in_flight integer,
  per_window    integer,
  window_ms     integer,
  created_at    timestamptz NOT NULL,
  updated_at    timestamptz NOT NULL,
  CONSTRAINT limit_name_is_valid CHECK (name ~ '^[A-Za-z0-9_.:-]{1,64}$'),
  CONSTRAINT limit_has_a_rule CHECK (max_in_flight IS NOT NULL OR per_window IS NOT NULL),
  CONSTRAINT limit_numbers_positive CHECK (max_in_flight >= 1 AND per_window >= 1 AND window_ms >= 1),
  CONSTRAINT limit_window_whole CHECK ((per_window IS NULL) = (window_ms IS NULL))
);

CREATE TABLE awp.limit_starts (
  bucket     text NOT NULL,
  started_at timestamptz NOT NULL
);
CREATE INDEX limit_starts_bucket_idx ON awp.limit_starts (bucket, started_at);

ALTER TABLE awp.tasks
  ADD COLUMN limit_buckets text[],
  ADD COLUMN priority smallint NOT NULL DEFAULT 5,
  ADD CONSTRAINT task_priority_in_range CHECK (priority BETWEEN 0 AND 9),
  ADD CONSTRAINT task_limit_buckets_not_empty CHECK (cardinality(limit_buckets) > 0);
ALTER TABLE awp.runs
  ADD COLUMN priority smallint,
  ADD CONSTRAINT run_priority_in_range CHECK (priority BETWEEN 0 AND 9);

-- In flight per bucket (awp._limit_room): the queued and running tasks holding it.
CREATE INDEX tasks_limited_in_flight_idx ON awp.tasks USING gin (limit_buckets)
  WHERE status IN ('queued', 'running') AND limit_buckets IS NOT NULL;
-- The ready tasks with limits, for the coordinator's pass (awp._dispatch_limited) and the wait reasons.
CREATE INDEX tasks_ready_limited_idx ON awp.tasks (run_id, priority DESC, ordinal)
  WHERE status = 'ready' AND limit_buckets IS NOT NULL;
-- A run's ready tasks in the order a dispatch takes them: higher priority first, then definition order.
DROP INDEX awp.tasks_ready_idx;
CREATE INDEX tasks_ready_idx ON awp.tasks (run_id, priority DESC, ordinal) WHERE status = 'ready';

ALTER TABLE awp.ready_queue
  ADD COLUMN priority smallint NOT NULL DEFAULT 5,
  DROP CONSTRAINT ready_queue_pkey,
  ADD PRIMARY KEY (run_id, executor_kind, priority);
DROP INDEX awp.ready_queue_order_idx;
CREATE INDEX ready_queue_order_idx
  ON awp.ready_queue (executor_kind, priority DESC, last_dispatch_seq NULLS FIRST, created_at, run_id);

RESET ROLE;
