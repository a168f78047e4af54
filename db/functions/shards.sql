-- A database as one shard of several behind a PL/Proxy router (docs/scale-out.md; migration 0024; the router's
-- functions: db/router/). A shard is an ordinary AWP database with its number in awp.shard: its run ids (and so its
-- dispatch ids) carry that number, everything else is unchanged (its own coordinator, retention, invariants).

-- awp._shard_index(): this database's shard number, NULL when it is no shard.
CREATE OR REPLACE FUNCTION awp._shard_index() RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT s.shard_index FROM awp.shard s
$$;
COMMENT ON FUNCTION awp._shard_index() IS 'This database''s shard number (awp.shard), NULL when it is no shard.';

-- awp._set_shard_index(index): makes this database shard `index` (awp router init / add-shard, as the owner). The
-- number is in every run id made from then on, so it cannot change once a run exists (AWREQ); setting the same
-- number again does nothing.
CREATE OR REPLACE FUNCTION awp._set_shard_index(p_index integer) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_old integer := awp._shard_index();
BEGIN
  IF p_index IS NULL OR p_index NOT BETWEEN 0 AND 255 THEN
    PERFORM awp._raise_invalid_request('invalid shard number', 'a shard number is from 0 to 255');
  END IF;
  IF v_old IS NOT DISTINCT FROM p_index THEN
    RETURN p_index;
  END IF;
  IF EXISTS (SELECT 1 FROM awp.runs) THEN
    PERFORM awp._raise_invalid_request('the shard number cannot change',
      format('this database holds runs made as shard %s; a shard''s number is in its run ids', coalesce(v_old::text, 'none')));
  END IF;
  INSERT INTO awp.shard (shard_index) VALUES (p_index)
  ON CONFLICT (only_row) DO UPDATE SET shard_index = excluded.shard_index, set_at = now();
  RETURN p_index;
END $$;
COMMENT ON FUNCTION awp._set_shard_index(integer) IS 'Makes this database a shard with that number (only while it holds no run).';

-- awp._worker_record(worker_id): what the router copies of a worker session from shard 0 to another shard (the
-- token only as its hash). Granted to awp_router only.
CREATE OR REPLACE FUNCTION awp._worker_record(p_worker_id text)
RETURNS TABLE (worker_id text, display_name text, executor_kinds text[], max_concurrency integer,
               protocol_version integer, session_token_hash bytea, actions jsonb, status text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT w.worker_id, w.display_name, w.executor_kinds, w.max_concurrency, w.protocol_version,
         w.session_token_hash, w.actions, w.status
    FROM awp.workers w WHERE w.worker_id = p_worker_id
$$;
COMMENT ON FUNCTION awp._worker_record(text) IS 'A worker session as the router copies it to the other shards (awp_router only).';

-- awp._adopt_worker(...): the same worker session on this shard (the router's awp.register_worker: one worker id and
-- session token on every shard, so one worker serves them all). An id already here is left as it is (a retry).
-- Locks: none (insert); wakes the coordinator (new capacity). Granted to awp_router only.
CREATE OR REPLACE FUNCTION awp._adopt_worker(p_worker_id text, p_display_name text, p_executor_kinds text[],
                                             p_max_concurrency integer, p_protocol_version integer,
                                             p_session_token_hash bytea, p_actions jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := awp._now();
  v_n   integer;
BEGIN
  IF p_worker_id IS NULL OR left(p_worker_id, 4) <> 'wkr_' THEN
    PERFORM awp._raise_invalid_request('invalid worker id', 'a worker id begins with wkr_');
  END IF;
  INSERT INTO awp.workers (worker_id, display_name, executor_kinds, max_concurrency, protocol_version,
                           session_token_hash, registered_at, last_heartbeat_at, actions)
  VALUES (p_worker_id, p_display_name, p_executor_kinds, p_max_concurrency, p_protocol_version,
          p_session_token_hash, v_now, v_now, p_actions)
  ON CONFLICT (worker_id) DO NOTHING;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    PERFORM awp._wake('awp_coordinator', 'worker_registered');
  END IF;
  RETURN v_n > 0;
END $$;
COMMENT ON FUNCTION awp._adopt_worker(text, text, text[], integer, integer, bytea, jsonb) IS 'The router''s copy of a worker session on another shard (awp_router only).';
