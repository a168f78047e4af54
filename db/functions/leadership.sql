-- Leadership of the coordinator (docs/protocol.md, rule 12). One coordinator is active per database: its
-- session holds the session advisory lock awp._coordinator_lock_key() and is recorded in
-- awp.coordinator_leader (term, backend_pid, last_seen_at). A leader whose session ends loses the lock and a
-- standby takes over at once. A leader that is frozen (SIGSTOP, a paused VM) or behind a half-open
-- connection keeps its session and its lock; once it has been silent for settings.leader_lease_ms on the
-- database clock, a standby ends that session (pg_terminate_backend), which releases the lock, and takes
-- over with the next term. Fencing: a pass (awp.coordinator_tick), a heartbeat (awp.leader_heartbeat) or a
-- retention batch (awp.apply_retention) that carries a term is refused with AWLDR, writing nothing, unless
-- the row still names that term (and, for passes and heartbeats, the calling session).

-- awp._coordinator_lock_key(): the key of the coordinator's session advisory lock ("AWP_COOR"; the same as
-- LOCK_KEY in python/awp/server/coordinator.py). Locks: none.
CREATE OR REPLACE FUNCTION awp._coordinator_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 4708320305520529234::bigint $$;
COMMENT ON FUNCTION awp._coordinator_lock_key() IS 'The key of the coordinator''s session advisory lock.';

-- awp._coordinator_lock_holder(): the pid of the session that holds the coordinator's lock in this
-- database, or NULL. Reads pg_locks (every role may). Locks: none.
CREATE OR REPLACE FUNCTION awp._coordinator_lock_holder() RETURNS integer
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
  SELECT l.pid FROM pg_catalog.pg_locks l
   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
     AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
     AND l.classid = (awp._coordinator_lock_key() >> 32)::oid
     AND l.objid = (awp._coordinator_lock_key() & 4294967295)::oid
   LIMIT 1
$$;
COMMENT ON FUNCTION awp._coordinator_lock_holder() IS 'The pid of the session holding the coordinator''s advisory lock, or NULL.';

-- awp._leadership_refused(reason, row, lease_ms, remaining_ms, pid): the answer of a refused
-- awp.take_leadership. Locks: none.
CREATE OR REPLACE FUNCTION awp._leadership_refused(p_reason text, l awp.coordinator_leader, p_lease integer,
                                                   p_remaining bigint, p_pid integer) RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object('leader', false, 'reason', p_reason, 'term', l.term, 'holder', l.holder,
                            'pid', p_pid, 'lease_remaining_ms', p_remaining, 'leader_lease_ms', p_lease)
$$;
COMMENT ON FUNCTION awp._leadership_refused(text, awp.coordinator_leader, integer, bigint, integer) IS 'The answer of a refused take_leadership.';

-- awp.take_leadership(holder): one election step of a coordinator's session; holder names the process
-- (1-200 characters, e.g. host:pid). This session leads when it holds the coordinator's lock (taken here
-- when free): then it is recorded with the next term (taken: true) unless it already was (a renewal).
-- When the recorded leader holds the lock but has been silent (no pass, no heartbeat) for leader_lease_ms
-- on the database clock, its session, and only that one, is terminated (waiting up to 5 s for it to end),
-- which frees the lock, and this session takes it. Answers
--   {"leader": true, "taken", "term", "holder", "terminated_pid", "leader_lease_ms"}, or
--   {"leader": false, "reason", "term", "holder", "pid", "lease_remaining_ms", "leader_lease_ms"} with reason
--   leader_alive (the recorded leader holds the lock and was seen within the lease: lease_remaining_ms),
--   lock_held (a session not recorded as leader holds the lock: an operator's, or another standby taking
--   over this instant; pid), leader_busy (the lease ran out but the leader's pass, or its retention batch,
--   holds the leader row right now: a long pass, not a frozen leader; it renews when it commits), or
--   cannot_terminate (the leader is silent but awp_owner may not end its session, a superuser's, or
--   without pg_signal_backend: pid is that session; the caller may end it with its own rights and call
--   again). A refusal while the lease runs writes nothing and takes no lock.
-- Locks: the coordinator's session advisory lock (kept: the session leads while it holds it), then the
-- coordinator_leader row (NOWAIT before ending a silent leader's session; to record or renew).
CREATE OR REPLACE FUNCTION awp.take_leadership(p_holder text) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_key     bigint := awp._coordinator_lock_key();
  v_me      integer := pg_catalog.pg_backend_pid();
  v_lease   integer := (awp._settings()).leader_lease_ms;
  v_holder  integer := awp._coordinator_lock_holder();
  v_had     boolean := v_holder IS NOT DISTINCT FROM pg_catalog.pg_backend_pid();
  v_killed  integer;
  v_now     timestamptz;
  v_expires timestamptz;
  l         awp.coordinator_leader;
BEGIN
  IF p_holder IS NULL OR length(p_holder) NOT BETWEEN 1 AND 200 THEN
    PERFORM awp._raise_invalid_request('invalid holder', 'holder must be 1 to 200 characters (e.g. host:pid)');
  END IF;
  IF v_holder IS NULL AND pg_catalog.pg_try_advisory_lock(v_key) THEN
    v_holder := v_me;
  END IF;
  IF v_holder IS DISTINCT FROM v_me THEN
    v_holder := coalesce(v_holder, awp._coordinator_lock_holder());   -- lost the race for a free lock
    SELECT * INTO l FROM awp.coordinator_leader x;                    -- no row lock: a refusal writes nothing
    v_now := awp._now();
    v_expires := l.last_seen_at + make_interval(secs => v_lease / 1000.0);
    IF v_holder IS NULL OR v_holder IS DISTINCT FROM l.backend_pid THEN
      RETURN awp._leadership_refused('lock_held', l, v_lease, NULL, v_holder);
    ELSIF v_now < v_expires THEN
      RETURN awp._leadership_refused('leader_alive', l, v_lease, awp._ms(v_expires - v_now), v_holder);
    END IF;
    BEGIN   -- a pass (or a retention batch) of the leader is running right now: it is not frozen, only slow
      PERFORM 1 FROM awp.coordinator_leader x FOR UPDATE NOWAIT;
    EXCEPTION WHEN lock_not_available THEN
      RETURN awp._leadership_refused('leader_busy', l, v_lease, NULL, v_holder);
    END;
    BEGIN
      PERFORM pg_catalog.pg_terminate_backend(v_holder, 5000);
    EXCEPTION WHEN insufficient_privilege THEN
      RETURN awp._leadership_refused('cannot_terminate', l, v_lease, 0, v_holder);
    END;
    v_killed := v_holder;
    IF NOT pg_catalog.pg_try_advisory_lock(v_key) THEN   -- another standby was quicker
      RETURN awp._leadership_refused('lock_held', l, v_lease, NULL, awp._coordinator_lock_holder());
    END IF;
  END IF;
  -- This session holds the lock.
  SELECT * INTO l FROM awp.coordinator_leader x FOR UPDATE;
  v_now := awp._now();
  IF v_had AND l.backend_pid = v_me THEN
    UPDATE awp.coordinator_leader x SET last_seen_at = v_now;
    RETURN jsonb_build_object('leader', true, 'taken', false, 'term', l.term, 'holder', l.holder,
                              'terminated_pid', NULL, 'leader_lease_ms', v_lease);
  END IF;
  UPDATE awp.coordinator_leader x
     SET term = x.term + 1, holder = p_holder, backend_pid = v_me, since = v_now, last_seen_at = v_now
  RETURNING * INTO l;
  RETURN jsonb_build_object('leader', true, 'taken', true, 'term', l.term, 'holder', l.holder,
                            'terminated_pid', v_killed, 'leader_lease_ms', v_lease);
END $$;
COMMENT ON FUNCTION awp.take_leadership(text) IS 'One election step of a coordinator session: leads (a new term) when it holds or takes the coordinator lock; ends the session of a leader silent for leader_lease_ms; answers jsonb {leader, term, ...} or {leader: false, reason}.';

-- awp._check_leader(term, session): raises AWLDR (leadership lost), before any write of the caller, unless
-- coordinator_leader still names term p_term and, when p_session, this session.
-- Locks: the coordinator_leader row, FOR NO KEY UPDATE when p_session (passes and heartbeats renew it),
-- else FOR KEY SHARE (retention batches, on a connection of their own, never wait for a pass).
CREATE OR REPLACE FUNCTION awp._check_leader(p_term bigint, p_session boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  l awp.coordinator_leader;
BEGIN
  IF p_session THEN
    SELECT * INTO l FROM awp.coordinator_leader x FOR NO KEY UPDATE;
  ELSE
    SELECT * INTO l FROM awp.coordinator_leader x FOR KEY SHARE;
  END IF;
  IF l.term IS DISTINCT FROM p_term OR (p_session AND l.backend_pid IS DISTINCT FROM pg_catalog.pg_backend_pid()) THEN
    PERFORM awp._raise_leadership_lost(format('leadership lost: term %s is over', p_term),
      format('the caller (session %s) carries term %s; the leader is term %s, holder %s, session %s',
             pg_catalog.pg_backend_pid(), p_term, l.term, coalesce(l.holder, 'none'), coalesce(l.backend_pid::text, 'none')));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_leader(bigint, boolean) IS 'Raises AWLDR unless coordinator_leader names this term (and session); locks the row.';

-- awp.leader_heartbeat(term): the active coordinator is alive (its passes renew it too; it sends this
-- when its pass interval is long compared with the lease). AWLDR when term (or this session) no longer
-- leads. Returns {"term", "leader_lease_ms"}. Locks: the coordinator_leader row.
CREATE OR REPLACE FUNCTION awp.leader_heartbeat(p_term bigint) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._check_leader(p_term, true);
  UPDATE awp.coordinator_leader x SET last_seen_at = awp._now();
  RETURN jsonb_build_object('term', p_term, 'leader_lease_ms', (awp._settings()).leader_lease_ms);
END $$;
COMMENT ON FUNCTION awp.leader_heartbeat(bigint) IS 'Renews the active coordinator''s leadership (last_seen_at); AWLDR when its term or session no longer leads.';

-- awp.get_leader(): the active coordinator as recorded (term, holder, session, since, last_seen_at), how
-- long it has been silent, the lease, and the session holding the coordinator's lock now. Locks: none.
CREATE OR REPLACE FUNCTION awp.get_leader()
RETURNS TABLE (term bigint, holder text, backend_pid integer, since timestamptz, last_seen_at timestamptz,
               silent_ms bigint, leader_lease_ms integer, lock_holder_pid integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
  SELECT l.term, l.holder, l.backend_pid, l.since, l.last_seen_at, awp._ms(awp._now() - l.last_seen_at),
         s.leader_lease_ms, awp._coordinator_lock_holder()
    FROM awp.coordinator_leader l, awp.settings s;
END $$;
COMMENT ON FUNCTION awp.get_leader() IS 'The recorded active coordinator (term, holder, session, since, last seen, silence), the leader lease and the lock holder.';
