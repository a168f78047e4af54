-- Partitioned history (docs/retention.md, Partitions; migration 0023_partitioned_history): the run-scoped tables are
-- partitioned by RANGE of a key whose new values begin with the time their run was made:
--   by run id       runs, tasks, events, signals, run_outputs, task_output
--   by dispatch id  dispatches, task_progress: a dispatch id begins with its run's time (awp._new_dispatch_id;
--                   CHECK dispatch_in_run_range), so a run's dispatches are in the same time range as the run.
-- Each time range of awp.history_partitions holds whole runs: one partition in each of the eight tables, made
-- together by awp.maintain_partitions, dropped together by awp._drop_history_range once every run in it may be
-- pruned. Besides them, each table has its _legacy partition (ids that are not time ids: the rows migration 0023
-- found) and its _default one (a time id no range covers). Rows outside the time ranges, and the runs of a range
-- that cannot go whole yet, are pruned row by row, as before (awp._prune_batch).

-- awp._history_tables(): the eight tables, their partition key and the prefix of its time ids.
CREATE OR REPLACE FUNCTION awp._history_tables()
RETURNS TABLE (tab text, key text, prefix text)
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  VALUES ('runs', 'run_id', 'run'), ('tasks', 'run_id', 'run'), ('events', 'run_id', 'run'),
         ('signals', 'run_id', 'run'), ('run_outputs', 'run_id', 'run'), ('task_output', 'run_id', 'run'),
         ('dispatches', 'dispatch_id', 'dsp'), ('task_progress', 'dispatch_id', 'dsp')
$$;
COMMENT ON FUNCTION awp._history_tables() IS 'The partitioned run-scoped tables, their partition key and its id prefix.';

-- awp._time_key(prefix, ms): the smallest time id of that millisecond: prefix_t + 12 hex digits (ms since 1970).
CREATE OR REPLACE FUNCTION awp._time_key(p_prefix text, p_ms bigint) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT p_prefix || '_t' || lpad(to_hex(p_ms), 12, '0')
$$;
COMMENT ON FUNCTION awp._time_key(text, bigint) IS 'The lowest time id of a millisecond (a partition bound).';

-- awp._new_time_id(prefix): a new id that sorts by the time it was made: prefix_t + 12 hex digits of awp._now() in
-- ms + 19 hex digits, 32 characters after the prefix like awp._new_id's (run ids). The 19 are random (76 bits), but on
-- a shard (awp.shard, db/functions/shards.sql) the first two are the shard's number (the router reads it back:
-- db/router/00_router.sql, awp_router.shard_of) and 17 are random (68 bits).
CREATE OR REPLACE FUNCTION awp._new_time_id(p_prefix text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_shard integer := awp._shard_index();
  v_rand  text := encode(public.gen_random_bytes(10), 'hex');
BEGIN
  RETURN p_prefix || '_t' || lpad(to_hex(floor(extract(epoch FROM awp._now()) * 1000)::bigint), 12, '0')
         || CASE WHEN v_shard IS NULL THEN left(v_rand, 19) ELSE lpad(to_hex(v_shard), 2, '0') || left(v_rand, 17) END;
END $$;
COMMENT ON FUNCTION awp._new_time_id(text) IS 'A new random identifier that begins with the time it was made (and, on a shard, its number: run ids).';

-- awp._new_dispatch_id(run_id): a new dispatch id of that run: dsp_t + the run id's 12 hex digits of time and the
-- two digits after them (a shard's number) + 17 random hex digits, in the run's time range and shard; for a run id
-- that is not a time id (a legacy run), a random dsp_<32 hex digits> (awp._new_id), in the legacy partition like
-- the run.
CREATE OR REPLACE FUNCTION awp._new_dispatch_id(p_run_id text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF left(p_run_id, 5) = 'run_t' THEN
    RETURN 'dsp_' || substr(p_run_id, 5, 15) || left(encode(public.gen_random_bytes(9), 'hex'), 17);
  END IF;
  RETURN awp._new_id('dsp');
END $$;
COMMENT ON FUNCTION awp._new_dispatch_id(text) IS 'A new dispatch identifier in its run''s time range (and shard).';

-- awp._partition_ms(): the time range of a new history partition: settings.history_partition_ms, or when it is 0 (the
-- default) half the retention (1 s to 30 days; 30 days when retention_ms is 0). Why not a day: every partition
-- costs the hot path, whose generic plans cover (and lock) all of them: +3% backend CPU per completion per partition
-- (benchmarks/ab.py sql AB_RANGES; docs/performance.md, Partitions). With half the retention, retention keeps
-- about three ranges (and a run's rows stay at most 1.5 x the retention).
CREATE OR REPLACE FUNCTION awp._partition_ms() RETURNS bigint
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN s.history_partition_ms > 0 THEN s.history_partition_ms
              WHEN s.retention_ms = 0 THEN r.hi
              ELSE least(greatest(s.retention_ms / 2, 1000), r.hi) END
    FROM awp.settings s, awp._setting_ranges() r
   WHERE r.setting = 'history_partition_ms'   -- its upper bound: 30 days
$$;
COMMENT ON FUNCTION awp._partition_ms() IS 'The time range of a new history partition (settings.history_partition_ms, or half the retention).';

-- awp._make_history_partition(tab, key prefix, lower_ms, upper_ms, suffix): the partition <tab>_p<suffix> for
-- [lower_ms, upper_ms), with the _default partition's storage options and its own copies of the _default
-- partition's unique indexes that the parent cannot have (they lack the partition key: migration 0023).
CREATE OR REPLACE FUNCTION awp._make_history_partition(p_tab text, p_prefix text, p_lo bigint, p_hi bigint, p_suffix text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_name text := p_tab || '_p' || p_suffix;
  v_model regclass := format('awp.%I', p_tab || '_default')::regclass;
  i record;
BEGIN
  EXECUTE format('CREATE TABLE awp.%I PARTITION OF awp.%I FOR VALUES FROM (%L) TO (%L) %s', v_name, p_tab,
                 awp._time_key(p_prefix, p_lo), awp._time_key(p_prefix, p_hi),
                 (SELECT coalesce('WITH (' || array_to_string(c.reloptions, ', ') || ')', '')
                    FROM pg_class c WHERE c.oid = v_model));
  FOR i IN SELECT pg_get_indexdef(x.indexrelid) AS def, c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
            WHERE x.indrelid = v_model AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)
  LOOP
    EXECUTE replace(replace(i.def, format(' ON awp.%s ', p_tab || '_default'), format(' ON awp.%s ', v_name)),
                    format('INDEX %s ON', i.relname),
                    format('INDEX %s ON', replace(i.relname, '_default', '') || '_p' || p_suffix));
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._make_history_partition(text, text, bigint, bigint, text) IS 'Creates one table''s partition of a time range.';

-- awp._drop_history_partitions(suffix): drops a time range's eight partitions (those that exist) and its row of
-- awp.history_partitions. For awp._drop_history_range, which decides when; tests use it to clear ranges.
-- Locks: ACCESS EXCLUSIVE on the eight tables (PostgreSQL's, to drop a partition).
CREATE OR REPLACE FUNCTION awp._drop_history_partitions(p_suffix text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM awp._history_tables() LOOP
    EXECUTE format('DROP TABLE IF EXISTS awp.%I', t.tab || '_p' || p_suffix);
  END LOOP;
  DELETE FROM awp.history_partitions x WHERE x.suffix = p_suffix;
END $$;
COMMENT ON FUNCTION awp._drop_history_partitions(text) IS 'Drops a history time range''s partitions and its catalog row.';

-- awp.maintain_partitions(): makes the time ranges (with their eight partitions) of now and of the next range
-- (awp._partition_ms() each, aligned to multiples of it since 1970), after the last range that exists. A range whose rows already went to a _default partition (nobody made it in time: no coordinator for
-- a range) is not made: those rows stay there, pruned row by row. The active coordinator calls it with each
-- retention batch (awp.apply_retention), migrations once; a DBA may call it. Returns the ranges made.
-- Locks: ACCESS EXCLUSIVE on the eight tables (and so their partitions, _default ones included: adding a partition
-- checks that the _default one holds nothing of its range), all at once, waiting at most lock_timeout (100 ms): not
-- granted, the ranges made so far stay and the next call goes on. Readers and writers of the tables wait for it
-- meanwhile, until the caller's transaction ends (awp.apply_retention calls it last, just before it commits).
CREATE OR REPLACE FUNCTION awp.maintain_partitions() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '100ms' AS $$
DECLARE
  v_int    bigint := awp._partition_ms();
  v_now    bigint := floor(extract(epoch FROM awp._now()) * 1000)::bigint;
  v_lo     bigint;
  v_hi     bigint;
  v_suffix text;
  v_taken  boolean;
  v_made   integer := 0;
  t        record;
BEGIN
  SELECT max(h.upper_ms) INTO v_lo FROM awp.history_partitions h;
  v_lo := greatest(coalesce(v_lo, 0), v_now - v_now % v_int);
  WHILE v_lo < v_now - v_now % v_int + 2 * v_int LOOP
    v_hi := v_lo - v_lo % v_int + v_int;
    v_suffix := to_char(to_timestamp(v_lo / 1000.0) AT TIME ZONE 'UTC', 'YYYYMMDD"_"HH24MISSMS');
    v_taken := false;
    FOR t IN SELECT * FROM awp._history_tables() LOOP
      EXECUTE format('SELECT EXISTS (SELECT 1 FROM awp.%I WHERE %I >= %L AND %I < %L)', t.tab || '_default',
                     t.key, awp._time_key(t.prefix, v_lo), t.key, awp._time_key(t.prefix, v_hi))
         INTO v_taken;
      EXIT WHEN v_taken;
    END LOOP;
    IF NOT v_taken THEN
      BEGIN
        -- Every lock at once, before any partition is made: made one after the other, each partition's wait for the
        -- statements in flight came while the locks of the ones before were held, and the hot path queued behind
        -- them all (the soak's requests timed out on lock_timeout).
        LOCK TABLE awp.runs, awp.tasks, awp.dispatches, awp.events, awp.signals, awp.run_outputs, awp.task_output,
                   awp.task_progress IN ACCESS EXCLUSIVE MODE;
        FOR t IN SELECT * FROM awp._history_tables() LOOP
          PERFORM awp._make_history_partition(t.tab, t.prefix, v_lo, v_hi, v_suffix);
        END LOOP;
        INSERT INTO awp.history_partitions (lower_ms, upper_ms, suffix, created_at)
        VALUES (v_lo, v_hi, v_suffix, awp._now());
        v_made := v_made + 1;
      EXCEPTION WHEN lock_not_available OR duplicate_table OR check_violation THEN
        -- A lock not granted in time; a partition of that name already there (made by hand); a row that reached a
        -- _default partition meanwhile: nothing of this range is made (check_invariants reports a stray
        -- partition), the next call tries again, and the caller's retention batch goes on.
        RETURN v_made;
      END;
    END IF;
    v_lo := v_hi;
  END LOOP;
  RETURN v_made;
END $$;
COMMENT ON FUNCTION awp.maintain_partitions() IS 'Makes the history partitions of the current time range and the next; returns how many ranges it made.';

-- awp._history_pinned(suffix, cutoff): whether a run of that time range must be kept: live (pending, running),
-- finished at or after the cutoff, or with a pending or leased dispatch (awp._prune_batch's rule). Reads three
-- partial indexes of the range's own partitions (runs_live_idx, runs_finished_idx, dispatches_pending_idx /
-- dispatches_lease_expiry_idx), whatever their size.
CREATE OR REPLACE FUNCTION awp._history_pinned(p_suffix text, p_cutoff timestamptz) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v boolean;
BEGIN
  EXECUTE format('SELECT EXISTS (SELECT 1 FROM awp.%1$I r WHERE r.status IN (''pending'', ''running''))
                      OR EXISTS (SELECT 1 FROM awp.%1$I r WHERE r.finished_at >= $1)
                      OR EXISTS (SELECT 1 FROM awp.%2$I d WHERE d.status = ''pending'')
                      OR EXISTS (SELECT 1 FROM awp.%2$I d WHERE d.status = ''leased'')',
                 'runs_p' || p_suffix, 'dispatches_p' || p_suffix)
     INTO v USING p_cutoff;
  RETURN v;
EXCEPTION WHEN undefined_table THEN   -- a partition dropped by hand (check_invariants reports it): never dropped here
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._history_pinned(text, timestamptz) IS 'Whether a history time range holds a run that must be kept (live, recent, or with a live dispatch).';

-- awp._drop_history_range(cutoff): drops the eight partitions of the oldest time range that may go whole: it ended
-- a while ago (a minute, or its own length if shorter: no new run gets an id in it, the clock stepping back a little
-- included), and none of its
-- runs is live, finished at or after the cutoff, or has a pending or leased dispatch (awp._history_pinned). A range
-- holds whole runs (their tasks, dispatches, attempts, events, signals, progress and output: every row is keyed by
-- its run's time), so nothing outside it refers to what it held, except idempotency records (pruned by age) and
-- worker sessions (pruned once unreferenced). A range that must wait does not hold back a newer one.
-- Returns the counts of what the partitions held, or NULL when nothing was dropped. The counts: PostgreSQL's
-- estimate of each partition's rows (pg_class.reltuples, kept by autovacuum and awp.refresh_statistics), or a
-- count when it has none (a small partition never analyzed): reading every row would make the cost grow with the
-- rows again.
-- Locks: ACCESS EXCLUSIVE on the eight parents (and so their partitions), waiting at most lock_timeout (100 ms):
-- every reader and writer of the run-scoped tables waits for the drop (milliseconds) until the caller's transaction
-- ends, so awp._prune_batch returns at once after a drop. Not granted in time: nothing is dropped, NULL.
CREATE OR REPLACE FUNCTION awp._drop_history_range(p_cutoff timestamptz) RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET lock_timeout = '100ms' AS $$
DECLARE
  h       awp.history_partitions;
  v_now   bigint := floor(extract(epoch FROM awp._now()) * 1000)::bigint;
  v_n     jsonb := '{}';
  v_rows  double precision;
  v_att   double precision;
  t       record;
BEGIN
  SELECT * INTO h FROM awp.history_partitions x
   WHERE x.upper_ms <= v_now - least(60000, x.upper_ms - x.lower_ms) AND NOT awp._history_pinned(x.suffix, p_cutoff)
   ORDER BY x.lower_ms LIMIT 1;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  BEGIN
    LOCK TABLE awp.runs, awp.tasks, awp.dispatches, awp.events, awp.signals, awp.run_outputs, awp.task_output,
               awp.task_progress IN ACCESS EXCLUSIVE MODE;
    IF awp._history_pinned(h.suffix, p_cutoff) THEN   -- a run changed meanwhile (say, re-run)
      RAISE EXCEPTION 'history range pinned' USING ERRCODE = 'AWPIN';   -- caught below: the locks go with it
    END IF;
    FOR t IN SELECT * FROM awp._history_tables() LOOP
      SELECT c.reltuples INTO v_rows FROM pg_class c WHERE c.oid = to_regclass(format('awp.%I', t.tab || '_p' || h.suffix));
      IF v_rows IS NULL THEN   -- dropped by hand (check_invariants reports it)
        v_rows := 0;
      ELSIF v_rows < 0 THEN
        EXECUTE format('SELECT count(*) FROM awp.%I', t.tab || '_p' || h.suffix) INTO v_rows;
      END IF;
      v_n := v_n || jsonb_build_object(t.tab, round(v_rows)::bigint);
    END LOOP;
    -- Attempts: the dispatches that were leased (attempt_status set).
    SELECT CASE WHEN c.reltuples < 0 THEN NULL
                ELSE c.reltuples * (1 - coalesce((SELECT s.null_frac FROM pg_stats s
                                                   WHERE s.schemaname = 'awp' AND s.tablename = c.relname
                                                     AND s.attname = 'attempt_status'), 0)) END
      INTO v_att FROM pg_class c WHERE c.oid = format('awp.%I', 'dispatches_p' || h.suffix)::regclass;
    IF v_att IS NULL THEN
      EXECUTE format('SELECT count(attempt_status) FROM awp.%I', 'dispatches_p' || h.suffix) INTO v_att;
    END IF;
    PERFORM awp._drop_history_partitions(h.suffix);
    DELETE FROM awp.status_counts c WHERE c.entity = 'run' AND c.part = h.suffix;   -- its runs' counts (/metrics)
  EXCEPTION WHEN lock_not_available OR SQLSTATE 'AWPIN' THEN
    RETURN NULL;
  END;
  RETURN jsonb_build_object('runs', v_n->'runs', 'tasks', v_n->'tasks', 'dispatches', v_n->'dispatches',
                            'attempts', round(v_att)::bigint, 'events', v_n->'events', 'partitions', 1,
                            'range', jsonb_build_array(to_timestamp(h.lower_ms / 1000.0), to_timestamp(h.upper_ms / 1000.0)));
END $$;
COMMENT ON FUNCTION awp._drop_history_range(timestamptz) IS 'Drops the oldest history time range''s partitions whose runs may all be pruned; returns what they held (estimates) or NULL.';
