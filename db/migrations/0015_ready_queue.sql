-- 0015_ready_queue: awp.ready_queue, the runs that have a ready task, one row per (run, executor kind), in the
-- fairness order of docs/protocol.md (rule 9) per kind. awp._fairness_order reads it instead of walking every live
-- run and probing each for a ready task: with 1,000 runs holding 100 ready tasks of a kind no worker serves, that
-- walk read every one of them for each dispatch of another kind (measured 18-20 ms of backend time per completion
-- against 0.9 ms with the same runs absent; AWP issue 46). Kept by triggers on awp.tasks and awp.runs
-- (db/functions/_ready_queue.sql), which also rebuild it at every migrate; awp.check_invariants checks it
-- (ready_queue).
--   run_id, executor_kind  the run and the kind of its ready tasks; a row exists only while ready_tasks > 0
--   ready_tasks            how many of the run's tasks of that kind are ready
--   last_dispatch_seq, created_at   the run's (awp.runs), mirrored, so the index carries the whole order

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.ready_queue (
  run_id            text NOT NULL,
  executor_kind     text NOT NULL,
  ready_tasks       integer NOT NULL,
  last_dispatch_seq bigint,
  created_at        timestamptz NOT NULL,
  PRIMARY KEY (run_id, executor_kind),
  CONSTRAINT ready_queue_ready_tasks_positive CHECK (ready_tasks > 0)
);
CREATE INDEX ready_queue_order_idx
  ON awp.ready_queue (executor_kind, last_dispatch_seq NULLS FIRST, created_at, run_id);

-- runs_live_idx no longer needs the fairness order (0014): it lists the live runs oldest first (cancel_waiting_runs
-- and the passes read it so). Without last_dispatch_seq among its keys, the run row's update at each completion
-- (revision, sequences, counters, last_dispatch_seq) changes no indexed column and can be a HOT update, where it
-- added an entry to each of the run table's indexes (docs/performance.md, Where one run's throughput goes).
DROP INDEX awp.runs_live_idx;
CREATE INDEX runs_live_idx ON awp.runs (created_at, run_id) WHERE status IN ('pending', 'running');

RESET ROLE;
