-- 0005_retention: data lifecycle (docs/retention.md).
--   settings.retention_ms  how long finished runs, ended worker sessions and idempotency records are kept
--                          before the active coordinator prunes them (awp.apply_retention, awp.prune);
--                          0 = keep forever. Default 7 days.
--   status_counts          run and worker counts by status, kept as append-only deltas by triggers
--                          (db/functions/_status_counts.sql) and compacted by the coordinator, so /metrics
--                          reads a few rows instead of counting every run and worker ever stored.
--   indexes                what prune needs to find its candidates and to delete a worker without scanning
--                          attempts and dispatches (the foreign-key checks of a DELETE FROM awp.workers).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.settings
  ADD COLUMN retention_ms bigint NOT NULL DEFAULT 604800000,
  ADD CONSTRAINT retention_ms_in_range CHECK (retention_ms BETWEEN 0 AND 3153600000000);

CREATE TABLE awp.status_counts (
  entity text NOT NULL,
  status text NOT NULL,
  delta  bigint NOT NULL,
  CONSTRAINT status_counts_entity_is_valid CHECK (entity IN ('run', 'worker'))
);

-- Terminal runs by finish time (prune's candidates, oldest first).
CREATE INDEX runs_finished_idx ON awp.runs (finished_at, run_id) WHERE finished_at IS NOT NULL;
-- Ended worker sessions by end time.
CREATE INDEX workers_ended_idx ON awp.workers ((coalesce(stopped_at, offline_at)))
  WHERE status IN ('stopped', 'offline');
-- Keyset paging of awp.list_workers.
CREATE INDEX workers_listing_idx ON awp.workers (registered_at, worker_id);
-- "Does anything still reference this worker?" (and the FK checks of deleting one).
CREATE INDEX attempts_worker_idx ON awp.attempts (worker_id);
CREATE INDEX dispatches_worker_idx ON awp.dispatches (worker_id) WHERE worker_id IS NOT NULL;

RESET ROLE;
