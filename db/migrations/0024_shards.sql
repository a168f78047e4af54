-- 0024_shards: what a database needs to be one shard of several behind a PL/Proxy router (docs/scale-out.md;
-- AWP issue 43; the router's own objects are in db/router/).
-- awp.shard:   one row once the database is a shard: its number (0-255). New run ids then carry it (two hex digits
--              right after the time: awp._new_time_id), and so do their dispatch ids (awp._new_dispatch_id), so the
--              router finds a run's shard, and a lease's, from the id alone. A database that is no shard has no row.
-- awp_router:  the role the router's connections log in as a member of (awp router init makes the login): the
--              gateway's rights (awp_gateway) and two more functions, the copy of a worker's session from shard 0 to
--              the others (awp._worker_record, awp._adopt_worker in db/functions/shards.sql).
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'awp_router') THEN
    CREATE ROLE awp_router NOLOGIN;
  END IF;
END $$;
GRANT awp_gateway TO awp_router;

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.shard (
  only_row    boolean PRIMARY KEY DEFAULT true,
  shard_index integer NOT NULL,
  set_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT shard_one_row CHECK (only_row),
  CONSTRAINT shard_index_in_range CHECK (shard_index BETWEEN 0 AND 255)
);

RESET ROLE;
