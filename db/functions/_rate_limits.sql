-- Rate limits and concurrency keys (docs/limits.md, Rate limits and concurrency keys; migration
-- 0020_limits_and_priority). A task's definition names limits (`"limits": ["openai", {"name": "tenant", "key_from":
-- ["run_input", "tenant_id"]}]`); when its run starts, each becomes a bucket on the task row (tasks.limit_buckets):
-- the limit's name, or `name=key` with the key read from the run input (one bucket per distinct key). A limit
-- (awp.set_limit) holds every bucket of its name to:
--   max_in_flight   at most that many queued + running tasks holding the bucket (pending + leased dispatches),
--                   across all runs and workers, at every instant;
--   per_window      at most that many attempts of such tasks start in any window of window_ms: a start at time s
--                   counts from s until just before s + window_ms. A dispatch not yet claimed counts as a start
--                   already (it will start, or it ends unclaimed), so the rule holds however late the claim comes.
-- Every dispatch of a task with limits is decided by awp._limits_allow, which takes each bucket's transaction
-- advisory lock WITHOUT waiting (pg_try_advisory_xact_lock) and counts under it: two transactions never both
-- spend the last unit of a bucket, and a bucket busy elsewhere is skipped (its task waits for the next refill
-- or coordinator pass), so the buckets add no lock order and no wait to the lock order of docs/architecture.md.
-- A limit that is not defined holds its tasks (wait reason rate_limited, "limit X is not defined"): defining it
-- releases them at the next coordinator pass.

-- awp._bucket_limit(bucket): the limit's name of a bucket ("tenant=acme" -> "tenant"). Locks: none.
CREATE OR REPLACE FUNCTION awp._bucket_limit(p_bucket text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT split_part(p_bucket, '=', 1) $$;
COMMENT ON FUNCTION awp._bucket_limit(text) IS 'The limit name of a bucket (name or name=key).';

-- awp._bucket_key(bucket): the key of a bucket (NULL for a limit without key_from). Locks: none.
CREATE OR REPLACE FUNCTION awp._bucket_key(p_bucket text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN strpos(p_bucket, '=') > 0 THEN substr(p_bucket, strpos(p_bucket, '=') + 1) END
$$;
COMMENT ON FUNCTION awp._bucket_key(text) IS 'The key of a bucket (NULL without one).';

-- awp._limits_error(limits, executor): what is wrong with a task definition's `limits`, or NULL when valid: an
-- array of 1-8 distinct limits, each a name (1-64 of A-Z a-z 0-9 _ . : -) or {"name", "key_from": ["run_input",
-- field, ...]}; not on a task run by the database (signal, sleep, workflow). Locks: none.
CREATE OR REPLACE FUNCTION awp._limits_error(p jsonb, p_executor text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE
    WHEN jsonb_typeof(p) IS DISTINCT FROM 'array' OR jsonb_array_length(p) NOT BETWEEN 1 AND 8
      THEN 'limits must be an array of 1-8 limit names or {"name", "key_from"} objects'
    WHEN p_executor IN ('workflow', 'signal', 'sleep')   -- awp._database_kinds()
      THEN format('limits apply to tasks run by workers, not to executor %s', p_executor)
    ELSE (SELECT string_agg(e.err, '; ' ORDER BY e.o) FROM (
            SELECT x.o, CASE
                     WHEN jsonb_typeof(x.v) = 'string' THEN
                       CASE WHEN x.v #>> '{}' !~ '^[A-Za-z0-9_.:-]{1,64}$'
                            THEN format('limits[%s]: a limit name has 1-64 characters among A-Z a-z 0-9 _ . : -', x.o - 1) END
                     WHEN jsonb_typeof(x.v) <> 'object' THEN format('limits[%s] must be a name or an object', x.o - 1)
                     WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(x.v) k WHERE k NOT IN ('name', 'key_from'))
                       THEN format('limits[%s] has unknown fields (allowed: name, key_from)', x.o - 1)
                     WHEN jsonb_typeof(x.v->'name') IS DISTINCT FROM 'string' OR x.v->>'name' !~ '^[A-Za-z0-9_.:-]{1,64}$'
                       THEN format('limits[%s].name must be a limit name (1-64 characters among A-Z a-z 0-9 _ . : -)', x.o - 1)
                     WHEN x.v ? 'key_from' AND (jsonb_typeof(x.v->'key_from') IS DISTINCT FROM 'array'
                                                OR jsonb_array_length(x.v->'key_from') NOT BETWEEN 2 AND 8
                                                OR x.v->'key_from'->>0 IS DISTINCT FROM 'run_input'
                                                OR EXISTS (SELECT 1 FROM jsonb_array_elements(x.v->'key_from') f
                                                            WHERE jsonb_typeof(f) <> 'string'))
                       THEN format('limits[%s].key_from must be ["run_input", field, ...] (a path in the run input)', x.o - 1)
                   END AS err
              FROM jsonb_array_elements(p) WITH ORDINALITY AS x(v, o)) e)
  END
$$;
COMMENT ON FUNCTION awp._limits_error(jsonb, text) IS 'What is wrong with a task''s limits, or NULL.';

-- awp._limits_duplicate(limits): the first limit name given twice in a task's (valid) `limits`, or NULL.
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._limits_duplicate(p jsonb) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT n FROM (SELECT coalesce(v->>'name', v #>> '{}') AS n FROM jsonb_array_elements(p) v) x
   GROUP BY n HAVING count(*) > 1 ORDER BY n LIMIT 1
$$;
COMMENT ON FUNCTION awp._limits_duplicate(jsonb) IS 'A limit name given twice in a task''s limits, or NULL.';

-- awp._buckets_of(limits, run_input): the buckets of a task's `limits` for a run with that input, sorted
-- (NULL without limits): a name, or name=key for key_from (the value at that path of the run input: a string as
-- it is, another JSON value as its JSON text, missing or null as the empty key, which every such run shares).
-- AWREQ when a key is longer than 200 characters. Locks: none.
CREATE OR REPLACE FUNCTION awp._buckets_of(p_limits jsonb, p_input jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_buckets text[];
  v_long    text;
BEGIN
  IF p_limits IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT array_agg(b ORDER BY b) INTO v_buckets FROM (
    SELECT CASE WHEN jsonb_typeof(v) = 'string' THEN v #>> '{}'
                WHEN NOT v ? 'key_from' THEN v->>'name'
                ELSE (v->>'name') || '=' || coalesce(p_input #>> ARRAY(SELECT f FROM jsonb_array_elements_text(v->'key_from')
                                                                         WITH ORDINALITY AS k(f, o) WHERE k.o > 1
                                                                         ORDER BY k.o), '')
           END AS b
      FROM jsonb_array_elements(p_limits) v) x;
  SELECT b INTO v_long FROM unnest(v_buckets) b WHERE length(coalesce(awp._bucket_key(b), '')) > 200 LIMIT 1;
  IF v_long IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('limit key too long',
      format('the key of limit %s taken from the run input has %s characters (at most 200)',
             awp._bucket_limit(v_long), length(awp._bucket_key(v_long))));
  END IF;
  RETURN v_buckets;
END $$;
COMMENT ON FUNCTION awp._buckets_of(jsonb, jsonb) IS 'The sorted buckets (name or name=key) of a task''s limits for a run input.';

-- awp._bucket_use(bucket, limit, now): what the bucket uses now: in_flight (its queued + running tasks), queued
-- (the part not yet started) and started (attempt starts in the limit's window before now; 0 without a window).
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._bucket_use(p_bucket text, l awp.limits, p_now timestamptz,
                                          OUT in_flight integer, OUT queued integer, OUT started integer)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  SELECT count(*)::integer, count(*) FILTER (WHERE t.status = 'queued')::integer INTO in_flight, queued
    FROM awp.tasks t
   WHERE t.status IN ('queued', 'running') AND t.limit_buckets IS NOT NULL AND t.limit_buckets @> ARRAY[p_bucket];
  started := 0;
  IF l.window_ms IS NOT NULL THEN
    SELECT count(*)::integer INTO started FROM awp.limit_starts s
     WHERE s.bucket = p_bucket AND s.started_at > p_now - make_interval(secs => l.window_ms / 1000.0)
       AND s.started_at <= p_now;
  END IF;
END $$;
COMMENT ON FUNCTION awp._bucket_use(text, awp.limits, timestamptz) IS 'In flight, queued and started-in-window counts of a bucket.';

-- awp._buckets_hold(buckets, now): why these buckets hold a task now, for people (NULL when none does): the first
-- bucket, in order, that is undefined, full (max_in_flight) or out of starts (per_window). Read-only (no lock):
-- the wait reason rate_limited (db/functions/waits.sql). Locks: none.
CREATE OR REPLACE FUNCTION awp._buckets_hold(p_buckets text[], p_now timestamptz) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  b text;
  l awp.limits;
  u record;
  v_name text;
BEGIN
  FOREACH b IN ARRAY coalesce(p_buckets, '{}') LOOP
    v_name := 'limit ' || awp._bucket_limit(b) || coalesce(' (key ' || quote_literal(awp._bucket_key(b)) || ')', '');
    SELECT * INTO l FROM awp.limits x WHERE x.name = awp._bucket_limit(b);
    IF NOT FOUND THEN
      RETURN v_name || ' is not defined (awp.set_limit or PUT /limits/' || awp._bucket_limit(b) || ')';
    END IF;
    u := awp._bucket_use(b, l, p_now);
    IF u.in_flight >= l.max_in_flight THEN
      RETURN format('%s: %s of max_in_flight %s in flight', v_name, u.in_flight, l.max_in_flight);
    ELSIF u.started + u.queued >= l.per_window THEN
      RETURN format('%s: %s of per_window %s started or about to start in the last %s', v_name, u.started + u.queued,
                    l.per_window, awp._wait_secs(make_interval(secs => l.window_ms / 1000.0)));
    END IF;
  END LOOP;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._buckets_hold(text[], timestamptz) IS 'Why a task''s limits hold it now (NULL: they do not).';

-- awp._limits_allow(buckets): true when one more task holding these buckets may be dispatched now: every bucket's
-- limit is defined and has room (max_in_flight, per_window; the queued tasks count as starts). Takes each bucket's
-- advisory lock without waiting first and counts under it (see the top of this file): false when one is held by
-- another transaction. Call it right before the dispatch it decides, in the same transaction. Locks: the buckets'
-- transaction advisory locks (try only).
CREATE OR REPLACE FUNCTION awp._limits_allow(p_buckets text[]) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := awp._now();
  b     text;
  l     awp.limits;
  u     record;
BEGIN
  FOREACH b IN ARRAY p_buckets LOOP
    SELECT * INTO l FROM awp.limits x WHERE x.name = awp._bucket_limit(b);
    IF NOT FOUND OR NOT pg_try_advisory_xact_lock(hashtextextended('awp.limit ' || b, 0)) THEN
      RETURN false;
    END IF;
    u := awp._bucket_use(b, l, v_now);
    IF u.in_flight >= l.max_in_flight OR u.started + u.queued >= l.per_window THEN
      RETURN false;
    END IF;
  END LOOP;
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._limits_allow(text[]) IS 'Whether one more task holding these buckets may be dispatched now (takes the buckets'' advisory locks, try only).';

-- awp._limited_sets(kinds, only_run): the distinct bucket sets (as text) of the ready tasks with limits of these
-- executor kinds (of that run only, when given) that have room now (awp._limits_allow, taking their advisory locks):
-- each set is checked once before any task is read, so a backlog behind full limits costs one index-only scan of
-- the ready tasks with limits (tasks_ready_limited_idx). Locks: the buckets' advisory locks (try only).
CREATE OR REPLACE FUNCTION awp._limited_sets(p_kinds text[], p_only_run text) RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_set  text[];
  v_open text[] := '{}';
BEGIN
  FOR v_set IN SELECT DISTINCT y.limit_buckets FROM awp.tasks y
                WHERE y.status = 'ready' AND y.limit_buckets IS NOT NULL AND y.executor = ANY (p_kinds)
                  AND (p_only_run IS NULL OR y.run_id = p_only_run) LOOP
    IF awp._limits_allow(v_set) THEN
      v_open := v_open || v_set::text;
    END IF;
  END LOOP;
  RETURN v_open;
END $$;
COMMENT ON FUNCTION awp._limited_sets(text[], text) IS 'The bucket sets of ready tasks with limits that have room now (as text).';

-- awp._limited_candidates(kinds, only_run, sets, n): a cursor over the ready tasks with limits of these kinds whose
-- bucket set is among `sets` (awp._limited_sets), of runs live and not canceling, at most n per run (a dispatch of n
-- takes no more from one run), in the order a dispatch takes them: priority (higher first), then round by round
-- (each run's first task, then each run's second, ...), runs in the fairness order of docs/protocol.md (rule 9)
-- within a round, then definition order. Routing by action (db/functions/_routing.sql): only tasks whose action
-- some active worker runs, or, given `actions` (a worker's action lists), that worker runs. Rows: run_id, task_key,
-- limit_buckets, concurrency, executor. Each run's
-- tasks come from tasks_ready_limited_idx in order (LIMIT n), so one run of a large backlog costs n rows, not its
-- backlog sorted. Locks: none.
CREATE OR REPLACE FUNCTION awp._limited_candidates(p_kinds text[], p_only_run text, p_sets text[], p_n integer,
                                                    p_actions jsonb DEFAULT NULL)
RETURNS refcursor
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c refcursor;
BEGIN
  OPEN c NO SCROLL FOR
    SELECT t.run_id, t.task_key, t.limit_buckets, r.concurrency, t.executor
      FROM (SELECT DISTINCT y.run_id FROM awp.tasks y
             WHERE y.status = 'ready' AND y.limit_buckets IS NOT NULL AND (p_only_run IS NULL OR y.run_id = p_only_run)) q
      JOIN awp.runs r ON r.run_id = q.run_id AND r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
     CROSS JOIN LATERAL (
       SELECT z.run_id, z.task_key, z.limit_buckets, z.executor, z.priority, z.ordinal,
              row_number() OVER (ORDER BY z.priority DESC, z.ordinal) AS round
         FROM (SELECT y.run_id, y.task_key, y.limit_buckets, y.executor, y.priority, y.ordinal FROM awp.tasks y
                WHERE y.run_id = q.run_id AND y.status = 'ready' AND y.limit_buckets IS NOT NULL
                  AND y.executor = ANY (p_kinds) AND y.limit_buckets::text = ANY (p_sets)
                  AND CASE WHEN p_actions IS NULL THEN awp._action_served(y.executor, y.action)
                           ELSE awp._offers(p_actions, y.executor, y.action) END
                ORDER BY y.priority DESC, y.ordinal LIMIT p_n) z) t
     ORDER BY t.priority DESC, t.round, r.last_dispatch_seq NULLS FIRST, r.created_at, t.run_id, t.ordinal;
  RETURN c;
END $$;
COMMENT ON FUNCTION awp._limited_candidates(text[], text, text[], integer, jsonb) IS 'A cursor over the ready tasks with limits that may be taken now (at most n per run), in dispatch order.';

-- awp._limited_take(run, task, buckets, concurrency, counted_out_run): whether a candidate of awp._limited_candidates
-- (its run, task key, buckets and its run's concurrency) can be taken now:
-- its run taken without waiting (awp._try_run) and under its concurrency (`counted_out_run`: a run one of whose
-- running tasks counts out, the hot path's completion not written yet), its buckets with room (awp._limits_allow,
-- counted again: a dispatch made since may have filled them), its row still ready and then locked. 'run' when the
-- run cannot take it (skip the run's other candidates too), 'task' when only this task cannot, 'ok'. Locks: the
-- run (no wait), the buckets (try only), the task row.
CREATE OR REPLACE FUNCTION awp._limited_take(p_run_id text, p_task_key text, p_buckets text[], p_concurrency integer,
                                              p_counted_out_run text) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF NOT awp._try_run(p_run_id)
     OR ((SELECT count(*) FROM awp.tasks z WHERE z.run_id = p_run_id AND z.status IN ('queued', 'running'))
         - (p_run_id = p_counted_out_run)::integer >= p_concurrency) THEN
    RETURN 'run';
  END IF;
  IF NOT awp._limits_allow(p_buckets) THEN
    RETURN 'task';
  END IF;
  PERFORM 1 FROM awp.tasks z WHERE z.run_id = p_run_id AND z.task_key = p_task_key AND z.status = 'ready' FOR UPDATE;
  RETURN CASE WHEN FOUND THEN 'ok' ELSE 'task' END;
END $$;
COMMENT ON FUNCTION awp._limited_take(text, text, text[], integer, text) IS 'Whether a ready task with limits can be taken now (run free and under concurrency, buckets with room); locks it.';

-- awp._pick_limited(kinds, only_run, counted_out_run, actions): the one ready task with limits that a dispatch for a
-- worker of these executor kinds (and action lists, NULL: any active worker's) takes now (NULLs: none), its run taken and its row locked (awp._limited_take), in the
-- order of awp._limited_candidates. For the refill leased at once (awp._lease_refill). Locks: as
-- awp._limited_sets, then as awp._limited_take.
CREATE OR REPLACE FUNCTION awp._pick_limited(p_kinds text[], p_only_run text DEFAULT NULL,
                                             p_counted_out_run text DEFAULT NULL, p_actions jsonb DEFAULT NULL,
                                             OUT run_id text, OUT task_key text)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_sets text[] := awp._limited_sets(p_kinds, p_only_run);
  v_skip text[] := '{}';   -- runs that cannot take one
  v_got  text;
  cur    refcursor;
  c_run  text;   -- a candidate (awp._limited_candidates)
  c_key  text;
  c_set  text[];
  c_conc integer;
  c_exec text;
BEGIN
  IF cardinality(v_sets) = 0 THEN
    RETURN;
  END IF;
  cur := awp._limited_candidates(p_kinds, p_only_run, v_sets, 1, p_actions);
  LOOP
    FETCH cur INTO c_run, c_key, c_set, c_conc, c_exec;
    EXIT WHEN NOT FOUND;
    CONTINUE WHEN c_run = ANY (v_skip);
    v_got := awp._limited_take(c_run, c_key, c_set, c_conc, p_counted_out_run);
    IF v_got = 'run' THEN
      v_skip := v_skip || c_run;
    ELSIF v_got = 'ok' THEN
      run_id := c_run;
      task_key := c_key;
      EXIT;
    END IF;
  END LOOP;
  CLOSE cur;
END $$;
COMMENT ON FUNCTION awp._pick_limited(text[], text, text, jsonb) IS 'The ready task with limits a dispatch takes now (priority, fairness, room), its run and row locked; NULLs when none.';

-- awp._dispatch_limited(kinds, n, only_run): up to n pending dispatches (awp._dispatch_task) for ready tasks with
-- limits, walking awp._limited_candidates once, each within the budget `kinds` ({kind: free slots}, returned less
-- what was used). Returns the budget left and the number created. Locks: as awp._pick_limited, then as
-- awp._dispatch_task.
CREATE OR REPLACE FUNCTION awp._dispatch_limited(INOUT kinds jsonb, p_n integer, p_only_run text DEFAULT NULL,
                                                 OUT created integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_kinds text[];
  v_sets  text[];
  v_skip  text[] := '{}';
  v_got   text;
  v_kind  text;
  cur     refcursor;
  c_run   text;   -- a candidate (awp._limited_candidates)
  c_key   text;
  c_set   text[];
  c_conc  integer;
  c_exec  text;
BEGIN
  created := 0;
  IF p_n < 1 OR NOT EXISTS (SELECT 1 FROM awp.tasks y WHERE y.status = 'ready' AND y.limit_buckets IS NOT NULL) THEN
    RETURN;
  END IF;
  v_kinds := awp._kinds_with_room(kinds);
  v_sets := awp._limited_sets(v_kinds, p_only_run);
  IF cardinality(v_kinds) = 0 OR cardinality(v_sets) = 0 THEN
    RETURN;
  END IF;
  cur := awp._limited_candidates(v_kinds, p_only_run, v_sets, p_n);
  WHILE created < p_n LOOP
    FETCH cur INTO c_run, c_key, c_set, c_conc, c_exec;
    EXIT WHEN NOT FOUND;
    CONTINUE WHEN c_run = ANY (v_skip) OR coalesce((kinds->>c_exec)::integer, 0) < 1;
    v_got := awp._limited_take(c_run, c_key, c_set, c_conc, NULL);
    IF v_got = 'run' THEN
      v_skip := v_skip || c_run;
    ELSIF v_got = 'ok' THEN
      v_kind := awp._dispatch_task(c_run, c_key);
      kinds := jsonb_set(kinds, ARRAY[v_kind], to_jsonb((kinds->>v_kind)::integer - 1));
      created := created + 1;
    END IF;
  END LOOP;
  CLOSE cur;
END $$;
COMMENT ON FUNCTION awp._dispatch_limited(jsonb, integer, text) IS 'Creates up to n pending dispatches for ready tasks with limits within a budget; returns the budget left and the count.';

-- awp._rate_limit_started(): trigger function on tasks (row UPDATE OF status, WHEN a task with limits starts running):
-- records the start in awp.limit_starts for each of its buckets, at the database time its caller wrote on the row
-- (updated_at: the lease's leased_at). Locks: none (an insert).
CREATE OR REPLACE FUNCTION awp._rate_limit_started() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  INSERT INTO awp.limit_starts (bucket, started_at) SELECT b, NEW.updated_at FROM unnest(NEW.limit_buckets) b;
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._rate_limit_started() IS 'Trigger on tasks: records the start of a task with limits for each of its buckets.';

DROP TRIGGER IF EXISTS tasks_rate_limit_started ON awp.tasks;
CREATE TRIGGER tasks_rate_limit_started AFTER UPDATE OF status ON awp.tasks
  FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status <> 'running' AND NEW.limit_buckets IS NOT NULL)
  EXECUTE FUNCTION awp._rate_limit_started();

-- awp._prune_limit_starts(now): deletes the starts no window counts any more (older than their limit's window, or
-- of a limit without a window or not defined). A coordinator pass calls it. Returns the number deleted.
-- Locks: the deleted rows.
CREATE OR REPLACE FUNCTION awp._prune_limit_starts(p_now timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n integer;
BEGIN
  DELETE FROM awp.limit_starts s
   WHERE s.started_at <= p_now - coalesce((SELECT make_interval(secs => l.window_ms / 1000.0) FROM awp.limits l
                                            WHERE l.name = awp._bucket_limit(s.bucket)), interval '0');
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._prune_limit_starts(timestamptz) IS 'Deletes the limit starts no window counts any more; returns the count.';

-- awp.set_limit(name, max_in_flight, per_window, window_ms): defines or replaces a named limit (docs/limits.md).
-- max_in_flight and/or per_window with window_ms; NULL leaves that rule out. Returns the limit as awp.list_limits
-- shows it. Raises AWREQ for a bad name, a number below 1, per_window without window_ms (or the reverse), or no
-- rule at all. Takes effect for the next dispatch (tasks already in flight are not withdrawn when it is lowered);
-- the coordinator is woken, so tasks it holds no more are dispatched at once. Locks: the limit's row.
CREATE OR REPLACE FUNCTION awp.set_limit(p_name text, p_max_in_flight integer DEFAULT NULL,
                                         p_per_window integer DEFAULT NULL, p_window_ms integer DEFAULT NULL)
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := awp._now();
BEGIN
  IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9_.:-]{1,64}$' THEN
    PERFORM awp._raise_invalid_request('invalid limit name',
                                       'a limit name has 1-64 characters among A-Z a-z 0-9 _ . : -');
  ELSIF p_max_in_flight < 1 OR p_per_window < 1 OR p_window_ms < 1 THEN
    PERFORM awp._raise_invalid_request('invalid limit',
                                       'max_in_flight, per_window and window_ms must be at least 1');
  ELSIF (p_per_window IS NULL) <> (p_window_ms IS NULL) THEN
    PERFORM awp._raise_invalid_request('invalid limit', 'per_window and window_ms go together');
  ELSIF p_max_in_flight IS NULL AND p_per_window IS NULL THEN
    PERFORM awp._raise_invalid_request('invalid limit', 'a limit needs max_in_flight, or per_window with window_ms');
  END IF;
  INSERT INTO awp.limits AS l (name, max_in_flight, per_window, window_ms, created_at, updated_at)
  VALUES (p_name, p_max_in_flight, p_per_window, p_window_ms, v_now, v_now)
  ON CONFLICT ON CONSTRAINT limits_pkey DO UPDATE
     SET max_in_flight = excluded.max_in_flight, per_window = excluded.per_window, window_ms = excluded.window_ms,
         updated_at = excluded.updated_at;
  PERFORM awp._wake('awp_coordinator', 'limit_set');
  RETURN QUERY SELECT * FROM awp._rate_limit_rows(p_name);
END $$;
COMMENT ON FUNCTION awp.set_limit(text, integer, integer, integer) IS 'Defines or replaces a named rate limit (max_in_flight; per_window per window_ms); AWREQ.';

-- awp._rate_limit_rows(name): the limits (one, or all when name is NULL) with in_flight (queued + running tasks
-- holding any bucket of the limit) and held (ready tasks it holds now), as awp.list_limits. Locks: none.
CREATE OR REPLACE FUNCTION awp._rate_limit_rows(p_name text)
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  WITH sets AS MATERIALIZED (   -- the ready tasks with limits per bucket set, each set judged once
    SELECT x.limit_buckets, x.n, awp._buckets_hold(x.limit_buckets, awp._now()) IS NOT NULL AS held
      FROM (SELECT t.limit_buckets, count(*)::integer AS n FROM awp.tasks t
             WHERE t.status = 'ready' AND t.limit_buckets IS NOT NULL GROUP BY 1) x
  ), flying AS MATERIALIZED (
    SELECT t.limit_buckets FROM awp.tasks t WHERE t.status IN ('queued', 'running') AND t.limit_buckets IS NOT NULL
  )
  SELECT l.name, l.max_in_flight, l.per_window, l.window_ms,
         (SELECT count(*)::integer FROM flying f WHERE EXISTS (SELECT 1 FROM unnest(f.limit_buckets) b
                                                               WHERE awp._bucket_limit(b) = l.name)),
         (SELECT coalesce(sum(x.n), 0)::integer FROM sets x
           WHERE x.held AND EXISTS (SELECT 1 FROM unnest(x.limit_buckets) b WHERE awp._bucket_limit(b) = l.name)),
         l.created_at, l.updated_at
    FROM awp.limits l
   WHERE p_name IS NULL OR l.name = p_name
   ORDER BY l.name
$$;
COMMENT ON FUNCTION awp._rate_limit_rows(text) IS 'Limits with their in-flight and held task counts (one, or all).';

-- awp.list_limits(): every named limit, by name, with in_flight and held (see awp._rate_limit_rows). Locks: none.
CREATE OR REPLACE FUNCTION awp.list_limits()
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp._rate_limit_rows(NULL)
$$;
COMMENT ON FUNCTION awp.list_limits() IS 'Every named rate limit with its in-flight and held task counts.';

-- awp.get_limit(name): one limit as awp.list_limits shows it; AWNTF when there is none. Locks: none.
CREATE OR REPLACE FUNCTION awp.get_limit(p_name text)
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY SELECT * FROM awp._rate_limit_rows(p_name);
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('limit not found', format('no limit %s', p_name));
  END IF;
END $$;
COMMENT ON FUNCTION awp.get_limit(text) IS 'One named rate limit with its in-flight and held task counts; AWNTF.';

-- awp.delete_limit(name): removes a named limit; the tasks that name it then wait (rate_limited, "not defined")
-- until it is defined again. True when it existed, false when there was none (deleting twice is not an error).
-- Locks: the limit's row.
CREATE OR REPLACE FUNCTION awp.delete_limit(p_name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  DELETE FROM awp.limits l WHERE l.name = p_name;
  RETURN FOUND;
END $$;
COMMENT ON FUNCTION awp.delete_limit(text) IS 'Removes a named rate limit (its tasks wait until it is defined again); false when none.';
