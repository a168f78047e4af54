-- awp.release_lease (drain without loss, AWP issue 41): a worker gives back a lease it cannot finish, fenced by its
-- lease token; the attempt is interrupted (worker_shutdown) and not counted, the task is due again at once and runs
-- on another worker even with max_attempts 1. awp.request_drain: an operator's drain; awp.worker_status.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(35);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 4) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 4) \gset w2_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'))) AS run \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset a_

-- Fencing and checks: the documented errors, nothing changed.
SELECT throws_ok(format($$SELECT awp.release_lease(%L, 'wrong', %L, %L, 'worker_shutdown')$$, :'w1_worker_id', :'a_dispatch_id', :'a_lease_token'),
                 'AWSES', NULL, 'a wrong session token is AWSES');
SELECT throws_ok(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'bored')$$, :'w1_worker_id', :'w1_token', :'a_dispatch_id', :'a_lease_token'),
                 'AWREQ', NULL, 'an unknown reason is AWREQ');
SELECT is(tests.error_detail(format($$SELECT awp.release_lease(%L, %L, %L, %L, NULL)$$, :'w1_worker_id', :'w1_token', :'a_dispatch_id', :'a_lease_token')),
          'reason must be one of: worker_shutdown', '... naming the reasons (also for none)');
SELECT throws_ok(format($$SELECT awp.release_lease(%L, %L, %L, 'not-the-token', 'worker_shutdown')$$, :'w1_worker_id', :'w1_token', :'a_dispatch_id'),
                 'AWLST', NULL, 'a wrong lease token is AWLST');
SELECT throws_ok(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'worker_shutdown')$$, :'w2_worker_id', :'w2_token', :'a_dispatch_id', :'a_lease_token'),
                 'AWLST', NULL, 'another worker (with the right lease token) is AWLST');
SELECT is(tests.error_detail(format($$SELECT awp.release_lease(%L, %L, 'dsp_nope', 'x', 'worker_shutdown')$$, :'w1_worker_id', :'w1_token')),
          'no dispatch dsp_nope', 'an unknown dispatch is AWLST naming it');
SELECT is(tests.dispatch_status(:'a_dispatch_id'), 'leased', 'none of them changed the lease');

-- Success: the attempt is interrupted, not counted; the task is due at once; events say why.
SELECT tests.advance('1 s') AS t1 \gset
SELECT is(awp.release_lease(:'w1_worker_id', :'w1_token', :'a_dispatch_id', :'a_lease_token', 'worker_shutdown'),
          'waiting_retry', 'released: the task waits for its retry');
SELECT results_eq(format($$SELECT status, counted, error_code FROM awp.attempts WHERE dispatch_id = %L$$, :'a_dispatch_id'),
                  $$VALUES ('interrupted'::text, false, 'worker_shutdown'::text)$$,
                  'the attempt is interrupted (worker_shutdown) and not counted');
SELECT is(tests.dispatch_status(:'a_dispatch_id'), 'expired', 'the dispatch expired');
SELECT results_eq(format($$SELECT attempts, uncounted_attempts, ready_at FROM awp.tasks WHERE run_id = %L AND task_key = 'a'$$, :'run'),
                  format($$VALUES (1, 1, %L::timestamptz)$$, :'t1'), 'the retry is due now, the attempt uncounted');
SELECT is(tests.events_of(:'run', 'a'),
          ARRAY['created->ready (task created)', 'ready->queued (dispatch created)', 'queued->running (attempt 1 started)',
                'running->waiting_retry (released by its worker (worker_shutdown))'],
          'the task''s events');
SELECT is((SELECT reason FROM awp.events WHERE run_id = :'run' AND entity_type = 'dispatch' AND entity_key = :'a_dispatch_id' AND to_status = 'expired'),
          'released by its worker (worker_shutdown)', 'the dispatch''s event');
SELECT is((SELECT reason FROM awp.events WHERE run_id = :'run' AND entity_type = 'attempt' AND to_status = 'interrupted'),
          'released by its worker (worker_shutdown)', 'the attempt''s event');
SELECT throws_ok(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'worker_shutdown')$$, :'w1_worker_id', :'w1_token', :'a_dispatch_id', :'a_lease_token'),
                 'AWLST', NULL, 'releasing it again is AWLST');
SELECT is(tests.error_detail(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'worker_shutdown')$$, :'w1_worker_id', :'w1_token', :'a_dispatch_id', :'a_lease_token')),
          'the dispatch is expired', '... the dispatch is expired');

-- The next attempt runs on another worker and succeeds, with max_attempts 1.
SELECT is(awp.drain_worker(:'w1_worker_id', :'w1_token') IS NOT NULL, true, '(w1 drains)');
SELECT is(tests.worker_status(:'w1_worker_id'), 'stopped', 'the drained worker holds no lease: stopped');
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset a2_
SELECT results_eq(format($$SELECT task_key, attempt FROM awp.dispatches WHERE dispatch_id = %L$$, :'a2_dispatch_id'),
                  $$VALUES ('a'::text, 2)$$, 'the task''s second attempt goes to the other worker');
SELECT is(tests.complete(:'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token'), true, 'it completes');
SELECT is(tests.run_status(:'run'), 'succeeded', 'the run succeeds with max_attempts 1');
SELECT is((SELECT array_agg(status || ':' || counted ORDER BY attempt) FROM awp.attempts WHERE run_id = :'run'),
          ARRAY['interrupted:false', 'succeeded:true'], 'attempt 1 not counted, attempt 2 succeeded');
SELECT is(tests.ok_run(:'run'), true, 'no invariant violated');

-- An already completed lease, an expired lease, a canceled run: AWLST.
SELECT tests.make_run('wf2', jsonb_build_array(tests.task('b'), tests.task('c'), tests.task('d'))) AS run2 \gset
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset b_
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset c_
SELECT is(tests.complete(:'w2_worker_id', :'w2_token', :'b_dispatch_id', :'b_lease_token'), true, '(one lease completed)');
SELECT is(tests.error_detail(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'worker_shutdown')$$, :'w2_worker_id', :'w2_token', :'b_dispatch_id', :'b_lease_token')),
          'the dispatch is completed', 'a completed lease is AWLST (the dispatch is completed)');
SELECT tests.advance('16 s');
SELECT is(tests.error_detail(format($$SELECT awp.release_lease(%L, %L, %L, %L, 'worker_shutdown')$$, :'w2_worker_id', :'w2_token', :'c_dispatch_id', :'c_lease_token')),
          'the lease has expired', 'an expired lease is AWLST (the lease has expired)');
SELECT is(tests.dispatch_status(:'c_dispatch_id'), 'leased', '... and left to the reaper');

-- awp.request_drain (operator) and awp.worker_status.
SELECT * FROM tests.register_worker('w3', '{mock}', 1) \gset w3_
SELECT is(awp.worker_status(:'w3_worker_id'), 'active', 'worker_status: active');
SELECT is(awp.worker_status('wkr_nope'), NULL, 'worker_status: NULL when unknown');
SELECT throws_ok($$SELECT * FROM awp.request_drain('wkr_nope')$$, 'AWNTF', NULL, 'request_drain: an unknown worker is AWNTF');
SELECT results_eq(format($$SELECT status, stopped_at FROM awp.request_drain(%L)$$, :'w3_worker_id'),
                  $$VALUES ('draining'::text, NULL::timestamptz)$$, 'an operator''s drain: active -> draining');
SELECT is(awp.worker_status(:'w3_worker_id'), 'draining', '... which its next heartbeat answers');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'w3_worker_id', :'w3_token'), 'AWDRN', NULL,
                 '... and it claims nothing');
SELECT is((SELECT status FROM awp.drain_worker(:'w3_worker_id', :'w3_token')), 'stopped', 'its own drain then stops it');
SELECT is((SELECT status FROM awp.request_drain(:'w3_worker_id')), 'stopped', 'an operator''s drain of a stopped worker changes nothing');

SELECT * FROM finish();
ROLLBACK;
