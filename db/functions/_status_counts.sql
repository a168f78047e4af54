-- Run and worker counts by status for /metrics (awp.metrics_snapshot), without counting every row ever
-- stored: triggers append deltas to awp.status_counts in the transaction that inserts, re-statuses or
-- deletes a run or worker, and awp._compact_status_counts() (run by the coordinator's retention step)
-- folds them into one row per (entity, status). Appending (never updating a shared counter row) keeps
-- concurrent transactions from waiting on each other or deadlocking over the counters.
-- The triggers fire only when a run's or worker's status changes (UPDATE OF status, WHEN it differs),
-- never for the per-call counter updates of runs (awp._log_flush).

-- awp._count_status(): trigger function. Row-level INSERT / UPDATE OF status: +1 new, -1 old.
-- Statement-level DELETE (transition table `gone`): -n per status. TRUNCATE (tests, a DBA): the entity's
-- counts go (TRUNCATE holds ACCESS EXCLUSIVE: no other change of that table is in flight). TG_ARGV[0] is
-- the entity. Locks: none (inserts only; TRUNCATE: the entity's count rows).
-- A run's deltas carry its time range (`part`, the suffix of its partition; '' outside the time ranges:
-- db/functions/_partitions.sql), so that dropping a range drops its runs' counts too (a DROP fires no trigger). A
-- row trigger of the partitioned awp.runs fires on the row's partition (TG_TABLE_NAME); the DELETE statement trigger
-- finds each gone run's range in awp.history_partitions.
CREATE OR REPLACE FUNCTION awp._count_status() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_part text := CASE WHEN TG_LEVEL = 'ROW' AND left(TG_TABLE_NAME, 6) = 'runs_p' THEN substr(TG_TABLE_NAME, 7)
                      ELSE '' END;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM awp.status_counts c WHERE c.entity = TG_ARGV[0];
  ELSIF TG_LEVEL = 'STATEMENT' AND TG_ARGV[0] = 'run' THEN
    INSERT INTO awp.status_counts (entity, status, delta, part)
    SELECT 'run', g.status, -count(*), coalesce(h.suffix, '')
      FROM gone g
      LEFT JOIN awp.history_partitions h
        ON g.run_id >= awp._time_key('run', h.lower_ms) AND g.run_id < awp._time_key('run', h.upper_ms)
     GROUP BY g.status, h.suffix;
  ELSIF TG_LEVEL = 'STATEMENT' THEN
    INSERT INTO awp.status_counts (entity, status, delta)
    SELECT TG_ARGV[0], g.status, -count(*) FROM gone g GROUP BY g.status;
  ELSIF TG_OP = 'INSERT' THEN
    INSERT INTO awp.status_counts (entity, status, delta, part) VALUES (TG_ARGV[0], NEW.status, 1, v_part);
  ELSE
    INSERT INTO awp.status_counts (entity, status, delta, part)
    VALUES (TG_ARGV[0], OLD.status, -1, v_part), (TG_ARGV[0], NEW.status, 1, v_part);
  END IF;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._count_status() IS 'Trigger: appends run/worker status count deltas to awp.status_counts.';

-- awp._compact_status_counts(): folds the deltas into one row per (entity, status, part) (dropping zeros);
-- returns the number of delta rows folded. Safe concurrently with writers (their new rows are not in
-- this statement's snapshot and stay) and with itself (a row deleted by a concurrent compaction is
-- skipped). Locks: the delta rows it deletes.
CREATE OR REPLACE FUNCTION awp._compact_status_counts() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n integer;
BEGIN
  WITH gone AS (
    DELETE FROM awp.status_counts c RETURNING c.entity, c.status, c.delta, c.part
  ), folded AS (
    INSERT INTO awp.status_counts (entity, status, delta, part)
    SELECT g.entity, g.status, sum(g.delta), g.part FROM gone g GROUP BY g.entity, g.status, g.part
    HAVING sum(g.delta) <> 0
  )
  SELECT count(*) INTO v_n FROM gone;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._compact_status_counts() IS 'Folds the status count deltas into one row per entity and status; returns the rows folded.';

-- awp._counts_by_status(entity): {status: n} of runs or workers (statuses with n = 0 left out). Reads the
-- folded rows plus the deltas since the last compaction: O(status changes since then), never O(rows).
CREATE OR REPLACE FUNCTION awp._counts_by_status(p_entity text) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT coalesce(jsonb_object_agg(x.status, x.n), '{}')
    FROM (SELECT c.status, sum(c.delta) AS n FROM awp.status_counts c
           WHERE c.entity = p_entity GROUP BY c.status HAVING sum(c.delta) <> 0) x
$$;
COMMENT ON FUNCTION awp._counts_by_status(text) IS 'Run or worker counts by status from awp.status_counts.';

-- The triggers, and the counts recomputed from the tables in the same transaction: CREATE TRIGGER
-- takes SHARE ROW EXCLUSIVE on runs and workers, so no status changes between the recount and the
-- triggers (every migrate re-does this; it also repairs counts after a manual change with triggers off).
DROP TRIGGER IF EXISTS runs_count_status_ins ON awp.runs;
DROP TRIGGER IF EXISTS runs_count_status_upd ON awp.runs;
DROP TRIGGER IF EXISTS runs_count_status_del ON awp.runs;
DROP TRIGGER IF EXISTS workers_count_status_ins ON awp.workers;
DROP TRIGGER IF EXISTS workers_count_status_upd ON awp.workers;
DROP TRIGGER IF EXISTS workers_count_status_del ON awp.workers;
DROP TRIGGER IF EXISTS runs_count_status_trunc ON awp.runs;
DROP TRIGGER IF EXISTS workers_count_status_trunc ON awp.workers;
CREATE TRIGGER runs_count_status_ins AFTER INSERT ON awp.runs
  FOR EACH ROW EXECUTE FUNCTION awp._count_status('run');
CREATE TRIGGER runs_count_status_upd AFTER UPDATE OF status ON awp.runs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION awp._count_status('run');
CREATE TRIGGER runs_count_status_del AFTER DELETE ON awp.runs
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION awp._count_status('run');
CREATE TRIGGER workers_count_status_ins AFTER INSERT ON awp.workers
  FOR EACH ROW EXECUTE FUNCTION awp._count_status('worker');
CREATE TRIGGER workers_count_status_upd AFTER UPDATE OF status ON awp.workers
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION awp._count_status('worker');
CREATE TRIGGER workers_count_status_del AFTER DELETE ON awp.workers
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION awp._count_status('worker');
CREATE TRIGGER runs_count_status_trunc AFTER TRUNCATE ON awp.runs
  FOR EACH STATEMENT EXECUTE FUNCTION awp._count_status('run');
CREATE TRIGGER workers_count_status_trunc AFTER TRUNCATE ON awp.workers
  FOR EACH STATEMENT EXECUTE FUNCTION awp._count_status('worker');

DELETE FROM awp.status_counts;
INSERT INTO awp.status_counts (entity, status, delta, part)
SELECT 'run', r.status, count(*), CASE WHEN left(c.relname, 6) = 'runs_p' THEN substr(c.relname, 7) ELSE '' END
  FROM awp.runs r JOIN pg_class c ON c.oid = r.tableoid GROUP BY 2, 4
UNION ALL
SELECT 'worker', w.status, count(*), '' FROM awp.workers w GROUP BY w.status;
