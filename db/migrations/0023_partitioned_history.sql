-- 0023_partitioned_history: history partitioned by time, so retention drops whole partitions instead of deleting
-- row by row (AWP issue 43; docs/retention.md, Partitions; db/functions/_partitions.sql).
--
-- Run-scoped tables, partitioned by RANGE of their key, whose new values begin with the time their run was made:
--   by run id       runs, tasks, events, signals, run_outputs, task_output
--   by dispatch id  dispatches (which hold the attempts), task_progress
-- New run ids are 'run_t' + 12 hex digits of milliseconds since 1970 (awp._now()) + 19 random hex digits
-- (awp._new_time_id); a new dispatch id is 'dsp_t' + its run's 12 hex digits + 19 random ones
-- (awp._new_dispatch_id; CHECK dispatch_in_run_range), so all the rows of a run are in one time range. Each table has
--   <table>_legacy   FROM (MINVALUE) TO ('run_t' / 'dsp_t'): the rows this migration found (random ids, 'run_' + 32
--                    hex digits, all sort before 'run_t'), and the dispatches of those runs made later; pruned row by
--                    row as before. Dropped at once when the table was empty (a new database);
--   <table>_pYYYYMMDD_HH24MISSMS   one per time range of awp.history_partitions (settings.history_partition_ms; 0,
--                    the default: half the retention), made ahead by awp.maintain_partitions, dropped whole by
--                    retention;
--   <table>_default  DEFAULT: a time id no range covers (say the coordinator was down for days); pruned row by row.
--
-- What a partitioned table cannot have: a unique index without its partition key, and foreign keys that a dropped
-- partition would have to check row by row. So, in this migration:
--   - foreign keys between run-scoped tables (tasks -> runs, dispatches -> tasks, signals -> runs) are dropped, as
--     events never had one: only awp functions write these tables, under the run's lock, and
--     awp.check_invariants() verifies that every row has its run and task. dispatches -> workers stays.
--   - the unique indexes without the partition key become unique indexes of each partition (the _legacy one keeps
--     its own; awp._make_history_partition copies the _default partition's): dispatches (run_id, task_key) [one live dispatch, one
--     running attempt], (run_id, task_key, attempt), (fencing_token); task_progress (run_id, task_key, attempt);
--     runs (workflow_id, idempotency_key). A run's dispatches are all in its run's range, so the first ones still
--     hold for the whole table; fencing tokens come from one sequence; for the run's idempotency key awp._start_run
--     takes a transaction advisory lock on the key and looks before it inserts (one run per key, as before).
-- fillfactor (70 on runs, tasks, dispatches) is set on each partition (a partitioned table has no storage).
-- Forward only: an existing database keeps its rows in the _legacy partitions, pruned row by row as before; its
-- new runs go to the time partitions. The attach validates the legacy rows once (a scan of each table).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.settings
  ADD COLUMN history_partition_ms bigint NOT NULL DEFAULT 0,
  ADD CONSTRAINT history_partition_ms_in_range CHECK (history_partition_ms BETWEEN 0 AND 2592000000),
  ADD CONSTRAINT history_partition_ms_zero_or_a_second CHECK (history_partition_ms = 0 OR history_partition_ms >= 1000);

-- The time ranges that have partitions (the same on every table), oldest first.
CREATE TABLE awp.history_partitions (
  lower_ms   bigint PRIMARY KEY,
  upper_ms   bigint NOT NULL,
  suffix     text NOT NULL UNIQUE,
  created_at timestamptz NOT NULL,
  CONSTRAINT history_partition_range CHECK (upper_ms > lower_ms)
);
COMMENT ON TABLE awp.history_partitions IS 'The time ranges of the partitions of the run-scoped tables [lower_ms, upper_ms) (ms since 1970), made by awp.maintain_partitions, dropped by retention.';

DROP VIEW awp.attempts;
DROP VIEW IF EXISTS awp._claim_candidates;   -- made again by db/functions/claim_tasks.sql

ALTER TABLE awp.tasks DROP CONSTRAINT tasks_run_id_fkey;
ALTER TABLE awp.dispatches DROP CONSTRAINT dispatches_run_id_task_key_fkey;
ALTER TABLE awp.signals DROP CONSTRAINT signals_run_id_fkey;

DO $$
DECLARE
  t        record;
  i        record;
  v_defs   text[];
  v_def    text;
  v_empty  boolean;
BEGIN
  FOR t IN SELECT * FROM (VALUES
      ('runs', 'run_id', 'run_t'), ('tasks', 'run_id', 'run_t'), ('events', 'run_id', 'run_t'),
      ('signals', 'run_id', 'run_t'), ('run_outputs', 'run_id', 'run_t'), ('task_output', 'run_id', 'run_t'),
      ('dispatches', 'dispatch_id', 'dsp_t'), ('task_progress', 'dispatch_id', 'dsp_t')) AS x(tab, key, bound)
  LOOP
    -- The parent gets the old table's indexes (made on the parent, an index adopts the legacy partition's equal
    -- one), except a unique index without the partition key: that one stays on each partition
    -- (awp._history_unique_indexes); the primary key alike, as a constraint.
    SELECT array_agg(pg_get_indexdef(x.indexrelid) ORDER BY c.relname) INTO v_defs
      FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
     WHERE x.indrelid = format('awp.%I', t.tab)::regclass AND NOT x.indisprimary
       AND NOT (x.indisunique AND NOT EXISTS (
                  SELECT 1 FROM pg_attribute a
                   WHERE a.attrelid = x.indrelid AND a.attname = t.key AND a.attnum = ANY (x.indkey::int2[])));
    -- The old table becomes <table>_legacy, its indexes renamed alike.
    EXECUTE format('ALTER TABLE awp.%I RENAME TO %I', t.tab, t.tab || '_legacy');
    FOR i IN SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
              WHERE x.indrelid = format('awp.%I', t.tab || '_legacy')::regclass
    LOOP
      EXECUTE format('ALTER INDEX awp.%I RENAME TO %I', i.relname, left(i.relname, 50) || '_legacy');
    END LOOP;
    EXECUTE format('CREATE TABLE awp.%I (LIKE awp.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS) '
                   'PARTITION BY RANGE (%I)', t.tab, t.tab || '_legacy', t.key);
    EXECUTE format('ALTER TABLE awp.%I ATTACH PARTITION awp.%I FOR VALUES FROM (MINVALUE) TO (%L)',
                   t.tab, t.tab || '_legacy', t.bound);
    EXECUTE format('ALTER TABLE awp.%I ADD PRIMARY KEY (%s)', t.tab,
                   (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY k.o)
                      FROM pg_index x CROSS JOIN unnest(x.indkey::int2[]) WITH ORDINALITY AS k(n, o)
                      JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.n
                     WHERE x.indrelid = format('awp.%I', t.tab || '_legacy')::regclass AND x.indisprimary));
    FOREACH v_def IN ARRAY coalesce(v_defs, '{}') LOOP
      EXECUTE v_def;
    END LOOP;
    -- The DEFAULT partition, with the legacy partition's storage options and its unique indexes of its own.
    EXECUTE format('CREATE TABLE awp.%I PARTITION OF awp.%I DEFAULT %s', t.tab || '_default', t.tab,
                   (SELECT coalesce('WITH (' || array_to_string(c.reloptions, ', ') || ')', '')
                      FROM pg_class c WHERE c.oid = format('awp.%I', t.tab || '_legacy')::regclass));
    FOR i IN SELECT pg_get_indexdef(x.indexrelid) AS def, c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
              WHERE x.indrelid = format('awp.%I', t.tab || '_legacy')::regclass
                AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)
    LOOP
      EXECUTE replace(replace(i.def, format(' ON awp.%s ', t.tab || '_legacy'), format(' ON awp.%s ', t.tab || '_default')),
                      format('INDEX %s ON', i.relname), format('INDEX %s ON', replace(i.relname, '_legacy', '_default')));
    END LOOP;
    -- An empty legacy partition (a new database) goes: every partition costs the hot path (its plans cover them all).
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM awp.%I)', t.tab || '_legacy') INTO v_empty;
    IF v_empty THEN
      EXECUTE format('DROP TABLE awp.%I', t.tab || '_legacy');
    END IF;
  END LOOP;
END $$;

ALTER TABLE awp.dispatches ADD FOREIGN KEY (worker_id) REFERENCES awp.workers;

-- A dispatch is in its run's time range (or, for a run that has no time id, in the legacy partition like its run).
ALTER TABLE awp.dispatches ADD CONSTRAINT dispatch_in_run_range CHECK (CASE WHEN left(run_id, 5) = 'run_t'
  THEN left(dispatch_id, 17) = 'dsp_' || substr(run_id, 5, 13) ELSE dispatch_id < 'dsp_t' END);
ALTER TABLE awp.task_progress ADD CONSTRAINT task_progress_in_run_range CHECK (CASE WHEN left(run_id, 5) = 'run_t'
  THEN left(dispatch_id, 17) = 'dsp_' || substr(run_id, 5, 13) ELSE dispatch_id < 'dsp_t' END);

-- Run counts by status (/metrics) per time range: a dropped range takes its runs' counts with it (a DROP fires no
-- DELETE trigger). part: the range's suffix (awp.history_partitions), '' outside the time ranges.
ALTER TABLE awp.status_counts ADD COLUMN part text NOT NULL DEFAULT '';

CREATE VIEW awp.attempts AS
  SELECT d.run_id, d.task_key, d.attempt, d.dispatch_id, d.worker_id, d.fencing_token,
         d.attempt_status AS status, d.leased_at AS started_at, d.attempt_deadline AS deadline,
         d.attempt_finished_at AS finished_at, d.output, d.error_code, d.error_message, d.counted, d.error_detail
    FROM awp.dispatches d
   WHERE d.attempt_status IS NOT NULL;
COMMENT ON VIEW awp.attempts IS 'Attempts: the dispatches that were leased, with their attempt''s columns (stored on awp.dispatches since 0010_fold_attempts).';

RESET ROLE;
