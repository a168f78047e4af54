-- The router database (docs/scale-out.md; AWP issue 43): the same public awp.* functions as a shard, each a PL/Proxy
-- function (or a PL/pgSQL one over several) that runs the real one on the shard that owns the run, lease or
-- worker. Applied by `awp router init` (python/awp/dev/router.py) as a superuser, in this order: this file, the
-- proxies generated from a shard's catalog (one per public function, same signature), then 20_wrappers.sql.
-- It holds no AWP data: only the shards' connection strings (awp_router.shards).
-- PL/Proxy: CLUSTER 'awp' is configured by the functions below (PL/Proxy's configuration API), with
-- modular_mapping (any number of shards: shard = hash % count), so `RUN ON n` runs on shard n and RUN ON ALL
-- on each shard once. Each remote call is its own transaction on its shard (PL/Proxy has no two-phase commit).

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'awp_owner') THEN
    CREATE ROLE awp_owner NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'awp_gateway') THEN
    CREATE ROLE awp_gateway NOLOGIN;
  END IF;
END $$;

CREATE EXTENSION IF NOT EXISTS plproxy;
CREATE SCHEMA IF NOT EXISTS plproxy;   -- the configuration API below lives here (the extension makes no schema)
REVOKE ALL ON SCHEMA plproxy FROM PUBLIC;
GRANT USAGE ON SCHEMA plproxy TO awp_owner;

CREATE SCHEMA IF NOT EXISTS awp_router AUTHORIZATION awp_owner;
REVOKE ALL ON SCHEMA awp_router FROM PUBLIC;

-- The shards, numbered from 0 without gaps (a shard's number is in its run ids: db/functions/shards.sql). connstr is
-- a libpq connection string of the shard's database for the router's login there (a member of awp_router), with its
-- password: only awp_owner reads this table.
CREATE TABLE IF NOT EXISTS awp_router.shards (
  shard    integer PRIMARY KEY,
  connstr  text NOT NULL,
  added_at timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT shard_number_in_range CHECK (shard BETWEEN 0 AND 255)
);
ALTER TABLE awp_router.shards OWNER TO awp_owner;
CREATE TABLE IF NOT EXISTS awp_router.config (
  only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
  version  integer NOT NULL
);
ALTER TABLE awp_router.config OWNER TO awp_owner;
INSERT INTO awp_router.config (version) VALUES (1) ON CONFLICT DO NOTHING;

-- Any change of the shards bumps the configuration's version: PL/Proxy reloads it at the next call of each session.
CREATE OR REPLACE FUNCTION awp_router.bump_version() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM generate_series(0, (SELECT count(*) - 1 FROM awp_router.shards)::integer) i
              WHERE NOT EXISTS (SELECT 1 FROM awp_router.shards s WHERE s.shard = i)) THEN
    RAISE EXCEPTION 'shards must be numbered 0 to n-1 without gaps' USING ERRCODE = 'AWREQ';
  END IF;
  UPDATE awp_router.config SET version = version + 1;
  RETURN NULL;
END $$;
ALTER FUNCTION awp_router.bump_version() OWNER TO awp_owner;
DROP TRIGGER IF EXISTS shards_changed ON awp_router.shards;
CREATE TRIGGER shards_changed AFTER INSERT OR UPDATE OR DELETE ON awp_router.shards
  FOR EACH STATEMENT EXECUTE FUNCTION awp_router.bump_version();

-- PL/Proxy's configuration API for cluster 'awp'. They run as awp_owner (the proxies are SECURITY DEFINER
-- functions of awp_owner), and only awp_owner may call them: the connection strings hold passwords.
CREATE OR REPLACE FUNCTION plproxy.get_cluster_version(cluster_name text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF cluster_name = 'awp' THEN
    RETURN (SELECT c.version FROM awp_router.config c);
  END IF;
  RAISE EXCEPTION 'unknown PL/Proxy cluster %', cluster_name;
END $$;

CREATE OR REPLACE FUNCTION plproxy.get_cluster_partitions(cluster_name text) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF cluster_name = 'awp' THEN
    IF NOT EXISTS (SELECT 1 FROM awp_router.shards) THEN
      RAISE EXCEPTION 'the router has no shard (awp router init)' USING ERRCODE = 'AWREQ';
    END IF;
    RETURN QUERY SELECT s.connstr FROM awp_router.shards s ORDER BY s.shard;
    RETURN;
  END IF;
  RAISE EXCEPTION 'unknown PL/Proxy cluster %', cluster_name;
END $$;

CREATE OR REPLACE FUNCTION plproxy.get_cluster_config(IN cluster_name text, OUT key text, OUT val text)
RETURNS SETOF record
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  key := 'modular_mapping'; val := '1'; RETURN NEXT;       -- shard = hash % count: any number of shards
  key := 'connection_lifetime'; val := '1800'; RETURN NEXT; -- a session's connections are renewed every 30 min
  RETURN;
END $$;

DO $$
DECLARE
  f regprocedure;
BEGIN
  FOREACH f IN ARRAY ARRAY['plproxy.get_cluster_version(text)', 'plproxy.get_cluster_partitions(text)',
                           'plproxy.get_cluster_config(text)']::regprocedure[] LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO awp_owner', f);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
  END LOOP;
END $$;

-- awp_router.shard_of(id): the shard of a run id or a dispatch id: the two hex digits after the time
-- (db/functions/shards.sql, awp._new_time_id); 0 for anything else (that shard then answers "not found", or the
-- error of a malformed id, as a single database would).
CREATE OR REPLACE FUNCTION awp_router.shard_of(p_id text) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN p_id ~ '^(run|dsp)_t[0-9a-f]{14}' THEN ('x' || substr(p_id, 18, 2))::bit(8)::integer ELSE 0 END
$$;

-- awp_router.shard_count(): how many shards there are.
CREATE OR REPLACE FUNCTION awp_router.shard_count() RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT count(*)::integer FROM awp_router.shards
$$;

-- awp_router.shard_for_key(key): the shard a keyed new object goes to (a run's idempotency key, a schedule id):
-- always the same one for the same key while the number of shards is unchanged (docs/scale-out.md, Adding a shard).
CREATE OR REPLACE FUNCTION awp_router.shard_for_key(p_key text) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN p_key IS NULL THEN 0 ELSE abs(hashtext(p_key) % awp_router.shard_count()) END
$$;

-- awp_router.new_run_shard(key): the shard of a new run: by its key when it has one (a retry finds the run, or its
-- idempotency record, where it went), else one at random.
CREATE OR REPLACE FUNCTION awp_router.new_run_shard(p_key text) RETURNS integer
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN p_key IS NULL THEN floor(random() * awp_router.shard_count())::integer
              ELSE awp_router.shard_for_key(p_key) END
$$;

-- awp_router.jsonb_sum(a, b): a and b added where both hold numbers at the same path (objects key by key);
-- anything else is a's (b's where a has nothing). Merges the shards' counters (metrics, statuses, prune counts).
CREATE OR REPLACE FUNCTION awp_router.jsonb_sum(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k text;
  v jsonb;
  r jsonb;
BEGIN
  IF a IS NULL OR jsonb_typeof(a) = 'null' THEN
    RETURN b;
  ELSIF b IS NULL OR jsonb_typeof(b) = 'null' THEN
    RETURN a;
  ELSIF jsonb_typeof(a) = 'number' AND jsonb_typeof(b) = 'number' THEN
    RETURN to_jsonb(a::numeric + b::numeric);
  ELSIF jsonb_typeof(a) = 'object' AND jsonb_typeof(b) = 'object' THEN
    r := a;
    FOR k, v IN SELECT * FROM jsonb_each(b) LOOP
      r := jsonb_set(r, ARRAY[k], coalesce(awp_router.jsonb_sum(a -> k, v), 'null'::jsonb), true);
    END LOOP;
    RETURN r;
  END IF;
  RETURN a;
END $$;
-- Ownership and grants of every function here: python/awp/dev/router.py (GRANTS_SQL), once all are made.
