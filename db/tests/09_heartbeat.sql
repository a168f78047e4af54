-- awp.heartbeat: liveness (also idle), and per lease renewed / revoked / unknown (docs/protocol.md, rule 6);
-- never renews past the attempt deadline; AWSES first; AWREQ for malformed leases.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(40);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 8) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 8) \gset w2_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('x', '{}', '{"timeout_ms": 20000}'),
                                              tests.task('y', '{}', '{"timeout_ms": 60000}'),
                                              tests.task('z', '{}', '{"timeout_ms": 60000}'),
                                              tests.task('q', '{}', '{"timeout_ms": 60000}'))) AS run \gset
SELECT tests.make_run('other') AS runb \gset
SELECT tests.dispatch_all();
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 5);
SELECT is((SELECT count(*) FROM l), 5::bigint, 'setup: w1 holds five leases');
CREATE FUNCTION tests.lease(p_key text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token) FROM l
   WHERE task_key = p_key AND (p_key <> 'a' OR workflow_id = 'other')
$$;
CREATE FUNCTION tests.hb(p_worker text, p_token text, VARIADIC p_leases jsonb[] DEFAULT '{}')
RETURNS TABLE (k text, status text, ms bigint) LANGUAGE sql AS $$
  SELECT coalesce(l.task_key, h.dispatch_id), h.status, h.lease_remaining_ms
    FROM awp.heartbeat(p_worker, p_token, to_jsonb(p_leases)) WITH ORDINALITY h
    LEFT JOIN l ON l.dispatch_id = h.dispatch_id ORDER BY h.ordinality
$$;
SELECT l.dispatch_id AS x_id, l.lease_expires_at AS x_exp FROM l WHERE task_key = 'x' \gset
SELECT l.dispatch_id AS q_id, l.lease_expires_at AS q_exp FROM l WHERE task_key = 'q' \gset
SELECT l.dispatch_id AS y_id FROM l WHERE task_key = 'y' \gset

-- Idle heartbeat.
SELECT tests.advance('5 s') AS t5 \gset
SELECT is((SELECT count(*) FROM awp.heartbeat(:'w2_worker_id', :'w2_token', '[]')), 0::bigint, 'an idle heartbeat answers no lease');
SELECT is((SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = :'w2_worker_id'), :'t5'::timestamptz,
          'an idle heartbeat records liveness');
SELECT is((SELECT count(*) FROM awp.heartbeat(:'w2_worker_id', :'w2_token', NULL)), 0::bigint, 'null leases are an empty list');

-- Renewal.
SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev0 \gset
SELECT tests.event_count(:'run') AS ev0 \gset
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('y'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('y'::text, 'renewed'::text, 15000::bigint)$$, 'a valid lease is renewed for the lease duration');
SELECT is((SELECT lease_expires_at FROM awp.dispatches WHERE dispatch_id = :'y_id'), :'t5'::timestamptz + interval '15 s',
          'lease_expires_at := now + lease_duration');
SELECT is((SELECT last_heartbeat_at FROM awp.workers WHERE worker_id = :'w1_worker_id'), :'t5'::timestamptz, 'liveness recorded');
SELECT is(tests.rev(:'run'), :'rev0'::bigint, 'a heartbeat does not move the run''s revision');
SELECT is(tests.event_count(:'run'), :'ev0'::bigint, '... nor write events');

SELECT tests.advance('5 s') AS t10 \gset
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('x'),
                                                  jsonb_build_object('dispatch_id', %L, 'lease_token', 'wrong'),
                                                  '{"dispatch_id": "dsp_nope", "lease_token": "t"}', tests.lease('y'))$$,
                         :'w1_worker_id', :'w1_token', :'y_id'),
                  $$VALUES ('x'::text, 'renewed'::text, 10000::bigint), ('y', 'unknown', 0::bigint),
                           ('dsp_nope', 'unknown', 0), ('y', 'renewed', 15000)$$,
                  'answers in request order: renewed up to the deadline; wrong token and unknown id are unknown');
SELECT is((SELECT lease_expires_at FROM awp.dispatches WHERE dispatch_id = :'x_id'), :'t0'::timestamptz + interval '20 s',
          'a renewal never goes past the attempt deadline');
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('y'))$$, :'w2_worker_id', :'w2_token'),
                  $$VALUES ('y'::text, 'unknown'::text, 0::bigint)$$, 'another worker''s lease is unknown, even with its token');
SELECT is((SELECT lease_expires_at FROM awp.dispatches WHERE dispatch_id = :'y_id'), :'t10'::timestamptz + interval '15 s',
          '... and is not renewed by it');

-- Completed and canceled.
SELECT ok(tests.complete(:'w1_worker_id', :'w1_token', (SELECT dispatch_id FROM l WHERE task_key = 'z'),
                         (SELECT lease_token FROM l WHERE task_key = 'z')), 'setup: z completed');
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('z'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('z'::text, 'revoked'::text, 0::bigint)$$, 'a completed lease is revoked');
SELECT is((SELECT status FROM awp.request_cancel(:'runb')), 'running', 'setup: cancel requested for the other run');
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('a'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('a'::text, 'revoked'::text, 0::bigint)$$, 'a lease of a run with a cancel request is revoked');
SELECT tests.dispatch_all();
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('a'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('a'::text, 'revoked'::text, 0::bigint)$$, '... and stays revoked once the cancel converged');

-- Expiry and deadline, before the reaper ran.
SELECT tests.advance('11 s') AS t21 \gset
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('x'), tests.lease('q'), tests.lease('y'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('x'::text, 'revoked'::text, 0::bigint), ('q', 'revoked', 0), ('y', 'renewed', 15000)$$,
                  'past the deadline: revoked; lease expired (not yet reaped): revoked; a live lease renews');
SELECT is((SELECT lease_expires_at FROM awp.dispatches WHERE dispatch_id = :'q_id'), :'q_exp'::timestamptz,
          'an expired lease is not revived');
SELECT is((SELECT status FROM awp.dispatches WHERE dispatch_id = :'q_id'), 'leased', '(the reaper has not run yet)');
SELECT is((SELECT lease_expires_at FROM awp.dispatches WHERE dispatch_id = :'x_id'), :'t0'::timestamptz + interval '20 s',
          'a lease past its deadline is not renewed');

-- Draining workers still heartbeat.
SELECT is((SELECT status FROM awp.drain_worker(:'w1_worker_id', :'w1_token')), 'draining', 'setup: w1 draining');
SELECT tests.advance('1 s');
SELECT results_eq(format($$SELECT * FROM tests.hb(%L, %L, tests.lease('y'))$$, :'w1_worker_id', :'w1_token'),
                  $$VALUES ('y'::text, 'renewed'::text, 15000::bigint)$$, 'a draining worker renews its leases');

-- Errors.
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, 'wrong', '[]')$$, :'w1_worker_id'), 'AWSES', NULL, 'a wrong session token is AWSES');
SELECT throws_ok($$SELECT * FROM awp.heartbeat('wkr_nope', 'x', '[]')$$, 'AWSES', NULL, 'an unknown worker is AWSES');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, 'wrong', '"bad"')$$, :'w1_worker_id'), 'AWSES', NULL,
                 'the session is checked before the leases');
UPDATE awp.workers SET status = 'offline', offline_at = awp._now() WHERE worker_id = :'w2_worker_id';
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]')$$, :'w2_worker_id', :'w2_token'), 'AWSES', NULL,
                 'an offline worker is AWSES (it must register anew)');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token', '{}'), 'AWREQ', NULL,
                 'leases that are not an array are AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token', '["dsp"]'), 'AWREQ', NULL,
                 'a lease that is not an object is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token', '[{"dispatch_id": "d"}]'), 'AWREQ', NULL,
                 'a lease without lease_token is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token', '[{"dispatch_id": "d", "lease_token": 1}]'), 'AWREQ', NULL,
                 'a non-string lease_token is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token', '[{"dispatch_id": "d", "lease_token": "t", "x": 1}]'), 'AWREQ', NULL,
                 'an unknown lease field is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, %L)$$, :'w1_worker_id', :'w1_token',
                        (SELECT jsonb_agg(jsonb_build_object('dispatch_id', 'd' || i, 'lease_token', 't')) FROM generate_series(1, 1025) i)),
                 'AWREQ', NULL, 'more than 1024 leases is AWREQ');
SELECT is((SELECT count(*) FROM awp.heartbeat(:'w1_worker_id', :'w1_token',
                        (SELECT jsonb_agg(jsonb_build_object('dispatch_id', 'd' || i, 'lease_token', 't')) FROM generate_series(1, 1024) i))),
          1024::bigint, '1024 leases are answered one by one');

-- A heartbeat waits for its worker's row with twice lock_timeout (awp._outwait_completion), once per transaction.
SET LOCAL lock_timeout = '2s';
SELECT lives_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]')$$, :'w1_worker_id', :'w1_token'), 'a heartbeat with lock_timeout 2s');
SELECT is(current_setting('lock_timeout'), '4s', 'its transaction waits for locks twice as long');
SELECT is((SELECT count(*) FROM generate_series(1, 25) i,   -- i in the argument: one call per row
                   LATERAL awp.heartbeat(:'w1_worker_id', :'w1_token', CASE WHEN i > 0 THEN '[]'::jsonb END)), 0::bigint,
          '25 more heartbeats in the same transaction');
SELECT is(current_setting('lock_timeout'), '4s', 'doubled once, not once per heartbeat');
SET LOCAL lock_timeout = 0;
SELECT * FROM awp.heartbeat(:'w1_worker_id', :'w1_token', '[]');
SELECT is(current_setting('lock_timeout'), '0', 'no limit stays no limit');

SELECT * FROM finish();
ROLLBACK;
