-- awp.drain_worker: active -> draining while leases remain (or straight to stopped), draining with
-- no lease -> stopped; a draining worker heartbeats and completes but never claims.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(20);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('idle', '{mock}', 2) \gset i_
SELECT results_eq(format($$SELECT worker_id, status, active_leases, stopped_at FROM awp.drain_worker(%L, %L)$$, :'i_worker_id', :'i_token'),
                  format($$VALUES (%L::text, 'stopped'::text, 0, %L::timestamptz)$$, :'i_worker_id', :'t0'),
                  'an active worker without leases stops at once');
SELECT throws_ok(format($$SELECT * FROM awp.drain_worker(%L, %L)$$, :'i_worker_id', :'i_token'), 'AWSES', NULL,
                 'a stopped session is AWSES, also for drain');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]')$$, :'i_worker_id', :'i_token'), 'AWSES', NULL,
                 'a stopped session cannot heartbeat');
SELECT throws_ok($$SELECT * FROM awp.drain_worker('wkr_nope', 'x')$$, 'AWSES', NULL, 'an unknown worker is AWSES');

SELECT * FROM tests.register_worker('busy', '{mock}', 3) \gset b_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c', '{a}'))) AS run \gset
SELECT tests.dispatch_all();
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'b_worker_id', :'b_token', 2);
SELECT tests.advance('1 s') AS t1 \gset
SELECT results_eq(format($$SELECT status, active_leases, stopped_at FROM awp.drain_worker(%L, %L)$$, :'b_worker_id', :'b_token'),
                  $$VALUES ('draining'::text, 2, NULL::timestamptz)$$, 'a worker holding leases becomes draining');
SELECT is((SELECT draining_at FROM awp.workers WHERE worker_id = :'b_worker_id'), :'t1'::timestamptz, 'draining_at is recorded');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'b_worker_id', :'b_token'), 'AWDRN', NULL, 'a draining worker cannot claim');
SELECT is((SELECT status FROM awp.drain_worker(:'b_worker_id', :'b_token')), 'draining', 'draining again while leases remain stays draining');
SELECT is((SELECT draining_at FROM awp.workers WHERE worker_id = :'b_worker_id'), :'t1'::timestamptz, '... keeping the first draining_at');
SELECT is((SELECT count(*) FROM awp.heartbeat(:'b_worker_id', :'b_token',
             (SELECT jsonb_agg(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token)) FROM l)) WHERE status = 'renewed'),
          2::bigint, 'a draining worker renews its leases');

-- A draining worker's capacity is not offered to new work.
SELECT is((awp.coordinator_tick()->>'dispatched')::integer, 0, 'no dispatch is created for a draining worker''s free slot');
SELECT is(tests.task_status(:'run', 'c'), 'waiting_dependencies', '(c waits for a)');

-- Another worker is active now, so a dispatch could be created: the draining worker's completion still does not
-- refill its slot (awp._refill_slot); c stays ready for the coordinator.
SELECT * FROM tests.register_worker('other', '{mock}', 1) \gset o_
SELECT is((SELECT bool_and(awp.complete_task(:'b_worker_id', :'b_token', dispatch_id, lease_token, '{"kind": "success"}')) FROM l WHERE task_key = 'a'),
          true, 'a draining worker completes a lease');
SELECT is(tests.task_status(:'run', 'c'), 'ready', '... and its result counts (c ready, not refilled to the draining worker''s slot)');
SELECT is((SELECT status FROM awp.drain_worker(:'b_worker_id', :'b_token')), 'draining', 'one lease left: still draining');
SELECT is((SELECT bool_and(awp.complete_task(:'b_worker_id', :'b_token', dispatch_id, lease_token, '{"kind": "success"}')) FROM l WHERE task_key = 'b'),
          true, 'the last lease completes');
SELECT is(tests.worker_status(:'b_worker_id'), 'draining', 'completing the last lease alone does not stop the worker');
SELECT tests.advance('1 s') AS t2 \gset
SELECT results_eq(format($$SELECT status, active_leases, stopped_at FROM awp.drain_worker(%L, %L)$$, :'b_worker_id', :'b_token'),
                  format($$VALUES ('stopped'::text, 0, %L::timestamptz)$$, :'t2'), 'draining with no lease left: stopped with stopped_at');
SELECT throws_ok(format($$SELECT awp.check_worker_session(%L, %L)$$, :'b_worker_id', :'b_token'), 'AWSES', NULL, 'the stopped session is over');
SELECT is(tests.run_status(:'run'), 'running', 'draining never cancels user runs');

SELECT * FROM finish();
ROLLBACK;
