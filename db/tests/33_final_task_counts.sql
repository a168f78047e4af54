-- A finished run keeps its task counts (runs.final_task_counts, migration 0011_final_task_counts): stored when it
-- finishes (succeeded; failed, with skipped tasks; canceled), read from there by list_runs and get_run; a live
-- run's are counted from its tasks; awp.check_invariants (final_task_counts) compares the two.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(14);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('counter', '{mock}', 4) \gset w_

-- Succeeded: a -> b.
SELECT tests.make_run('ok', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'))) AS ok \gset
SELECT is((SELECT final_task_counts FROM awp.runs WHERE run_id = :'ok'), NULL, 'a live run stores no counts');
SELECT is((SELECT task_counts FROM awp.list_runs() WHERE run_id = :'ok'), '{"queued": 1, "waiting_dependencies": 1}'::jsonb,
          'a live run''s counts are counted from its tasks (list_runs)');
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l_
SELECT tests.complete(:'w_worker_id', :'w_token', :'l_dispatch_id', :'l_lease_token');
SELECT is((SELECT task_counts FROM awp.get_run(:'ok')), '{"queued": 1, "succeeded": 1}'::jsonb,
          'and follow its transitions (get_run)');
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l_
SELECT tests.complete(:'w_worker_id', :'w_token', :'l_dispatch_id', :'l_lease_token');
SELECT is(tests.run_status(:'ok'), 'succeeded', 'the run succeeded');
SELECT is((SELECT final_task_counts FROM awp.runs WHERE run_id = :'ok'), '{"succeeded": 2}'::jsonb,
          'a succeeded run stores its counts when it finishes');

-- Failed: a fails for good, so b (after a) is skipped; c succeeds.
SELECT tests.make_run('bad', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'), tests.task('c'))) AS bad \gset
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l1_
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l2_
SELECT tests.complete(:'w_worker_id', :'w_token', :'l1_dispatch_id', :'l1_lease_token',
                      CASE :'l1_task_key' WHEN 'a' THEN 'permanent_failure' ELSE 'success' END);
SELECT tests.complete(:'w_worker_id', :'w_token', :'l2_dispatch_id', :'l2_lease_token',
                      CASE :'l2_task_key' WHEN 'a' THEN 'permanent_failure' ELSE 'success' END);
SELECT is(tests.run_status(:'bad'), 'failed', 'the run failed');
SELECT is((SELECT final_task_counts FROM awp.runs WHERE run_id = :'bad'), '{"failed": 1, "skipped": 1, "succeeded": 1}'::jsonb,
          'a failed run stores its counts, skipped tasks included');

-- Canceled: a pending run, nothing leased, cancels at once.
SELECT tests.make_run('cx', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'))) AS cx \gset
SELECT tests.end_tx();
SELECT status FROM awp.request_cancel(:'cx');
SELECT is(tests.run_status(:'cx'), 'canceled', 'the run is canceled');
SELECT is((SELECT final_task_counts FROM awp.runs WHERE run_id = :'cx'), '{"canceled": 2}'::jsonb,
          'a canceled run stores its counts');
SELECT is_empty(format($$SELECT * FROM awp.check_invariants(ARRAY[%L, %L, %L])$$, :'ok', :'bad', :'cx'),
                'the stored counts agree with the tasks');

-- The reads take a finished run's counts from its row, not from its tasks: a planted value shows through.
UPDATE awp.runs SET final_task_counts = '{"succeeded": 99}' WHERE run_id = :'ok';
SELECT is((SELECT task_counts FROM awp.list_runs() WHERE run_id = :'ok'), '{"succeeded": 99}'::jsonb,
          'list_runs reads a finished run''s stored counts');
SELECT is((SELECT task_counts FROM awp.get_run(:'ok')), '{"succeeded": 99}'::jsonb, 'so does get_run');
SELECT results_eq(format($$SELECT invariant, run_id FROM awp.check_invariants(ARRAY[%L])$$, :'ok'),
                  format($$VALUES ('final_task_counts'::text, %L::text)$$, :'ok'),
                  'check_invariants reports stored counts that differ from the tasks');
UPDATE awp.runs SET final_task_counts = NULL WHERE run_id = :'ok';
SELECT results_eq(format($$SELECT invariant, run_id FROM awp.check_invariants(ARRAY[%L])$$, :'ok'),
                  format($$VALUES ('final_task_counts'::text, %L::text)$$, :'ok'),
                  'and a finished run without stored counts');

SELECT * FROM finish();
ROLLBACK;
