-- 0018_error_detail: a failed attempt's detail (a handler's traceback, at most 8,192 bytes: its last part), sent by
-- the worker with the result (`error_detail`), stored with the attempt and shown by awp.task_attempts, the API,
-- `awp run task` and the dashboard (AWP issue 41).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.dispatches
  ADD COLUMN error_detail text,
  ADD CONSTRAINT attempt_error_detail_length CHECK (octet_length(error_detail) <= 8192),
  DROP CONSTRAINT attempt_columns_only_with_attempt,
  ADD CONSTRAINT attempt_columns_only_with_attempt CHECK (attempt_status IS NOT NULL OR (
    attempt_finished_at IS NULL AND output IS NULL AND error_code IS NULL AND error_message IS NULL
    AND error_detail IS NULL));

CREATE OR REPLACE VIEW awp.attempts AS
  SELECT d.run_id, d.task_key, d.attempt, d.dispatch_id, d.worker_id, d.fencing_token,
         d.attempt_status AS status, d.leased_at AS started_at, d.attempt_deadline AS deadline,
         d.attempt_finished_at AS finished_at, d.output, d.error_code, d.error_message, d.counted, d.error_detail
    FROM awp.dispatches d
   WHERE d.attempt_status IS NOT NULL;

RESET ROLE;
