-- 0006_dispatch_limit_default: the global dispatch_limit defaults to 10,000 instead of 100
-- (docs/limits.md). At 100 it bound before the workers did on any cluster with more than 100 worker
-- slots (2 workers x concurrency 100 ran 100 tasks at once), silently. Worker slots already bound
-- pending + leased dispatches (a dispatch needs a free slot of a compatible active worker), so the
-- global limit is a ceiling that protects the database from a very large fleet, not the everyday cap.
-- A database still at the old default gets the new one; any other value was chosen and is kept.
ALTER TABLE awp.settings ALTER COLUMN dispatch_limit SET DEFAULT 10000;
UPDATE awp.settings SET dispatch_limit = 10000 WHERE dispatch_limit = 100;
