-- 0017_waits_and_pacing: tasks that wait without a worker (executor `signal`: a signal from outside, e.g. a person's
-- approval; executor `sleep`: the database clock) and exponential backoff between retries (docs/waits.md;
-- db/functions/send_signal.sql).
-- awp.tasks:
--   wait_until        a running signal task's timeout (NULL: none), a running sleep task's end
--   backoff, max_interval_ms, jitter   the retry wait before attempt n+1: min(max_interval_ms, interval_ms x
--                     backoff^(n-1)), less a random part of up to jitter x that (backoff 1, jitter 0: as before)
-- awp.signals: the signals accepted, one per attempt of a signal task (its payload became the task's output), with
--   the sender's idempotency key: the same key with the same payload is answered as the first time.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.tasks
  ADD COLUMN wait_until timestamptz,
  ADD COLUMN backoff numeric NOT NULL DEFAULT 1,
  ADD COLUMN max_interval_ms integer,
  ADD COLUMN jitter numeric NOT NULL DEFAULT 0,
  ADD CONSTRAINT task_backoff_in_range
    CHECK (backoff BETWEEN 1 AND 10 AND jitter BETWEEN 0 AND 1
           AND (max_interval_ms IS NULL OR max_interval_ms BETWEEN 0 AND 86400000)),
  -- A task settled by the database has its output or error on its row: signal and sleep tasks too (0016).
  DROP CONSTRAINT task_settled_output_only_without_worker,
  ADD CONSTRAINT task_settled_output_only_without_worker
    CHECK ((output IS NULL AND error_code IS NULL AND error_message IS NULL) OR attempts = 0
           OR executor IN ('workflow', 'signal', 'sleep'));
-- The signal timeouts and sleeps a coordinator pass settles (awp._settle_waits).
CREATE INDEX tasks_wait_until_idx ON awp.tasks (wait_until) WHERE status = 'running' AND wait_until IS NOT NULL;

CREATE TABLE awp.signals (
  run_id          text NOT NULL REFERENCES awp.runs ON DELETE CASCADE,
  task_key        text NOT NULL,
  attempt         integer NOT NULL,
  idempotency_key text,
  payload         jsonb NOT NULL,
  payload_hash    bytea NOT NULL,
  received_at     timestamptz NOT NULL,
  PRIMARY KEY (run_id, task_key, attempt),
  CONSTRAINT signal_idempotency_key_length CHECK (length(idempotency_key) BETWEEN 1 AND 255)
);
CREATE UNIQUE INDEX signals_idempotency_uq ON awp.signals (run_id, task_key, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

RESET ROLE;
