-- 0019_retry_run: awp.retry_run behind an Idempotency-Key (POST /runs/{id}/retry) keeps its answers in
-- awp.idempotency_keys under the scope 'retries' (db/functions/retry_run.sql; AWP issue 41).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.idempotency_keys
  DROP CONSTRAINT idempotency_scope_is_valid,
  ADD CONSTRAINT idempotency_scope_is_valid CHECK (scope IN ('workflows', 'runs', 'retries'));

RESET ROLE;
