-- awp.refresh_statistics(): ANALYZEs each of AWP's busy tables (runs, tasks, dispatches, which hold the attempts,
-- ready_queue, workers) whose rows changed since its last ANALYZE by more than 500 + 10% of its rows, the rule autovacuum
-- uses by default (50 + 10%), checked every few seconds by the active coordinator instead of autovacuum's
-- minute. Why: the hot path's plans are cached per session and chosen from these statistics; taken while a
-- table was small or differently shaped (say, before 1,000 runs holding 100,000 ready tasks were started), they
-- made the planner walk every live run to find a pending dispatch (a claim cost 0.9 ms instead of 0.02 ms, with
-- 1,000 live runs; AWP issue 46) until autovacuum came round. An ANALYZE that would wait for a lock (autovacuum
-- working on the table) is skipped (lock_timeout): the next call tries again. Returns the tables analyzed.
-- Locks: SHARE UPDATE EXCLUSIVE on each table analyzed and its partitions (blocks no reader or writer), until the
-- transaction ends.
CREATE OR REPLACE FUNCTION awp.refresh_statistics() RETURNS text[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '100ms' AS $$
DECLARE
  t      record;
  v_done text[] := '{}';
BEGIN
  -- A partitioned table (runs, tasks, dispatches: migration 0023) counts the changes of its partitions, and is
  -- analyzed as a whole: ANALYZE of the parent samples every partition (a bounded sample each, whatever its size),
  -- gives the parent the statistics of the whole table (the planner's estimates of joins over it) and analyzes each
  -- partition too. Autovacuum analyzes the partitions (not the parent), which resets their change counts: so a
  -- parent is also due when its rows (the partitions' live rows) differ from what its last ANALYZE counted.
  FOR t IN
    SELECT c.oid AS relid, c.relname
      FROM pg_class c
      CROSS JOIN LATERAL (SELECT sum(s.n_mod_since_analyze) AS changed, sum(s.n_live_tup) AS live,
                                 sum(greatest(k.reltuples, s.n_live_tup, 0)) AS size
                            FROM pg_partition_tree(c.oid) p
                            JOIN pg_stat_user_tables s ON s.relid = p.relid
                            JOIN pg_class k ON k.oid = p.relid
                           WHERE p.isleaf) x
     WHERE c.relnamespace = 'awp'::regnamespace
       AND c.relname IN ('runs', 'tasks', 'dispatches', 'ready_queue', 'workers')
       AND greatest(x.changed, abs(x.live - greatest(c.reltuples, 0))) > 500 + 0.1 * x.size
     ORDER BY c.relname
  LOOP
    BEGIN
      EXECUTE format('ANALYZE %s', t.relid::regclass);
      v_done := v_done || t.relname::text;
    EXCEPTION WHEN lock_not_available THEN
      NULL;
    END;
  END LOOP;
  RETURN v_done;
END $$;
COMMENT ON FUNCTION awp.refresh_statistics() IS 'ANALYZEs the busy AWP tables whose rows changed by more than 500 + 10% since their last ANALYZE; returns their names.';
