-- 0008_coordinator_leader: leadership of the coordinator that survives a frozen leader (docs/protocol.md,
-- rule 12; db/functions/leadership.sql).
--   coordinator_leader        one row: the session that leads now. term goes up by one at every takeover;
--                             backend_pid is the leader's database session (it holds the coordinator's
--                             session advisory lock); last_seen_at is the database time of its latest pass
--                             or heartbeat; since when its term began; holder names the process (host:pid).
--   settings.leader_lease_ms  how long the leader may stay silent (on the database clock) before a standby
--                             ends its session (pg_terminate_backend) and takes over. Default 10 s.
--   pg_signal_backend         awp_owner (whose SECURITY DEFINER functions run as it) may terminate the
--                             silent leader's session. Without the grant (a migrating user that may not give
--                             it gets a WARNING), a standby ends that session with its own login's rights.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.settings
  ADD COLUMN leader_lease_ms integer NOT NULL DEFAULT 10000,
  ADD CONSTRAINT leader_lease_in_range CHECK (leader_lease_ms BETWEEN 500 AND 3600000);

CREATE TABLE awp.coordinator_leader (
  singleton    boolean PRIMARY KEY DEFAULT true,
  term         bigint NOT NULL DEFAULT 0,
  holder       text,
  backend_pid  integer,
  since        timestamptz,
  last_seen_at timestamptz,
  CONSTRAINT coordinator_leader_is_singleton CHECK (singleton),
  CONSTRAINT coordinator_leader_term_not_negative CHECK (term >= 0),
  CONSTRAINT coordinator_leader_complete CHECK (
    (holder IS NULL) = (backend_pid IS NULL) AND (holder IS NULL) = (since IS NULL)
    AND (holder IS NULL) = (last_seen_at IS NULL))
);
INSERT INTO awp.coordinator_leader DEFAULT VALUES;

RESET ROLE;

DO $$
BEGIN
  IF NOT pg_has_role('awp_owner', 'pg_signal_backend', 'MEMBER') THEN
    GRANT pg_signal_backend TO awp_owner;
  END IF;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'cannot grant pg_signal_backend to awp_owner (%); a standby coordinator will end a silent leader''s session with its own login''s rights (docs/operations.md)', SQLERRM;
END $$;
