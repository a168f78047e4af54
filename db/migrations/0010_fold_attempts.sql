-- 0010_fold_attempts: an attempt is stored on its dispatch (AWP issue 11; docs/architecture.md, Lock order).
-- A dispatch and its attempt are one to one once the dispatch is leased: the lease starts attempt N of the
-- task, and the attempt ends when the lease does (completed, expired, canceled). Two tables meant two rows
-- inserted and updated per task, each with its own indexes, foreign-key checks and CHECK constraints. Measured
-- (backend CPU per completion with its refill, two databases alternating): -9% for grouped completions, -6%
-- for single ones. The attempt's own columns move onto awp.dispatches:
--   attempt_status       the attempt's status (NULL: never leased, so no attempt; was attempts.status)
--   attempt_finished_at  when the attempt ended (was attempts.finished_at)
--   output, error_code, error_message, counted   as on awp.attempts
-- and the rest were already there: attempt (the number), worker_id, fencing_token, leased_at (= the
-- attempt's started_at), attempt_deadline (= its deadline). awp.attempts becomes a view of the dispatches
-- that have an attempt, with the old table's columns in the old order, so every reader (awp.task_attempts,
-- awp.check_invariants, psql) sees what it saw; an UPDATE through it is an UPDATE of the dispatch row.
-- The attempt's constraints keep their names on awp.dispatches; "one attempt number per task" is the unique
-- index dispatches_attempt_uq (run_id, task_key, attempt), which replaces dispatches_run_idx (run_id,
-- task_key: its prefix); "one running attempt per task" keeps its partial unique index.
-- Existing rows: each attempt's columns are copied onto its dispatch; the migration stops if an attempt
-- disagrees with its dispatch on a column they share (never written so by any version of AWP).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.dispatches
  ADD COLUMN attempt_status      text,
  ADD COLUMN attempt_finished_at timestamptz,
  ADD COLUMN output              jsonb,
  ADD COLUMN error_code          text,
  ADD COLUMN error_message       text,
  ADD COLUMN counted             boolean NOT NULL DEFAULT true;

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM awp.attempts a LEFT JOIN awp.dispatches d ON d.dispatch_id = a.dispatch_id
              WHERE d.dispatch_id IS NULL OR (a.run_id, a.task_key, a.attempt, a.worker_id, a.fencing_token,
                                              a.started_at, a.deadline)
                      IS DISTINCT FROM (d.run_id, d.task_key, d.attempt, d.worker_id, d.fencing_token,
                                        d.leased_at, d.attempt_deadline))
     OR EXISTS (SELECT 1 FROM awp.dispatches d
                 WHERE d.attempt IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM awp.attempts a WHERE a.dispatch_id = d.dispatch_id)) THEN
    RAISE EXCEPTION '0010_fold_attempts: an attempt and its dispatch disagree; see awp.check_invariants()';
  END IF;
END $$;

UPDATE awp.dispatches d
   SET attempt_status = a.status, attempt_finished_at = a.finished_at, output = a.output,
       error_code = a.error_code, error_message = a.error_message, counted = a.counted
  FROM awp.attempts a
 WHERE a.dispatch_id = d.dispatch_id;

DROP TABLE awp.attempts;
DROP INDEX awp.dispatches_run_idx;

ALTER TABLE awp.dispatches
  ADD CONSTRAINT attempt_status_is_valid CHECK (attempt_status IN
    ('running', 'succeeded', 'failed', 'timed_out', 'interrupted', 'canceled', 'not_received')),
  -- An attempt exactly when the dispatch was leased (its number set); none of its columns otherwise.
  ADD CONSTRAINT attempt_iff_leased CHECK ((attempt IS NULL) = (attempt_status IS NULL)),
  ADD CONSTRAINT attempt_finished_iff_settled CHECK ((attempt_status = 'running') = (attempt_finished_at IS NULL)),
  ADD CONSTRAINT attempt_columns_only_with_attempt CHECK (attempt_status IS NOT NULL OR (
    attempt_finished_at IS NULL AND output IS NULL AND error_code IS NULL AND error_message IS NULL)),
  ADD CONSTRAINT attempt_number_positive CHECK (attempt >= 1),
  ADD CONSTRAINT attempt_error_code_length CHECK (length(error_code) <= 128),
  ADD CONSTRAINT attempt_error_message_length CHECK (octet_length(error_message) <= 8192),
  ADD CONSTRAINT attempt_uncounted_only_when_lost
    CHECK (counted OR attempt_status IN ('not_received', 'interrupted', 'timed_out'));

-- One attempt number per task: impossible to break (NULL, no attempt, is never equal).
CREATE UNIQUE INDEX dispatches_attempt_uq ON awp.dispatches (run_id, task_key, attempt);
CREATE UNIQUE INDEX attempts_one_running_per_task_uq ON awp.dispatches (run_id, task_key)
  WHERE attempt_status = 'running';

CREATE VIEW awp.attempts AS
  SELECT d.run_id, d.task_key, d.attempt, d.dispatch_id, d.worker_id, d.fencing_token,
         d.attempt_status AS status, d.leased_at AS started_at, d.attempt_deadline AS deadline,
         d.attempt_finished_at AS finished_at, d.output, d.error_code, d.error_message, d.counted
    FROM awp.dispatches d
   WHERE d.attempt_status IS NOT NULL;
COMMENT ON VIEW awp.attempts IS 'Attempts: the dispatches that were leased, with their attempt''s columns (stored on awp.dispatches since 0010_fold_attempts).';

RESET ROLE;
