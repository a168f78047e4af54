-- The router's hand-written functions (docs/scale-out.md; applied after 00_router.sql and the generated proxies by
-- `awp router init`, python/awp/dev/router.py): the public awp.* functions that are not one call on one shard.
-- Each has the signature of the shard's function of that name (python/tests/sql/test_router.py compares them) and
-- calls shards through awp_shard.<name>(shard, ...), the generated one-shard proxies. PL/Proxy runs each remote
-- call in a transaction of its own: a function here that calls several shards is not atomic across them, and says
-- what a failure half-way leaves (always something a retry of the same call settles).

-- The rows of awp.complete_and_claim_many as the router collects them from several shards.
DROP TYPE IF EXISTS awp_router.many_row CASCADE;
CREATE TYPE awp_router.many_row AS (item integer, error jsonb, lease awp.lease);

-- awp_router.is_list_of(items, field): items is a JSON array of objects whose `field` is a string. Anything else
-- goes whole to shard 0, whose function raises the error a single database raises (AWREQ).
CREATE OR REPLACE FUNCTION awp_router.is_list_of(p_items jsonb, p_field text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_typeof(p_items) = 'array'
     AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) e
                      WHERE jsonb_typeof(e) <> 'object' OR jsonb_typeof(e -> p_field) IS DISTINCT FROM 'string')
$$;

-- awp_router.other_shards(first): the shards but `first`, from the one after it round.
CREATE OR REPLACE FUNCTION awp_router.other_shards(p_first integer) RETURNS SETOF integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT (p_first + i) % n FROM (SELECT awp_router.shard_count() AS n) c, generate_series(1, c.n - 1) i
$$;

-- awp_router.unreachable(sqlstate, message): whether an error says a shard could not be reached (PL/Proxy's own
-- connection errors, XX000, or a lost or refused connection's class 08 / 57P0x): claims and heartbeats then go on
-- with the other shards, so one shard down (a failover) does not stop the work of the others. (The gateway knows the
-- same messages to answer 503: python/awp/server/errors.py, _SHARD_UNREACHABLE.)
CREATE OR REPLACE FUNCTION awp_router.unreachable(p_sqlstate text, p_message text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT left(p_sqlstate, 2) = '08' OR p_sqlstate IN ('57P01', '57P02', '57P03')
      OR (p_sqlstate = 'XX000'
          AND p_message ~ '\(\d+\): (\[[^]]*\] (PQconnectPoll|PQconnectStart|PQconsumeInput|PQflush|PQsendQuery)|connect timeout to|query timeout|Lost result|Unfinished connection)')
$$;

-- awp_router.claim_elsewhere(shards, worker, token, slots, claim_seq): up to `slots` leases from the shards not in
-- `shards` (those already asked), in turn from the one after the first of them. A shard's refusal ends it quietly (the
-- worker's completion was applied; it claims again later); a shard that is down is skipped.
CREATE OR REPLACE FUNCTION awp_router.claim_elsewhere(p_asked integer[], p_worker_id text, p_session_token text,
                                                      p_slots integer, p_claim_seq bigint)
RETURNS SETOF awp.lease
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s    integer;
  got  integer;
  need integer := p_slots;
BEGIN
  FOR s IN SELECT o FROM awp_router.other_shards(p_asked[1]) o WHERE o <> ALL (p_asked) LOOP
    EXIT WHEN need <= 0;
    BEGIN
      RETURN QUERY SELECT * FROM awp_shard.claim_tasks(s, p_worker_id, p_session_token, need, p_claim_seq);
      GET DIAGNOSTICS got = ROW_COUNT;
      need := need - got;
    EXCEPTION WHEN SQLSTATE 'AWSES' OR SQLSTATE 'AWDRN' OR SQLSTATE 'AWCAP' OR SQLSTATE 'AWREQ' THEN
      EXIT;
    WHEN OTHERS THEN
      IF NOT awp_router.unreachable(SQLSTATE, SQLERRM) THEN
        RAISE;
      END IF;   -- that shard is down: the next one
    END;
  END LOOP;
END $$;

-- awp_router.adopt_worker(shard, worker_id): the worker session of shard 0 copied to `shard` (its token as its hash).
CREATE OR REPLACE FUNCTION awp_router.adopt_worker(p_shard integer, p_worker_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w record;
BEGIN
  SELECT * INTO w FROM awp_shard._worker_record(0, p_worker_id);
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  RETURN awp_shard._adopt_worker(p_shard, w.worker_id, w.display_name, w.executor_kinds, w.max_concurrency,
                                 w.protocol_version, w.session_token_hash, w.actions);
END $$;

-- Runs: a new run goes to the shard of its key (the run's idempotency key, else the request's Idempotency-Key), so a
-- retry finds it; without a key, to a shard at random. A batch goes whole to one shard (all-or-nothing as on one
-- database): the shard of its first item's key (docs/scale-out.md: a later single start with another item's key
-- may land elsewhere).
CREATE OR REPLACE FUNCTION awp.start_run(p_workflow_id text, p_version integer DEFAULT NULL,
                                         p_idempotency_key text DEFAULT NULL, p_input jsonb DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp_shard.start_run(awp_router.new_run_shard(p_idempotency_key), p_workflow_id, p_version,
                             p_idempotency_key, p_input)
$$;

CREATE OR REPLACE FUNCTION awp.start_run(p_workflow_id text, p_version integer, p_idempotency_key text,
                                         p_input jsonb, p_priority integer)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp_shard.start_run(awp_router.new_run_shard(p_idempotency_key), p_workflow_id, p_version,
                             p_idempotency_key, p_input, p_priority)
$$;

CREATE OR REPLACE FUNCTION awp.start_run_idempotent(p_idempotency_key text, p_request_hash text, p_workflow_id text,
                                                    p_version integer, p_input jsonb DEFAULT NULL)
RETURNS TABLE (run_id text, status text, replayed boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_shard.start_run_idempotent(awp_router.new_run_shard(p_idempotency_key), p_idempotency_key,
                                               p_request_hash, p_workflow_id, p_version, p_input)
$$;

CREATE OR REPLACE FUNCTION awp.start_run_idempotent(p_idempotency_key text, p_request_hash text, p_workflow_id text,
                                                    p_version integer, p_input jsonb, p_priority integer)
RETURNS TABLE (run_id text, status text, replayed boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_shard.start_run_idempotent(awp_router.new_run_shard(p_idempotency_key), p_idempotency_key,
                                               p_request_hash, p_workflow_id, p_version, p_input, p_priority)
$$;

-- awp_router.batch_shard(items): the shard of a batch start: its first item's key's (at random without one).
CREATE OR REPLACE FUNCTION awp_router.batch_shard(p_items jsonb) RETURNS integer
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
  SELECT awp_router.new_run_shard(CASE WHEN jsonb_typeof(p_items) = 'array' AND jsonb_typeof(p_items -> 0) = 'object'
                                       THEN p_items -> 0 ->> 'idempotency_key' END)
$$;

CREATE OR REPLACE FUNCTION awp.start_runs(p_workflow_id text, p_version integer, p_items jsonb)
RETURNS TABLE (item integer, run_id text, status text)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_shard.start_runs(awp_router.batch_shard(p_items), p_workflow_id, p_version, p_items)
$$;

CREATE OR REPLACE FUNCTION awp.start_runs_idempotent(p_workflow_id text, p_version integer, p_items jsonb)
RETURNS TABLE (item integer, run_id text, status text, replayed boolean)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_shard.start_runs_idempotent(awp_router.batch_shard(p_items), p_workflow_id, p_version, p_items)
$$;

-- awp.list_runs: every shard's page after the same key, merged newest first. A cursor without its created_at is
-- completed from the run's own shard (the other shards do not have that run).
CREATE OR REPLACE FUNCTION awp.list_runs(p_workflow_id text DEFAULT NULL, p_status text DEFAULT NULL,
                                         p_after text DEFAULT NULL, p_limit integer DEFAULT 50,
                                         p_after_created_at timestamptz DEFAULT NULL)
RETURNS TABLE (run_id text, workflow_id text, workflow_version integer, status text, revision bigint,
               cancel_requested_at timestamptz, created_at timestamptz, started_at timestamptz,
               finished_at timestamptz, concurrency integer, idempotency_key text, task_counts jsonb,
               schedule_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_at timestamptz := p_after_created_at;
BEGIN
  IF p_after IS NOT NULL AND v_at IS NULL THEN
    BEGIN
      SELECT g.created_at INTO v_at FROM awp_shard.get_run(awp_router.shard_of(p_after), p_after) g;
    EXCEPTION WHEN SQLSTATE 'AWNTF' OR SQLSTATE 'AWREQ' THEN
      v_at := NULL;
    END;
    IF v_at IS NULL THEN
      RETURN;   -- an unknown cursor: no rows, as on one database
    END IF;
  END IF;
  RETURN QUERY
  SELECT x.* FROM awp_shard.list_runs_all(p_workflow_id, p_status, p_after, p_limit, v_at) x
   ORDER BY x.created_at DESC, x.run_id DESC LIMIT p_limit;
END $$;

-- awp.list_schedules: every shard's schedules (each lives on the shard of its id), merged by id.
CREATE OR REPLACE FUNCTION awp.list_schedules(p_after text DEFAULT NULL, p_limit integer DEFAULT NULL)
RETURNS SETOF awp.schedules
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_shard.list_schedules_all(p_after, p_limit) x ORDER BY x.schedule_id LIMIT p_limit
$$;

-- Workers: one session on every shard (awp.register_worker makes it on shard 0 and copies it); its reads are shard
-- 0's row with the leases it holds on every shard; drains reach every shard.
CREATE OR REPLACE FUNCTION awp.register_worker(p_display_name text, p_executor_kinds text[], p_max_concurrency integer,
                                               p_protocol_version integer DEFAULT 1, p_actions jsonb DEFAULT NULL)
RETURNS TABLE (worker_id text, session_token text, heartbeat_interval_ms integer, lease_duration_ms integer,
               protocol_version integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  r record;
  s integer;
BEGIN
  SELECT * INTO r FROM awp_shard.register_worker(0, p_display_name, p_executor_kinds, p_max_concurrency,
                                                 p_protocol_version, p_actions);
  FOR s IN SELECT * FROM awp_router.other_shards(0) LOOP
    PERFORM awp_router.adopt_worker(s, r.worker_id);
  END LOOP;
  RETURN QUERY SELECT r.worker_id, r.session_token, r.heartbeat_interval_ms, r.lease_duration_ms, r.protocol_version;
END $$;

-- awp_router.leases_elsewhere(worker ids): the leases those workers hold on the shards other than 0.
CREATE OR REPLACE FUNCTION awp_router.leases_elsewhere(p_worker_ids text[])
RETURNS TABLE (worker_id text, active_leases bigint)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  s  integer;
  id text;
BEGIN
  FOR s IN SELECT * FROM awp_router.other_shards(0) LOOP
    FOREACH id IN ARRAY p_worker_ids LOOP
      BEGIN
        RETURN QUERY SELECT w.worker_id, w.active_leases::bigint FROM awp_shard.get_worker(s, id) w;
      EXCEPTION WHEN SQLSTATE 'AWNTF' THEN
        NULL;   -- not on this shard (added after the worker registered)
      END;
    END LOOP;
  END LOOP;
END $$;

CREATE OR REPLACE FUNCTION awp.get_worker(p_worker_id text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[], max_concurrency integer,
               active_leases integer, last_heartbeat_at timestamptz, registered_at timestamptz, stopped_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT w.worker_id, w.display_name, w.status, w.executor_kinds, w.max_concurrency,
         w.active_leases + coalesce((SELECT sum(e.active_leases) FROM awp_router.leases_elsewhere(ARRAY[w.worker_id]) e), 0)::integer,
         w.last_heartbeat_at, w.registered_at, w.stopped_at
    FROM awp_shard.get_worker(0, p_worker_id) w
$$;

CREATE OR REPLACE FUNCTION awp.list_workers(p_after_registered_at timestamptz DEFAULT NULL,
                                            p_after_worker_id text DEFAULT NULL, p_limit integer DEFAULT NULL)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[], max_concurrency integer,
               active_leases integer, last_heartbeat_at timestamptz, registered_at timestamptz, stopped_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  WITH w AS (
    SELECT * FROM awp_shard.list_workers(0, p_after_registered_at, p_after_worker_id, p_limit)
           WITH ORDINALITY w(worker_id, display_name, status, executor_kinds, max_concurrency, active_leases,
                             last_heartbeat_at, registered_at, stopped_at, o)
  ), e AS (
    SELECT e.worker_id, sum(e.active_leases) AS n
      FROM awp_router.leases_elsewhere(ARRAY(SELECT w.worker_id FROM w WHERE w.status IN ('active', 'draining'))) e
     GROUP BY e.worker_id
  )
  SELECT w.worker_id, w.display_name, w.status, w.executor_kinds, w.max_concurrency,
         (w.active_leases + coalesce(e.n, 0))::integer, w.last_heartbeat_at, w.registered_at, w.stopped_at
    FROM w LEFT JOIN e ON e.worker_id = w.worker_id ORDER BY w.o
$$;

-- awp_router.drain_everywhere(worker_id, session_token, by_worker): the drain on every shard, shard 0 first (its
-- errors are the answer: AWSES for the worker's own drain, AWNTF for the operator's), the others' leases added; a shard
-- that does not know the worker (added after it registered) is skipped. by_worker: awp.drain_worker (the worker's
-- session), else awp.request_drain (an operator's).
CREATE OR REPLACE FUNCTION awp_router.drain_everywhere(p_worker_id text, p_session_token text, p_by_worker boolean)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[], max_concurrency integer,
               active_leases integer, last_heartbeat_at timestamptz, registered_at timestamptz, stopped_at timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  r record;
  s integer;
  n bigint := 0;
BEGIN
  IF p_by_worker THEN
    SELECT * INTO r FROM awp_shard.drain_worker(0, p_worker_id, p_session_token);
  ELSE
    SELECT * INTO r FROM awp_shard.request_drain(0, p_worker_id);
  END IF;
  FOR s IN SELECT * FROM awp_router.other_shards(0) LOOP
    BEGIN
      IF p_by_worker THEN
        n := n + coalesce((SELECT sum(d.active_leases) FROM awp_shard.drain_worker(s, p_worker_id, p_session_token) d), 0);
      ELSE
        n := n + coalesce((SELECT sum(d.active_leases) FROM awp_shard.request_drain(s, p_worker_id) d), 0);
      END IF;
    EXCEPTION WHEN SQLSTATE 'AWSES' OR SQLSTATE 'AWNTF' THEN
      NULL;   -- not on this shard
    END;
  END LOOP;
  RETURN QUERY SELECT r.worker_id, r.display_name, r.status, r.executor_kinds, r.max_concurrency,
                      (r.active_leases + n)::integer, r.last_heartbeat_at, r.registered_at, r.stopped_at;
END $$;

CREATE OR REPLACE FUNCTION awp.drain_worker(p_worker_id text, p_session_token text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[], max_concurrency integer,
               active_leases integer, last_heartbeat_at timestamptz, registered_at timestamptz, stopped_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_router.drain_everywhere(p_worker_id, p_session_token, true)
$$;

CREATE OR REPLACE FUNCTION awp.request_drain(p_worker_id text)
RETURNS TABLE (worker_id text, display_name text, status text, executor_kinds text[], max_concurrency integer,
               active_leases integer, last_heartbeat_at timestamptz, registered_at timestamptz, stopped_at timestamptz)
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp_router.drain_everywhere(p_worker_id, NULL, false)
$$;

-- Claims: the shards in turn from one at random, each asked for what is still wanted. A worker's capacity is one
-- for all shards: it never holds more leases than it asked for. The first shard's refusal is the answer (AWSES,
-- AWDRN, AWCAP, AWREQ), a later one's ends the claim quietly; a shard that is down is skipped, and with every shard
-- down the claim fails as it would on one database (503 for the worker).
CREATE OR REPLACE FUNCTION awp.claim_tasks(p_worker_id text, p_session_token text, p_slots integer,
                                           p_claim_seq bigint DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  n       integer := awp_router.shard_count();
  v_first integer := floor(random() * awp_router.shard_count())::integer;
  i       integer;
  got     integer;
  need    integer := p_slots;
  v_down  integer := 0;
  v_state text;
  v_error text;
BEGIN
  FOR i IN 0 .. n - 1 LOOP
    EXIT WHEN i > 0 AND need <= 0;
    BEGIN
      RETURN QUERY SELECT * FROM awp_shard.claim_tasks((v_first + i) % n, p_worker_id, p_session_token, need,
                                                       p_claim_seq);
      GET DIAGNOSTICS got = ROW_COUNT;
      need := need - got;
    EXCEPTION WHEN OTHERS THEN
      IF i > 0 AND SQLSTATE IN ('AWSES', 'AWDRN', 'AWCAP', 'AWREQ') THEN
        EXIT;
      ELSIF NOT awp_router.unreachable(SQLSTATE, SQLERRM) OR n = 1 THEN
        RAISE;
      END IF;
      v_down := v_down + 1;   -- that shard is down: the next one
      v_state := SQLSTATE;
      v_error := SQLERRM;
    END;
  END LOOP;
  IF v_down = n THEN
    RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_error;
  END IF;
END $$;

-- awp.complete_and_claim: on the lease's shard; slots that shard leaves free are claimed from the others.
CREATE OR REPLACE FUNCTION awp.complete_and_claim(p_worker_id text, p_session_token text, p_dispatch_id text,
                                                  p_lease_token text, p_result jsonb, p_slots integer,
                                                  p_claim_seq bigint DEFAULT NULL, p_live_output jsonb DEFAULT NULL)
RETURNS SETOF awp.lease
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_shard integer := awp_router.shard_of(p_dispatch_id);
  got     integer;
BEGIN
  RETURN QUERY SELECT * FROM awp_shard.complete_and_claim(v_shard, p_worker_id, p_session_token, p_dispatch_id,
                                                          p_lease_token, p_result, p_slots, p_claim_seq, p_live_output);
  GET DIAGNOSTICS got = ROW_COUNT;
  IF p_slots - got > 0 THEN
    RETURN QUERY SELECT * FROM awp_router.claim_elsewhere(ARRAY[v_shard], p_worker_id, p_session_token, p_slots - got,
                                                          p_claim_seq);
  END IF;
END $$;

-- awp.complete_and_claim_many: the items of each shard in one call there (each shard's part is one transaction);
-- then for each applied item whose shard left slots free, a claim on the others.
CREATE OR REPLACE FUNCTION awp.complete_and_claim_many(p_items jsonb)
RETURNS TABLE (item integer, error jsonb, lease awp.lease)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  g      record;
  rows   awp_router.many_row[] := '{}';
  extra  awp.lease[];
  it     record;
BEGIN
  IF NOT awp_router.is_list_of(p_items, 'dispatch_id') OR awp_router.shard_count() = 1 THEN
    RETURN QUERY SELECT * FROM awp_shard.complete_and_claim_many(0, p_items);
    RETURN;
  END IF;
  FOR g IN SELECT awp_router.shard_of(e ->> 'dispatch_id') AS shard, jsonb_agg(e ORDER BY o) AS items,
                  array_agg(o::integer ORDER BY o) AS pos
             FROM jsonb_array_elements(p_items) WITH ORDINALITY a(e, o) GROUP BY 1 ORDER BY 1 LOOP
    rows := rows || ARRAY(SELECT ROW(g.pos[x.item], x.error, x.lease)::awp_router.many_row
                            FROM awp_shard.complete_and_claim_many(g.shard, g.items) x);
  END LOOP;
  FOR it IN
    SELECT o::integer AS o, e, (e ->> 'slots')::integer - count(r.lease) FILTER (WHERE (r.lease).dispatch_id IS NOT NULL) AS free
      FROM jsonb_array_elements(p_items) WITH ORDINALITY a(e, o)
      JOIN unnest(rows) r ON r.item = a.o
     WHERE jsonb_typeof(e -> 'slots') = 'number'
     GROUP BY a.o, a.e
    HAVING bool_and(r.error IS NULL)
  LOOP
    CONTINUE WHEN it.free <= 0;
    extra := ARRAY(SELECT l FROM awp_router.claim_elsewhere(ARRAY[awp_router.shard_of(it.e ->> 'dispatch_id')],
                                                           it.e ->> 'worker_id', it.e ->> 'session_token', it.free::integer,
                                                           (it.e ->> 'claim_seq')::bigint) l);
    IF cardinality(extra) > 0 THEN
      rows := ARRAY(SELECT r FROM unnest(rows) r WHERE NOT (r.item = it.o AND (r.lease).dispatch_id IS NULL))
              || ARRAY(SELECT ROW(it.o, NULL, l)::awp_router.many_row FROM unnest(extra) l);
    END IF;
  END LOOP;
  RETURN QUERY SELECT u.item, u.error, u.lease FROM unnest(rows) WITH ORDINALITY u(item, error, lease, k)
    ORDER BY u.item, u.k;
END $$;

-- awp.complete_tasks: each shard's results in one call there; the slots go to the first shard called, what it
-- leaves to the next, then to a claim on the rest (awp_router.claim_elsewhere). Results in the order given.
CREATE OR REPLACE FUNCTION awp.complete_tasks(p_worker_id text, p_session_token text, p_results jsonb,
                                              p_slots integer DEFAULT 0, p_claim_seq bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  g       record;
  a       jsonb;
  results jsonb := '{}';   -- position -> result
  leases  jsonb := '[]';
  need    integer := coalesce(p_slots, 0);
  called  integer[] := '{}';
BEGIN
  IF NOT awp_router.is_list_of(p_results, 'dispatch_id') OR awp_router.shard_count() = 1
     OR jsonb_array_length(p_results) = 0 THEN
    RETURN awp_shard.complete_tasks(0, p_worker_id, p_session_token, p_results, p_slots, p_claim_seq);
  END IF;
  FOR g IN SELECT awp_router.shard_of(e ->> 'dispatch_id') AS shard, jsonb_agg(e ORDER BY o) AS items,
                  array_agg(o::integer ORDER BY o) AS pos
             FROM jsonb_array_elements(p_results) WITH ORDINALITY x(e, o) GROUP BY 1 ORDER BY 1 LOOP
    a := awp_shard.complete_tasks(g.shard, p_worker_id, p_session_token, g.items, greatest(need, 0), p_claim_seq);
    called := called || g.shard;
    SELECT results || coalesce(jsonb_object_agg(g.pos[k]::text, r), '{}') INTO results
      FROM jsonb_array_elements(a -> 'results') WITH ORDINALITY y(r, k);
    leases := leases || (a -> 'leases');
    need := need - jsonb_array_length(a -> 'leases');
  END LOOP;
  IF need > 0 THEN
    SELECT leases || coalesce(jsonb_agg(to_jsonb(l)), '[]') INTO leases
      FROM awp_router.claim_elsewhere(called, p_worker_id, p_session_token, need, p_claim_seq) l;
  END IF;
  RETURN jsonb_build_object(
    'results', (SELECT jsonb_agg(results -> k::text ORDER BY k) FROM generate_series(1, jsonb_array_length(p_results)) k),
    'leases', leases);
END $$;

-- awp.report_progress_many: each shard's items in one call there; one row per item, in order.
CREATE OR REPLACE FUNCTION awp.report_progress_many(p_worker_id text, p_session_token text, p_items jsonb)
RETURNS TABLE (dispatch_id text, seq bigint, truncated boolean, run_id text, error jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  g   record;
  out jsonb := '[]';
BEGIN
  IF NOT awp_router.is_list_of(p_items, 'dispatch_id') OR awp_router.shard_count() = 1 THEN
    RETURN QUERY SELECT * FROM awp_shard.report_progress_many(0, p_worker_id, p_session_token, p_items);
    RETURN;
  END IF;
  FOR g IN SELECT awp_router.shard_of(e ->> 'dispatch_id') AS shard, jsonb_agg(e ORDER BY o) AS items,
                  array_agg(o::integer ORDER BY o) AS pos
             FROM jsonb_array_elements(p_items) WITH ORDINALITY a(e, o) GROUP BY 1 ORDER BY 1 LOOP
    SELECT out || coalesce(jsonb_agg(to_jsonb(x) || jsonb_build_object('_pos', g.pos[k])), '[]') INTO out
      FROM awp_shard.report_progress_many(g.shard, p_worker_id, p_session_token, g.items) WITH ORDINALITY x(dispatch_id, seq, truncated, run_id, error, k);
  END LOOP;
  RETURN QUERY SELECT r.dispatch_id, r.seq, r.truncated, r.run_id, r.error
    FROM jsonb_array_elements(out) j,
         jsonb_to_record(j) AS r(dispatch_id text, seq bigint, truncated boolean, run_id text, error jsonb, _pos integer)
   ORDER BY r._pos;
END $$;

-- awp.heartbeat: every shard hears the worker (liveness, lost-claim recovery: claimed_through and claims_pending
-- hold for every shard) with the leases it holds there; one row per lease listed, in order.
CREATE OR REPLACE FUNCTION awp.heartbeat(p_worker_id text, p_session_token text, p_leases jsonb,
                                         p_claimed_through bigint DEFAULT NULL, p_claims_pending bigint[] DEFAULT NULL,
                                         p_dropped jsonb DEFAULT NULL)
RETURNS TABLE (dispatch_id text, status text, lease_remaining_ms bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  s       integer;
  out     jsonb := '[]';
  v_heard integer := 0;
  v_error text;
  v_state text;
BEGIN
  IF NOT awp_router.is_list_of(coalesce(p_leases, '[]'), 'dispatch_id')
     OR NOT awp_router.is_list_of(coalesce(p_dropped, '[]'), 'dispatch_id') OR awp_router.shard_count() = 1 THEN
    RETURN QUERY SELECT * FROM awp_shard.heartbeat(0, p_worker_id, p_session_token, p_leases, p_claimed_through,
                                                   p_claims_pending, p_dropped);
    RETURN;
  END IF;
  FOR s IN SELECT sh FROM generate_series(0, awp_router.shard_count() - 1) sh LOOP
    BEGIN
      SELECT out || coalesce(jsonb_agg(to_jsonb(h) || jsonb_build_object('_pos', m.pos[h.k])), '[]') INTO out
        FROM (SELECT coalesce(jsonb_agg(e ORDER BY o), '[]') AS items, array_agg(o::integer ORDER BY o) AS pos
                FROM jsonb_array_elements(coalesce(p_leases, '[]')) WITH ORDINALITY a(e, o)
               WHERE awp_router.shard_of(e ->> 'dispatch_id') = s) m,
             LATERAL awp_shard.heartbeat(s, p_worker_id, p_session_token, m.items, p_claimed_through,
               p_claims_pending, (SELECT coalesce(jsonb_agg(d), '[]') FROM jsonb_array_elements(coalesce(p_dropped, '[]')) d
                                   WHERE awp_router.shard_of(d ->> 'dispatch_id') = s)
             ) WITH ORDINALITY h(dispatch_id, status, lease_remaining_ms, k);
      v_heard := v_heard + 1;
    EXCEPTION WHEN OTHERS THEN
      -- a shard that is down: its leases get no answer (the worker keeps them until it hears, as in an outage),
      -- the others are renewed; with every shard down, the error (503: the worker's outage handling)
      IF NOT awp_router.unreachable(SQLSTATE, SQLERRM) THEN
        RAISE;
      END IF;
      v_error := SQLERRM;
      v_state := SQLSTATE;
    END;
  END LOOP;
  IF v_heard = 0 THEN
    RAISE EXCEPTION USING ERRCODE = v_state, MESSAGE = v_error;
  END IF;
  RETURN QUERY SELECT r.dispatch_id, r.status, r.lease_remaining_ms
    FROM jsonb_array_elements(out) j,
         jsonb_to_record(j) AS r(dispatch_id text, status text, lease_remaining_ms bigint, _pos integer)
   ORDER BY r._pos;
END $$;

-- Rate limits: set on every shard (generated: awp.set_limit, awp.delete_limit) and enforced by each shard for its
-- runs; their reads give shard 0's settings with what every shard holds now.
-- awp_router.limit_counts(): what every shard holds now of each limit, added up.
CREATE OR REPLACE FUNCTION awp_router.limit_counts()
RETURNS TABLE (name text, in_flight integer, held integer)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT a.name, sum(a.in_flight)::integer, sum(a.held)::integer FROM awp_shard.list_limits_all() a GROUP BY a.name
$$;

CREATE OR REPLACE FUNCTION awp.list_limits()
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT z.name, z.max_in_flight, z.per_window, z.window_ms, coalesce(c.in_flight, 0), coalesce(c.held, 0),
         z.created_at, z.updated_at
    FROM awp_shard.list_limits(0) z LEFT JOIN awp_router.limit_counts() c ON c.name = z.name ORDER BY z.name
$$;

CREATE OR REPLACE FUNCTION awp.get_limit(p_name text)
RETURNS TABLE (name text, max_in_flight integer, per_window integer, window_ms integer, in_flight integer,
               held integer, created_at timestamptz, updated_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT * FROM awp.list_limits() l WHERE l.name = (SELECT z.name FROM awp_shard.get_limit(0, p_name) z)   -- AWNTF
$$;
