-- Rules of the protocol that no other file pinned (each one found by `make mutate`: a mutant that broke
-- it passed the suite): a renewal never shortens a lease, nor renews one of a run being canceled or of
-- another worker; a silent draining worker goes offline; the reaper and retry promotion leave a run
-- being canceled to its cancellation; dispatch creation serves runs that never got a dispatch first; a
-- batch of completions respects run concurrency; and the checker accepts limits that are exactly reached.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(28);

SELECT tests.freeze('2030-01-01 00:00:00+00');
CREATE TABLE tests.sess (worker_id text PRIMARY KEY, token text NOT NULL);
CREATE FUNCTION tests.worker(p_name text, p_max integer DEFAULT 10) RETURNS text LANGUAGE sql AS $$
  INSERT INTO tests.sess SELECT r.worker_id, r.token FROM tests.register_worker(p_name, '{mock}', p_max) r
  RETURNING worker_id
$$;
CREATE FUNCTION tests.tok(p_worker text) RETURNS text LANGUAGE sql AS $$ SELECT token FROM tests.sess WHERE worker_id = p_worker $$;
SELECT tests.worker('first') AS w0 \gset
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w0', tests.tok(:'w0'), 1) WITH NO DATA;
CREATE FUNCTION tests.grab(p_worker text, p_slots integer DEFAULT 1) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  INSERT INTO l SELECT * FROM awp.claim_tasks(p_worker, tests.tok(p_worker), p_slots);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
-- tests.lease_json(run, key): [{dispatch_id, lease_token}] of the task's latest lease in l.
CREATE FUNCTION tests.lease_json(p_run text, p_key text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_array(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token))
    FROM l WHERE run_id = p_run AND task_key = p_key ORDER BY attempt DESC LIMIT 1
$$;
CREATE FUNCTION tests.expires(p_run text, p_key text) RETURNS timestamptz LANGUAGE sql AS $$
  SELECT d.lease_expires_at FROM awp.dispatches d JOIN l USING (dispatch_id) WHERE l.run_id = p_run AND l.task_key = p_key
   ORDER BY l.attempt DESC LIMIT 1
$$;
CREATE FUNCTION tests.cleanup() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM awp.request_cancel(run_id) FROM awp.runs WHERE status IN ('pending', 'running');
  PERFORM awp.converge_cancellations();
  UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE status IN ('active', 'draining');
END $$;
SELECT tests.cleanup();

-- ================================================================ renewals
SELECT tests.freeze('2030-01-01 01:00:00+00') AS t1 \gset
SELECT tests.worker('w1') AS w1 \gset
SELECT tests.worker('w2') AS w2 \gset
SELECT tests.make_run('renew', jsonb_build_array(tests.task('a'), tests.task('b'))) AS r1 \gset
SELECT tests.make_run('doomed', jsonb_build_array(tests.task('c'))) AS r2 \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'w1', 3), 3::bigint, 'setup: w1 holds three 15 s leases');
SELECT tests.advance('1 s');
SELECT is((SELECT status FROM awp.heartbeat(:'w2', tests.tok(:'w2'), tests.lease_json(:'r1', 'a'))), 'unknown',
          'another worker heartbeating w1''s lease with its token: unknown');
SELECT is(tests.expires(:'r1', 'a'), :'t1'::timestamptz + interval '15 s', '... and the lease is not renewed by it');
SELECT is((SELECT status FROM awp.request_cancel(:'r2')), 'running', 'setup: cancel requested while c is leased');
SELECT is((SELECT status FROM awp.heartbeat(:'w1', tests.tok(:'w1'), tests.lease_json(:'r2', 'c'))), 'revoked',
          'a lease of a run with a cancel request: revoked');
SELECT is(tests.expires(:'r2', 'c'), :'t1'::timestamptz + interval '15 s', '... and not renewed either');
SELECT awp.configure(lease_duration_ms => 5000, heartbeat_interval_ms => 1000);
SELECT is((SELECT status || ' ' || lease_remaining_ms FROM awp.heartbeat(:'w1', tests.tok(:'w1'), tests.lease_json(:'r1', 'b'))),
          'renewed 14000', 'after the lease duration was lowered to 5 s, a renewal keeps the 14 s left');
SELECT is(tests.expires(:'r1', 'b'), :'t1'::timestamptz + interval '15 s', '... a renewal never shortens a lease');
SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000);
SELECT tests.cleanup();

-- ================================================================ a silent draining worker goes offline
SELECT awp.configure(lease_duration_ms => 2000, heartbeat_interval_ms => 1000, offline_after_heartbeats => 3);
SELECT tests.freeze('2030-01-01 02:00:00+00') AS t2 \gset
SELECT awp.coordinator_tick(true);
SELECT tests.worker('drainer') AS wd \gset
SELECT tests.make_run('drained', jsonb_build_array(tests.task('d', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'))) AS rd \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'wd'), 1::bigint, 'setup: the worker holds a lease');
SELECT is((SELECT status FROM awp.drain_worker(:'wd', tests.tok(:'wd'))), 'draining', 'setup: and drains');
SELECT tests.advance('3 s');
SELECT tests.advance('1 microsecond');
SELECT is(awp.mark_offline_workers(), 1, 'silent for more than the window while draining: marked');
SELECT is(tests.worker_status(:'wd'), 'offline', '... offline (a draining worker is no exception)');
SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000, offline_after_heartbeats => 3);
SELECT tests.cleanup();

-- ================================================================ a run being canceled belongs to its cancellation
SELECT tests.freeze('2030-01-01 03:00:00+00') AS t3 \gset
SELECT tests.worker('w3') AS w3 \gset
SELECT tests.make_run('canceling', jsonb_build_array(tests.task('held'),
         tests.task('retrying', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 1000}}'))) AS r3 \gset
SELECT awp.create_dispatches();
SELECT is(tests.grab(:'w3', 2), 2::bigint, 'setup: both tasks leased');
SELECT ok(awp.complete_task(:'w3', tests.tok(:'w3'), l.dispatch_id, l.lease_token, '{"kind": "temporary_failure"}'),
          'setup: one fails temporarily (waiting_retry)') FROM l WHERE run_id = :'r3' AND task_key = 'retrying';
SELECT is((SELECT status FROM awp.request_cancel(:'r3')), 'running', 'setup: cancel requested while held is leased');
SELECT tests.advance('20 s');
SELECT is(awp.reap_expired_leases(), 0, 'the reaper leaves an expired lease of a run being canceled alone');
SELECT is(awp.promote_retries(), 0, '... and so does retry promotion, though the retry is due');
SELECT is(awp.converge_cancellations(), 1, 'the cancellation converges');
SELECT is((SELECT array_agg(status ORDER BY task_key, attempt) FROM awp.attempts WHERE run_id = :'r3'), ARRAY['canceled', 'failed'],
          '... and the held attempt ends canceled, not interrupted');
SELECT tests.cleanup();

-- ================================================================ dispatch creation: runs that never got a dispatch first
SELECT tests.freeze('2030-01-01 04:00:00+00');
SELECT awp.configure(dispatch_limit => 1);
SELECT tests.worker('w4') AS w4 \gset
SELECT tests.make_run('older', jsonb_build_array(tests.task('x'), tests.task('y'))) AS r_old \gset
SELECT tests.advance('1 s');
SELECT tests.make_run('newer', jsonb_build_array(tests.task('x'), tests.task('y'))) AS r_new \gset
SELECT awp.create_dispatches();
SELECT is((SELECT array_agg(run_id) FROM awp.dispatches WHERE status = 'pending'), ARRAY[:'r_old'],
          'dispatch_limit 1: one dispatch, for the older run (neither had one)');
SELECT is(tests.grab(:'w4'), 1::bigint, 'setup: leased');
SELECT awp.configure(dispatch_limit => 2);
SELECT is(awp.create_dispatches(), 1, 'room for one more');
SELECT is((SELECT run_id FROM awp.dispatches WHERE status = 'pending'), :'r_new',
          '... for the run that never got a dispatch, before the older one');
SELECT tests.cleanup();

-- ================================================================ a batch of completions respects run concurrency
-- Run A (concurrency 2): a1 leased by w5b, a2 by w5a; run B: b1, b2 by w5a. w5a completes a2, b1, b2 in
-- one batch: three freed slots, but only A has ready tasks, and A has room for one (a1 still runs).
SELECT tests.freeze('2030-01-01 05:00:00+00');
SELECT awp.configure(dispatch_limit => 100);
SELECT tests.worker('w5b', 1) AS w5b \gset
SELECT tests.make_run('conc-a', (SELECT jsonb_agg(tests.task('a' || i)) FROM generate_series(1, 4) i), 2) AS ra \gset
SELECT awp.create_dispatches();
SELECT tests.grab(:'w5b');
SELECT tests.worker('w5a', 3) AS w5a \gset
SELECT awp.create_dispatches();
SELECT tests.grab(:'w5a');
SELECT tests.make_run('conc-b', jsonb_build_array(tests.task('b1'), tests.task('b2')), 5) AS rb \gset
SELECT awp.create_dispatches();
SELECT tests.grab(:'w5a', 2);
SELECT is((SELECT array_agg(d.worker_id || ':' || l.task_key ORDER BY l.task_key) FROM l JOIN awp.dispatches d USING (dispatch_id)
            WHERE l.run_id IN (:'ra', :'rb')),
          ARRAY[:'w5b' || ':a1', :'w5a' || ':a2', :'w5a' || ':b1', :'w5a' || ':b2'], 'setup: the leases as planned');
SELECT is((SELECT jsonb_path_query_array(awp.complete_tasks(:'w5a', tests.tok(:'w5a'),
                     jsonb_agg(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token, 'result', '{"kind": "success"}'::jsonb)), 0),
                     '$.results[*].applied')
             FROM l WHERE task_key IN ('a2', 'b1', 'b2')), '[true, true, true]'::jsonb, 'w5a completes three leases in one batch');
SELECT is((SELECT count(*) FROM awp.tasks WHERE run_id = :'ra' AND status IN ('queued', 'running')), 2::bigint,
          'run A gets one refill dispatch, not three: queued + running stays at its concurrency');

-- ================================================================ the checker: limits exactly reached are no violation
SELECT tests.freeze('2030-01-01 06:00:00+00');
SELECT tests.cleanup();
SELECT tests.worker('w6', 2) AS w6 \gset
SELECT tests.make_run('full', (SELECT jsonb_agg(tests.task('f' || i)) FROM generate_series(1, 5) i), 3) AS rf \gset
SELECT awp.configure(dispatch_limit => 3);
SELECT tests.worker('w6b', 1) AS w6b \gset
SELECT awp.create_dispatches();
SELECT tests.grab(:'w6', 2);
SELECT set_config('tests.w6', :'w6', true);
SELECT results_eq($$SELECT (SELECT count(*) FROM awp.dispatches WHERE status IN ('pending', 'leased')),
                           (SELECT count(*) FROM awp.dispatches WHERE status = 'leased' AND worker_id = current_setting('tests.w6')),
                           (SELECT count(*) FROM awp.tasks t JOIN awp.runs r USING (run_id)
                             WHERE r.workflow_id = 'full' AND t.status IN ('queued', 'running'))$$,
                  $$VALUES (3::bigint, 2::bigint, 3::bigint)$$,
                  'setup: pending + leased = dispatch_limit, a worker at max_concurrency, a run at its concurrency');
SELECT is_empty($$SELECT * FROM awp.check_invariants()$$, 'limits exactly reached are no violation');

SELECT * FROM finish();
ROLLBACK;
