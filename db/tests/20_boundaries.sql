-- Every time boundary of the protocol, pinned on the frozen clock to the microsecond: a lease is valid
-- while now < lease_expires_at (<= attempt_deadline, which claims and renewals never pass), so at the
-- exact instant of either the lease is over for complete, heartbeat, the reaper and the checker alike,
-- and one microsecond before it is not. Also: a claim at those instants, offline marking at exactly
-- the silence limit (and the takeover window), retry promotion at exactly ready_at, a claim as a sign
-- of life at exactly half a heartbeat interval, and the run output's 1 MiB bound to the byte.
-- Each section has its own hour, runs and workers, and ends with tests.cleanup().
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(70);

SELECT tests.freeze('2030-01-01 00:00:00+00');
CREATE TABLE tests.sess (worker_id text PRIMARY KEY, token text NOT NULL);
-- tests.worker(name, max): registers a mock worker and remembers its token; returns its id.
CREATE FUNCTION tests.worker(p_name text, p_max integer DEFAULT 10) RETURNS text LANGUAGE sql AS $$
  INSERT INTO tests.sess SELECT r.worker_id, r.token FROM tests.register_worker(p_name, '{mock}', p_max) r
  RETURNING worker_id
$$;
SELECT tests.worker('first') AS w0 \gset
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w0', (SELECT token FROM tests.sess), 1) WITH NO DATA;
-- tests.grab(worker, slots): claim_tasks for a remembered worker; the leases go to l; returns how many.
CREATE FUNCTION tests.grab(p_worker text, p_slots integer DEFAULT 1) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  INSERT INTO l SELECT * FROM awp.claim_tasks(p_worker, (SELECT token FROM tests.sess WHERE worker_id = p_worker), p_slots);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
-- tests.latest(run, key): the latest lease of a task in l (with its worker's session token).
CREATE FUNCTION tests.latest(p_run text, p_key text)
RETURNS TABLE (dispatch_id text, lease_token text, worker_id text, token text) LANGUAGE sql AS $$
  SELECT l.dispatch_id, l.lease_token, d.worker_id, s.token
    FROM l JOIN awp.dispatches d USING (dispatch_id) JOIN tests.sess s ON s.worker_id = d.worker_id
   WHERE l.run_id = p_run AND l.task_key = p_key ORDER BY l.attempt DESC LIMIT 1
$$;
-- tests.fin_sql(run, key, output): the complete_task call (success) for the task's latest lease, as SQL.
CREATE FUNCTION tests.fin_sql(p_run text, p_key text, p_output jsonb DEFAULT '{"ok": true}') RETURNS text LANGUAGE sql AS $$
  SELECT format('SELECT awp.complete_task(%L, %L, %L, %L, %L)', x.worker_id, x.token, x.dispatch_id, x.lease_token,
                jsonb_build_object('kind', 'success', 'output', p_output))
    FROM tests.latest(p_run, p_key) x
$$;
CREATE FUNCTION tests.fin(p_run text, p_key text, p_output jsonb DEFAULT '{"ok": true}') RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE v boolean;
BEGIN
  EXECUTE tests.fin_sql(p_run, p_key, p_output) INTO v;
  RETURN v;
END $$;
-- tests.hb(run, key): the heartbeat answer for the task's latest lease, as 'status remaining_ms'.
CREATE FUNCTION tests.hb(p_run text, p_key text) RETURNS text LANGUAGE sql AS $$
  SELECT h.status || ' ' || h.lease_remaining_ms
    FROM tests.latest(p_run, p_key) x,
         awp.heartbeat(x.worker_id, x.token, jsonb_build_array(jsonb_build_object('dispatch_id', x.dispatch_id,
                                                                                  'lease_token', x.lease_token))) h
$$;
-- tests.lease(run, key): the latest dispatch of a task: 'status expires deadline' as text (UTC).
CREATE FUNCTION tests.dsp(p_run text, p_key text) RETURNS awp.dispatches LANGUAGE sql AS $$
  SELECT d.* FROM awp.dispatches d WHERE d.run_id = p_run AND d.task_key = p_key ORDER BY d.attempt DESC NULLS FIRST LIMIT 1
$$;
CREATE FUNCTION tests.att(p_run text, p_key text) RETURNS awp.attempts LANGUAGE sql AS $$
  SELECT a.* FROM awp.attempts a WHERE a.run_id = p_run AND a.task_key = p_key ORDER BY a.attempt DESC LIMIT 1
$$;
-- tests.cleanup(): cancel every live run and stop every live worker, so sections do not mix.
CREATE FUNCTION tests.cleanup() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM awp.request_cancel(run_id) FROM awp.runs WHERE status IN ('pending', 'running');
  PERFORM awp.converge_cancellations();
  UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE status IN ('active', 'draining');
END $$;
SELECT tests.cleanup();

-- ================================================================ complete at the attempt deadline and the lease expiry
-- Lease 15 s (default). Tasks with the default timeout (300 s) expire with their lease at +15 s;
-- tasks with timeout_ms 10000 reach their attempt deadline (and with it the end of their lease) at +10 s.
SELECT tests.freeze('2030-01-01 01:00:00+00') AS ta \gset
SELECT tests.worker('wa') AS wa \gset
SELECT tests.make_run('ca', jsonb_build_array(tests.task('early'), tests.task('late'),
         tests.task('dl_early', '{}', '{"timeout_ms": 10000}'), tests.task('dl_late', '{}', '{"timeout_ms": 10000}'))) AS ra \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wa', 4), 4::bigint, 'setup: four leases at ta');
SELECT results_eq(format($$SELECT task_key, lease_expires_at - %L::timestamptz, attempt_deadline - %L::timestamptz, lease_remaining_ms
                             FROM l WHERE run_id = %L ORDER BY task_key$$, :'ta', :'ta', :'ra'),
                  $$VALUES ('dl_early'::text, interval '10 s', interval '10 s', 10000::bigint),
                           ('dl_late', interval '10 s', interval '10 s', 10000::bigint),
                           ('early', interval '15 s', interval '300 s', 15000::bigint),
                           ('late', interval '15 s', interval '300 s', 15000::bigint)$$,
                  'claim: attempt_deadline = now + timeout, lease_expires_at = least(now + lease, deadline), exactly');

SELECT tests.freeze(:'ta'::timestamptz + interval '10 s' - interval '1 microsecond');
SELECT is(tests.fin(:'ra', 'dl_early'), true, 'complete 1 us before the attempt deadline is applied');
SELECT is((tests.dsp(:'ra', 'dl_early')).finished_at, :'ta'::timestamptz + interval '10 s' - interval '1 microsecond',
          '... and finished at that instant');
SELECT tests.freeze(:'ta'::timestamptz + interval '10 s');
SELECT throws_ok(tests.fin_sql(:'ra', 'dl_late'), 'AWLST', NULL, 'complete at exactly the attempt deadline is AWLST');
SELECT is(tests.error_detail(tests.fin_sql(:'ra', 'dl_late')), 'the attempt deadline has passed',
          '... because the attempt deadline has passed (checked before the lease, which ends at the same instant)');
SELECT is((tests.dsp(:'ra', 'dl_late')).status || '/' || (tests.att(:'ra', 'dl_late')).status, 'leased/running',
          '... and changes nothing (the reaper settles it)');

SELECT tests.freeze(:'ta'::timestamptz + interval '15 s' - interval '1 microsecond');
SELECT is(tests.fin(:'ra', 'early'), true, 'complete 1 us before lease_expires_at is applied');
SELECT tests.freeze(:'ta'::timestamptz + interval '15 s');
SELECT throws_ok(tests.fin_sql(:'ra', 'late'), 'AWLST', NULL, 'complete at exactly lease_expires_at is AWLST');
SELECT is(tests.error_detail(tests.fin_sql(:'ra', 'late')), 'the lease has expired', '... because the lease has expired');
SELECT is((tests.att(:'ra', 'late')).status, 'running', '... and changes nothing');

-- The checker draws the line at the same instant: accepted 1 us before the end is fine, at the end it is not.
SELECT is_empty(format($$SELECT * FROM awp.check_invariants(ARRAY[%L])$$, :'ra'),
                'results accepted 1 us before the deadline and the expiry are no violation');
UPDATE awp.dispatches SET finished_at = lease_expires_at WHERE dispatch_id = (tests.dsp(:'ra', 'early')).dispatch_id;
SELECT is(ARRAY(SELECT invariant FROM awp.check_invariants(ARRAY[:'ra'])), ARRAY['accepted_after_expiry'],
          'a result recorded at exactly lease_expires_at is accepted_after_expiry');
UPDATE awp.dispatches SET finished_at = lease_expires_at - interval '1 microsecond'
 WHERE dispatch_id = (tests.dsp(:'ra', 'early')).dispatch_id;
-- (lease_expires_at <= attempt_deadline is a table constraint, so a result at the deadline is after the expiry too.)
SELECT tests.cleanup();

-- ================================================================ heartbeat at the attempt deadline and the lease expiry
SELECT tests.freeze('2030-01-01 02:00:00+00') AS tb \gset
SELECT tests.worker('wb') AS wb \gset
SELECT tests.make_run('hb', jsonb_build_array(tests.task('early'), tests.task('late'),
         tests.task('dl_early', '{}', '{"timeout_ms": 10000}'), tests.task('dl_late', '{}', '{"timeout_ms": 10000}'))) AS rb \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wb', 4), 4::bigint, 'setup: four leases at tb');

SELECT tests.freeze(:'tb'::timestamptz + interval '10 s' - interval '1 microsecond') AS tb10m \gset
SELECT is(tests.hb(:'rb', 'dl_early'), 'renewed 0', 'heartbeat 1 us before the attempt deadline: renewed, 0 whole ms left');
SELECT is((tests.dsp(:'rb', 'dl_early')).lease_expires_at, :'tb'::timestamptz + interval '10 s',
          '... up to the attempt deadline and no further');
SELECT is((SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = :'wb'), :'tb10m'::timestamptz, '... and liveness recorded');
SELECT tests.freeze(:'tb'::timestamptz + interval '10 s');
SELECT is(tests.hb(:'rb', 'dl_late'), 'revoked 0', 'heartbeat at exactly the attempt deadline: revoked');
SELECT is((tests.dsp(:'rb', 'dl_late')).lease_expires_at, :'tb'::timestamptz + interval '10 s', '... and not renewed');
SELECT throws_ok(tests.fin_sql(:'rb', 'dl_early'), 'AWLST', NULL,
                 'the lease renewed 1 us before the deadline cannot complete at the deadline either');

SELECT tests.freeze(:'tb'::timestamptz + interval '15 s' - interval '1 microsecond') AS tb15m \gset
SELECT is(tests.hb(:'rb', 'early'), 'renewed 15000', 'heartbeat 1 us before lease_expires_at: renewed for a full lease');
SELECT is((tests.dsp(:'rb', 'early')).lease_expires_at, :'tb15m'::timestamptz + interval '15 s', '... from that instant');
SELECT tests.freeze(:'tb'::timestamptz + interval '15 s');
SELECT is(tests.hb(:'rb', 'late'), 'revoked 0', 'heartbeat at exactly lease_expires_at: revoked');
SELECT is((tests.dsp(:'rb', 'late')).lease_expires_at, :'tb'::timestamptz + interval '15 s', '... and not revived');
SELECT is(tests.fin(:'rb', 'early'), true, 'at that same instant the renewed lease completes');
SELECT throws_ok(tests.fin_sql(:'rb', 'late'), 'AWLST', NULL, '... and the revoked one does not: heartbeat and complete agree');
SELECT tests.cleanup();

-- ================================================================ the reaper, and claims, at those instants
-- wcap (capacity 1) holds a 15 s lease of run rc1; wc holds a 10 s attempt of run rc2.
SELECT tests.freeze('2030-01-01 03:00:00+00') AS tc \gset
SELECT tests.worker('wcap', 1) AS wcap \gset
SELECT tests.worker('wc', 2) AS wc \gset
SELECT tests.worker('other', 2) AS wo \gset
SELECT tests.make_run('rc1', jsonb_build_array(tests.task('lease', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'))) AS rc1 \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wcap'), 1::bigint, 'setup: wcap holds the 15 s lease');
SELECT tests.make_run('rc2', jsonb_build_array(tests.task('dl', '{}',
         '{"timeout_ms": 10000, "retry": {"max_attempts": 2, "interval_ms": 0}}'))) AS rc2 \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wc'), 1::bigint, 'setup: wc holds the 10 s attempt');
SELECT (tests.dsp(:'rc2', 'dl')).fencing_token AS fence1 \gset

SELECT tests.freeze(:'tc'::timestamptz + interval '10 s' - interval '1 microsecond');
SELECT is(awp.reap_expired_leases(), 0, 'reaper 1 us before the attempt deadline: nothing to reap');
SELECT is(tests.grab(:'wo'), 0::bigint, '... and nothing for another worker to claim');
SELECT tests.freeze(:'tc'::timestamptz + interval '10 s') AS tc10 \gset
SELECT is(awp.reap_expired_leases(), 1, 'reaper at exactly the attempt deadline: the attempt is reaped');
SELECT results_eq(format($$SELECT status, error_code, finished_at FROM awp.attempts WHERE run_id = %L$$, :'rc2'),
                  format($$VALUES ('timed_out'::text, 'attempt_timeout'::text, %L::timestamptz)$$, :'tc10'),
                  '... as timed_out (the deadline wins over the lease, which ends at the same instant), at that instant');
SELECT is((tests.dsp(:'rc2', 'dl')).status, 'expired', '... its dispatch expired');
SELECT results_eq(format($$SELECT status, ready_at FROM awp.tasks WHERE run_id = %L$$, :'rc2'),
                  format($$VALUES ('waiting_retry'::text, %L::timestamptz)$$, :'tc10'), '... and the task is due again at once');
SELECT is(tests.error_detail(tests.fin_sql(:'rc2', 'dl')), 'the dispatch is expired',
          'complete after the reaper is AWLST: the dispatch is expired');
SELECT is(awp.promote_retries(), 1, 'promotion at exactly ready_at (the same instant)');
SELECT is(awp.create_dispatches(), 1, '... and a new dispatch');
SELECT is(tests.grab(:'wo'), 1::bigint, 'a claim at exactly the old attempt deadline gets the retry');
SELECT results_eq(format($$SELECT attempt, attempt_deadline, lease_expires_at, fencing_token > %s FROM l
                             WHERE run_id = %L ORDER BY attempt DESC LIMIT 1$$, :fence1, :'rc2'),
                  format($$VALUES (2, %L::timestamptz + interval '10 s', %L::timestamptz + interval '10 s', true)$$, :'tc10', :'tc10'),
                  '... as attempt 2 with a deadline counted from this instant and a larger fencing token');

SELECT tests.freeze(:'tc'::timestamptz + interval '15 s' - interval '1 microsecond');
SELECT is(awp.reap_expired_leases(), 0, 'reaper 1 us before lease_expires_at: nothing to reap');
SELECT tests.freeze(:'tc'::timestamptz + interval '15 s') AS tc15 \gset
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'wcap', (SELECT token FROM tests.sess WHERE worker_id = :'wcap')),
                 'AWCAP', NULL, 'at exactly lease_expires_at, before the reaper, the expired lease still takes its slot');
SELECT is(awp.reap_expired_leases(), 1, 'reaper at exactly lease_expires_at: the lease is reaped');
SELECT results_eq(format($$SELECT status, error_code, finished_at FROM awp.attempts WHERE run_id = %L$$, :'rc1'),
                  format($$VALUES ('interrupted'::text, 'lease_expired'::text, %L::timestamptz)$$, :'tc15'),
                  '... as interrupted (the deadline is 285 s away), at that instant');
SELECT is(awp.promote_retries() + awp.create_dispatches(), 2, 'the retry is promoted and dispatched at the same instant');
SELECT is(tests.grab(:'wcap'), 1::bigint, 'the freed slot claims it at once');
SELECT is((SELECT attempt FROM l WHERE run_id = :'rc1' ORDER BY attempt DESC LIMIT 1), 2, '... as attempt 2');
SELECT tests.cleanup();

-- ================================================================ retry promotion at exactly ready_at
SELECT tests.freeze('2030-01-01 04:00:00+00') AS td \gset
SELECT tests.worker('wd') AS wd \gset
SELECT tests.make_run('rd', jsonb_build_array(tests.task('p', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 5000}}'))) AS rd \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wd'), 1::bigint, 'setup: p leased');
SELECT ok(awp.complete_task(x.worker_id, x.token, x.dispatch_id, x.lease_token, '{"kind": "temporary_failure"}'),
          'setup: p fails temporarily at td') FROM tests.latest(:'rd', 'p') x;
SELECT is((SELECT ready_at FROM awp.tasks WHERE run_id = :'rd'), :'td'::timestamptz + interval '5 s', 'ready_at = td + 5 s');
SELECT tests.freeze(:'td'::timestamptz + interval '5 s' - interval '1 microsecond');
SELECT is(awp.promote_retries(), 0, 'not promoted 1 us before ready_at');
SELECT tests.freeze(:'td'::timestamptz + interval '5 s');
SELECT is(awp.promote_retries(), 1, 'promoted at exactly ready_at');
SELECT is(tests.task_status(:'rd', 'p'), 'ready', '... the task is ready');
SELECT tests.cleanup();

-- ================================================================ offline marking, the takeover window, claims as a sign of life
-- heartbeat 1 s x 3 = a 3 s window. A worker is offline once its silence exceeds the window; after a
-- takeover, silence counts from the takeover, with the same rule.
SELECT awp.configure(lease_duration_ms => 2000, heartbeat_interval_ms => 1000, offline_after_heartbeats => 3);
SELECT tests.freeze('2030-01-01 05:00:00+00') AS te \gset
SELECT tests.worker('silent') AS ws \gset
SELECT tests.freeze(:'te'::timestamptz + interval '10 s');
SELECT is(awp.coordinator_tick(true)->>'offline', '0', 'a takeover at te + 10 s marks nobody');
SELECT is((SELECT coordinator_since FROM awp.settings), :'te'::timestamptz + interval '10 s', '... and restarts the offline clock');
SELECT tests.freeze(:'te'::timestamptz + interval '13 s');
SELECT is(awp.mark_offline_workers(), 0, 'exactly one window after the takeover, silence counted from it is not over the window');
SELECT tests.freeze(:'te'::timestamptz + interval '13 s' + interval '1 microsecond');
SELECT is(awp.mark_offline_workers(), 1, '1 us later it is: the worker silent since before the takeover is offline');

SELECT tests.freeze(:'te'::timestamptz + interval '20 s') AS tq \gset
SELECT tests.worker('quiet') AS wq \gset
SELECT tests.freeze(:'tq'::timestamptz + interval '3 s');
SELECT is(awp.mark_offline_workers(), 0, 'a worker silent for exactly the window stays active');
SELECT tests.freeze(:'tq'::timestamptz + interval '3 s' + interval '1 microsecond');
SELECT is(awp.mark_offline_workers(), 1, '1 us more and it is offline');
SELECT results_eq(format($$SELECT status, offline_at FROM awp.workers WHERE worker_id = %L$$, :'wq'),
                  format($$VALUES ('offline'::text, %L::timestamptz + interval '3 s' + interval '1 microsecond')$$, :'tq'),
                  '... at that instant');

-- Takeover detection: a pass is a takeover when the previous one is more than a window old.
SELECT tests.freeze('2030-01-01 05:10:00+00') AS tt \gset
SELECT awp.coordinator_tick();
SELECT is((SELECT coordinator_since FROM awp.settings), :'tt'::timestamptz, 'setup: a pass long after the previous one is a takeover');
SELECT tests.freeze(:'tt'::timestamptz + interval '3 s');
SELECT awp.coordinator_tick();
SELECT is((SELECT coordinator_since FROM awp.settings), :'tt'::timestamptz,
          'a pass exactly one window after the previous one is no takeover (the clock still runs from tt)');
SELECT tests.freeze(:'tt'::timestamptz + interval '6 s' + interval '1 microsecond') AS tt6 \gset
SELECT awp.coordinator_tick();
SELECT is((SELECT coordinator_since FROM awp.settings), :'tt6'::timestamptz, 'one more than a window later it is');

-- A claim counts as a heartbeat when the last one is more than half an interval (500 ms) old.
SELECT tests.freeze('2030-01-01 05:20:00+00') AS tz \gset
SELECT tests.worker('claimer') AS wz \gset
SELECT tests.freeze(:'tz'::timestamptz + interval '500 ms');
SELECT is(tests.grab(:'wz'), 0::bigint, 'an empty claim at exactly half an interval after the last heartbeat');
SELECT is((SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = :'wz'), :'tz'::timestamptz,
          '... does not rewrite last_heartbeat_at');
SELECT tests.freeze(:'tz'::timestamptz + interval '500 ms' + interval '1 microsecond') AS tz5 \gset
SELECT is(tests.grab(:'wz'), 0::bigint, 'an empty claim 1 us later');
SELECT is((SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = :'wz'), :'tz5'::timestamptz, '... does');
SELECT tests.freeze(:'tz5'::timestamptz + interval '3 s');
SELECT is(awp.mark_offline_workers(), 0, 'so a worker that only claims is not offline a window after its registration');
SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000, offline_after_heartbeats => 3);
SELECT tests.cleanup();

-- ================================================================ the run output's 1 MiB bound, to the byte
-- Each leaf costs octet_length(output::text) + octet_length(key) + 6 bytes; a string output of n
-- characters is n + 2 bytes of text. 16 leaves of 65,000 characters cost 16 x 65,011 = 1,040,176; a
-- 17th of 8,389 characters (8,400) makes exactly 1,048,576: the bound itself, not over it.
SELECT tests.freeze('2030-01-01 06:00:00+00');
SELECT tests.worker('wf', 20) AS wf \gset
CREATE FUNCTION tests.output_run(p_id text, p_last integer) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  v_run text := tests.make_run(p_id, (SELECT jsonb_agg(tests.task('k' || lpad(i::text, 2, '0'))) FROM generate_series(1, 17) i), 20);
  v_key text;
BEGIN
  PERFORM awp.create_dispatches();
  PERFORM tests.grab(current_setting('tests.wf'), 17);
  FOR v_key IN SELECT task_key FROM awp.tasks WHERE run_id = v_run ORDER BY ordinal LOOP
    PERFORM tests.fin(v_run, v_key, to_jsonb(repeat('x', CASE WHEN v_key = 'k17' THEN p_last ELSE 65000 END)));
  END LOOP;
  RETURN v_run;
END $$;
SELECT set_config('tests.wf', :'wf', true);
SELECT tests.output_run('exact', 8389) AS rexact \gset
SELECT results_eq(format($$SELECT status, output_truncated, output->>'k17' IS NOT NULL FROM awp.runs WHERE run_id = %L$$, :'rexact'),
                  $$VALUES ('succeeded'::text, false, true)$$, 'outputs of exactly 1,048,576 bytes are kept whole');
SELECT tests.output_run('over', 8390) AS rover \gset
SELECT results_eq(format($$SELECT status, output_truncated, output ? 'k17', output->'k17', output->>'k16' IS NOT NULL FROM awp.runs WHERE run_id = %L$$, :'rover'),
                  $$VALUES ('succeeded'::text, true, true, 'null'::jsonb, true)$$,
                  'one byte more: the last leaf maps to null and output_truncated is set');

SELECT is_empty($$SELECT * FROM awp.check_invariants()$$, 'every invariant holds at the end');

SELECT * FROM finish();
ROLLBACK;
