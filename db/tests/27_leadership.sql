-- Leadership of the coordinator (db/functions/leadership.sql, docs/protocol.md rule 12), with real sessions
-- (dblink): the lock decides who leads and each takeover is a new term; a standby is refused while the
-- leader's lease is fresh (to the millisecond) and ends a silent leader's session once it has expired; a
-- deposed leader's pass, heartbeat and retention batch are refused (AWLDR) without a write. The sessions
-- commit on the real clock (a standby's clock is moved with SET awp.test_now), so the file resets the
-- leader row and drops its login role at its end.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(47);

CREATE EXTENSION IF NOT EXISTS dblink;
SELECT format('host=%s port=%s dbname=%s', split_part(current_setting('unix_socket_directories'), ',', 1),
              current_setting('port'), current_database()) AS cs \gset
SELECT 'awp_leader_' || substr(md5(random()::text), 1, 8) AS role, md5(random()::text) AS pw \gset
SELECT dblink_connect('setup', format('%s user=%s', :'cs', current_user));
SELECT dblink_exec('setup', format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE awp_gateway', :'role', :'pw'));
SELECT dblink_exec('setup', 'SET lock_timeout = ''10s''');   -- a broken function must fail the file, not hang it
SELECT dblink_connect('s', format('%s user=%s', :'cs', current_user));     -- a superuser's session
SELECT dblink_connect('b', format('%s user=%s', :'cs', current_user));

-- tests.on(conn, sql): the one jsonb value sql returns in that session; tests.pid(conn): its backend pid.
CREATE FUNCTION tests.on(p_conn text, p_sql text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT x.j FROM dblink(p_conn, p_sql) AS x(j jsonb)
$$;
CREATE FUNCTION tests.pid(p_conn text) RETURNS integer LANGUAGE sql AS $$
  SELECT x.p FROM dblink(p_conn, 'SELECT pg_backend_pid()') AS x(p integer)
$$;
CREATE FUNCTION tests.leader() RETURNS text LANGUAGE sql AS $$
  SELECT format('term %s, holder %s, pid %s', l.term, l.holder, l.backend_pid) FROM awp.coordinator_leader l
$$;
CREATE FUNCTION tests.alive(p_pid integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_stat_clear_snapshot();   -- pg_stat_activity is otherwise read once per transaction
  RETURN EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = p_pid);
END $$;
SELECT tests.pid('s') AS s_pid, tests.pid('b') AS b_pid, (SELECT term FROM awp.coordinator_leader) AS t0 \gset

-- ---------------------------------------------------------------- the lock decides; a renewal keeps the term
SELECT is(tests.on('s', $$SELECT awp.take_leadership('s') - 'leader_lease_ms'$$),
          jsonb_build_object('leader', true, 'taken', true, 'term', :t0 + 1, 'holder', 's', 'terminated_pid', NULL),
          'the lock is free: s takes it and leads with the next term');
SELECT is(tests.leader(), format('term %s, holder s, pid %s', :t0 + 1, :s_pid), 'the row records s and its session');
SELECT is(awp._coordinator_lock_holder(), :s_pid, 's holds the coordinator lock');
SELECT is(tests.on('s', $$SELECT awp.take_leadership('s')->'taken'$$), 'false'::jsonb, 'asking again renews: no new term');
SELECT is(tests.leader(), format('term %s, holder s, pid %s', :t0 + 1, :s_pid), '... the row is the same');

-- ---------------------------------------------------------------- a standby while the lease is fresh
SELECT (awp.get_settings()->>'leader_lease_ms')::integer AS lease, (SELECT last_seen_at FROM awp.coordinator_leader) AS seen \gset
SELECT is(:lease, 10000, 'the default leader lease is 10 s');
SELECT is(tests.on('b', $$SELECT awp.take_leadership('b') - 'lease_remaining_ms'$$),
          jsonb_build_object('leader', false, 'reason', 'leader_alive', 'term', :t0 + 1, 'holder', 's', 'pid', :s_pid,
                             'leader_lease_ms', 10000),
          'b is refused while s is alive: leader_alive');
SELECT is(awp._coordinator_lock_holder(), :s_pid, '... b did not take the lock');
SELECT dblink_exec('b', format('SET awp.test_now = %L', (:'seen'::timestamptz + interval '9.999 s')::text));
SELECT is(tests.on('b', $$SELECT awp.take_leadership('b')$$)->>'lease_remaining_ms', '1',
          'one millisecond before the lease expires b is still refused (database clock)');
SELECT dblink_exec('b', format('SET awp.test_now = %L', (:'seen'::timestamptz + interval '10 s')::text));
SELECT is(tests.on('b', $$SELECT awp.take_leadership('b') - 'leader_lease_ms' - 'holder'$$),
          jsonb_build_object('leader', false, 'reason', 'cannot_terminate', 'term', :t0 + 1, 'pid', :s_pid,
                             'lease_remaining_ms', 0),
          'at expiry b would end the session of s, but awp_owner may not end a superuser''s: cannot_terminate, with its pid');
SELECT ok(tests.alive(:s_pid), '... s lives on');
SELECT is(tests.leader(), format('term %s, holder s, pid %s', :t0 + 1, :s_pid), '... and nothing was written');
SELECT dblink_exec('s', 'BEGIN');
SELECT ok(tests.on('s', format('SELECT awp.coordinator_tick(false, %s)', :t0 + 1)) ? 'dispatched',
          's is in the middle of a pass (its transaction open)');
SELECT is(tests.on('b', $$SELECT awp.take_leadership('b')->'reason'$$), to_jsonb('leader_busy'::text),
          'past the lease, but the pass of s holds the leader row: a slow leader, not a frozen one (leader_busy)');
SELECT dblink_exec('s', 'COMMIT');
SELECT dblink_exec('b', 'RESET awp.test_now');

-- ---------------------------------------------------------------- the leader's own calls carry its term
SELECT ok(tests.on('s', format('SELECT awp.coordinator_tick(false, %s)', :t0 + 1)) ? 'dispatched', 's passes with its term');
SELECT ok((SELECT last_seen_at > :'seen' FROM awp.coordinator_leader), '... which renews last_seen_at');
SELECT is(tests.on('s', format('SELECT awp.leader_heartbeat(%s)', :t0 + 1)),
          jsonb_build_object('term', :t0 + 1, 'leader_lease_ms', 10000), 's heartbeats with its term');
SELECT ok(tests.on('s', format('SELECT awp.apply_retention(%s)', :t0 + 1)) ? 'retention_ms', 's runs a retention batch with its term');

-- ---------------------------------------------------------------- a deposed leader writes nothing
SELECT * FROM dblink('s', 'SELECT pg_advisory_unlock_all()::text') AS x(v text);   -- s lets go of the lock but lives on
SELECT is(tests.on('b', $$SELECT awp.take_leadership('b')->'term'$$), to_jsonb(:t0 + 2),
          'the lock is free (s no longer holds it): b takes over at once with the next term');
SELECT (SELECT last_tick_at FROM awp.settings) AS tick_before, (SELECT last_seen_at FROM awp.coordinator_leader) AS seen_b \gset
SELECT throws_ok(format($$SELECT tests.on('s', 'SELECT awp.coordinator_tick(false, %s)')$$, :t0 + 1), 'AWLDR', NULL,
                 'a pass of s with its old term is refused: AWLDR');
SELECT throws_ok(format($$SELECT tests.on('s', 'SELECT awp.coordinator_tick(true, %s)')$$, :t0 + 2), 'AWLDR', NULL,
                 'a pass of s with the current term is refused too: it is not the leader''s session');
SELECT throws_ok(format($$SELECT tests.on('s', 'SELECT awp.leader_heartbeat(%s)')$$, :t0 + 1), 'AWLDR', NULL,
                 'a heartbeat of s with its old term is refused');
SELECT throws_ok(format($$SELECT tests.on('s', 'SELECT awp.apply_retention(%s)')$$, :t0 + 1), 'AWLDR', NULL,
                 'a retention batch with the old term is refused');
SELECT is((SELECT last_tick_at FROM awp.settings), :'tick_before'::timestamptz, 'the refused passes wrote nothing (last_tick_at)');
SELECT is(tests.leader() || ' ' || (SELECT last_seen_at FROM awp.coordinator_leader)::text,
          format('term %s, holder b, pid %s', :t0 + 2, :b_pid) || ' ' || :'seen_b'::timestamptz::text,
          '... nor anything of the leader row');
SELECT ok(tests.on('b', format('SELECT awp.coordinator_tick(true, %s)', :t0 + 2)) ? 'dispatched', 'b passes with its term');
SELECT throws_ok(format($$SELECT tests.on('b', 'SELECT awp.coordinator_tick(false, %s)')$$, :t0 + 1), 'AWLDR', NULL,
                 'b with the old term of s is refused as well');
SELECT dblink_disconnect('s');

-- ---------------------------------------------------------------- a session not recorded as leader holds the lock
SELECT dblink_disconnect('b');   -- the leader's session ends: the lock is free, the row still names b
SELECT * FROM dblink('setup', format('SELECT pg_advisory_lock(%s)::text', awp._coordinator_lock_key())) AS x(v text);   -- an operator
SELECT dblink_connect('a', format('%s user=%s password=%s', :'cs', :'role', :'pw'));               -- not a superuser
SELECT tests.pid('a') AS a_pid, tests.pid('setup') AS setup_pid \gset
SELECT is(tests.on('a', $$SELECT awp.take_leadership('a') - 'leader_lease_ms' - 'lease_remaining_ms'$$),
          jsonb_build_object('leader', false, 'reason', 'lock_held', 'term', :t0 + 2, 'holder', 'b', 'pid', :setup_pid),
          'an operator''s session holds the lock: a waits for it (lock_held), the silent-leader rule does not apply');
SELECT ok(tests.alive(:setup_pid), '... nobody was terminated');
SELECT * FROM dblink('setup', format('SELECT pg_advisory_unlock(%s)::text', awp._coordinator_lock_key())) AS x(v text);
SELECT is(tests.on('a', $$SELECT awp.take_leadership('a') - 'leader_lease_ms'$$),
          jsonb_build_object('leader', true, 'taken', true, 'term', :t0 + 3, 'holder', 'a', 'terminated_pid', NULL),
          'once it is free a takes it (the recorded leader b is gone): the next term');
SELECT ok(tests.on('a', format('SELECT awp.coordinator_tick(true, %s)', :t0 + 3)) ? 'dispatched', 'a passes with its term');

-- ---------------------------------------------------------------- a silent leader's session is ended
SELECT dblink_connect('c', format('%s user=%s', :'cs', current_user));
SELECT tests.pid('c') AS c_pid, (SELECT last_seen_at FROM awp.coordinator_leader) AS seen_a \gset
SELECT dblink_exec('c', format('SET awp.test_now = %L', (:'seen_a'::timestamptz + interval '9.999 s')::text));
SELECT is(tests.on('c', $$SELECT awp.take_leadership('c')->'reason'$$), to_jsonb('leader_alive'::text),
          'c is refused one millisecond before the lease of a expires');
SELECT ok(tests.alive(:a_pid), '... and a lives');
SELECT dblink_exec('c', format('SET awp.test_now = %L', (:'seen_a'::timestamptz + interval '10 s')::text));
SELECT is(tests.on('c', $$SELECT awp.take_leadership('c') - 'leader_lease_ms'$$),
          jsonb_build_object('leader', true, 'taken', true, 'term', :t0 + 4, 'holder', 'c', 'terminated_pid', :a_pid),
          'at expiry c ends the session of a (not a superuser''s) and leads with the next term');
SELECT ok(NOT tests.alive(:a_pid), '... the session of a is gone');
SELECT is(awp._coordinator_lock_holder(), :c_pid, '... and c holds the lock');
SELECT is(tests.leader(), format('term %s, holder c, pid %s', :t0 + 4, :c_pid), '... and is recorded');
SELECT is((SELECT last_seen_at FROM awp.coordinator_leader), :'seen_a'::timestamptz + interval '10 s',
          '... seen at the takeover, on the database clock');
SELECT throws_ok($$SELECT * FROM dblink('a', 'SELECT 1') AS x(one integer)$$, NULL, NULL,
                 'the old leader''s next statement fails: its session was terminated');
SELECT is((SELECT term FROM awp.get_leader()), :t0 + 4::bigint, 'get_leader shows the term');
SELECT is((SELECT lock_holder_pid FROM awp.get_leader()), :c_pid, 'get_leader shows who holds the lock');
SELECT is((SELECT silent_ms >= 0 FROM awp.get_leader()), true, 'get_leader shows how long the leader has been silent');

-- ---------------------------------------------------------------- input, and a DBA's pass
SELECT throws_ok($$SELECT awp.take_leadership(NULL)$$, 'AWREQ', 'invalid holder', 'a null holder is AWREQ');
SELECT throws_ok($$SELECT awp.take_leadership(repeat('x', 201))$$, 'AWREQ', 'invalid holder', 'a holder of 201 characters is AWREQ');
SELECT throws_ok($$SELECT tests.on('c', 'SELECT awp.leader_heartbeat(NULL)')$$, 'AWLDR', NULL,
                 'a heartbeat without a term is refused, also in the leader''s session');
SELECT dblink_disconnect('c');
SELECT dblink_disconnect('a');
SELECT (SELECT last_seen_at FROM awp.coordinator_leader) AS seen_c \gset
SELECT ok(awp.coordinator_tick() ? 'dispatched', 'a DBA''s pass without a term is not fenced');
SELECT is((SELECT last_seen_at FROM awp.coordinator_leader), :'seen_c'::timestamptz, '... and renews no leadership');

-- Clean up what the sessions committed.
SELECT dblink_exec('setup', 'UPDATE awp.coordinator_leader SET holder = NULL, backend_pid = NULL, since = NULL, last_seen_at = NULL');
SELECT dblink_exec('setup', format('DROP ROLE %I', :'role'));
SELECT dblink_disconnect('setup');

SELECT * FROM finish();
ROLLBACK;
