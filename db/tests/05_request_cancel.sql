-- awp.request_cancel: durable intent first, convergence second (docs/protocol.md, rule 10).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(34);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset

-- A pending run with nothing leased cancels at once.
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'))) AS run \gset
SELECT tests.end_tx();
SELECT tests.advance('1 second') AS t1 \gset
SELECT results_eq(format('SELECT * FROM awp.request_cancel(%L)', :'run'),
                  format($$VALUES (%L::text, 'canceled'::text, %L::timestamptz)$$, :'run', :'t1'),
                  'a pending run with nothing leased is canceled at once');
SELECT is(tests.task_statuses(:'run'), ARRAY['a=canceled', 'b=canceled'], 'its ready and waiting tasks are canceled');
SELECT is((SELECT finished_at FROM awp.runs WHERE run_id = :'run'), :'t1'::timestamptz, 'finished_at is set');
SELECT is(tests.rev(:'run'), 2::bigint, 'the whole cancellation is one revision');
SELECT results_eq(format($$SELECT entity_type, coalesce(from_status, '-'), to_status FROM awp.events WHERE run_id = %L AND sequence > 3 ORDER BY sequence$$, :'run'),
                  $$VALUES ('run'::text, 'pending'::text, 'pending'::text), ('task', 'ready', 'canceled'),
                           ('task', 'waiting_dependencies', 'canceled'), ('run', 'pending', 'canceled')$$,
                  'events: cancel requested, tasks canceled, run canceled');
SELECT ok(tests.sequences_contiguous(:'run'), 'the event sequence stays contiguous');

-- A terminal run is returned unchanged.
SELECT tests.end_tx();
SELECT tests.advance('1 second');
SELECT results_eq(format('SELECT * FROM awp.request_cancel(%L)', :'run'),
                  format($$VALUES (%L::text, 'canceled'::text, %L::timestamptz)$$, :'run', :'t1'),
                  'cancelling a canceled run changes nothing');
SELECT is(tests.rev(:'run'), 2::bigint, '... its revision does not move');
SELECT is(tests.event_count(:'run'), 7::bigint, '... and no event is added');
SELECT throws_ok($$SELECT * FROM awp.request_cancel('run_nope')$$, 'AWNTF', NULL, 'an unknown run is AWNTF');

-- A running run with a lease: intent now, convergence by the coordinator.
SELECT * FROM tests.register_worker('w1', '{mock}', 2) \gset w1_
SELECT tests.make_run('wf2', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'), tests.task('d', '{a}'))) AS run2 \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT dispatch_id AS pending_dispatch FROM awp.dispatches WHERE run_id = :'run2' AND status = 'pending' \gset
SELECT tests.now() AS t_claim \gset
SELECT is(ARRAY(SELECT status FROM awp.tasks WHERE run_id = :'run2' ORDER BY status), ARRAY['queued', 'ready', 'running', 'waiting_dependencies'],
          'setup: one task running, one queued, one ready, one waiting');
SELECT tests.end_tx();
SELECT tests.advance('1 second') AS t2 \gset
SELECT results_eq(format('SELECT * FROM awp.request_cancel(%L)', :'run2'),
                  format($$VALUES (%L::text, 'running'::text, %L::timestamptz)$$, :'run2', :'t2'),
                  'a run with a lease stays running with cancel_requested_at set');
SELECT is(tests.dispatch_status(:'l_dispatch_id'), 'leased', 'the lease is not revoked by the request itself');
SELECT is(tests.task_status(:'run2', 'c'), 'ready', 'tasks are not touched by the request itself');
SELECT is(tests.rev(:'run2'), (SELECT max(revision) FROM awp.events WHERE run_id = :'run2'), 'revision matches the last event');
SELECT tests.end_tx();
SELECT tests.advance('1 second');
SELECT results_eq(format('SELECT status, cancel_requested_at FROM awp.request_cancel(%L)', :'run2'),
                  format($$VALUES ('running'::text, %L::timestamptz)$$, :'t2'),
                  'a second request keeps the first cancel_requested_at');
SELECT is((SELECT count(*) FROM awp.events WHERE run_id = :'run2' AND reason = 'cancel requested'), 1::bigint,
          '... and logs no second request');
SELECT * FROM tests.register_worker('w2', '{mock}', 2) \gset w2_
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 2)), 0::bigint,
          'the pending dispatch of a run being canceled cannot be claimed');

SELECT tests.end_tx();
SELECT tests.advance('1 second') AS t3 \gset
SELECT is((awp.coordinator_tick()->>'canceled')::integer, 1, 'the coordinator converges one run');
SELECT is(tests.run_status(:'run2'), 'canceled', 'the run is canceled');
SELECT is(tests.task_statuses(:'run2'), ARRAY['a=canceled', 'b=canceled', 'c=canceled', 'd=canceled'], 'every unfinished task is canceled');
SELECT is(tests.dispatch_status(:'l_dispatch_id'), 'canceled', 'the leased dispatch is revoked (canceled)');
SELECT is(tests.dispatch_status(:'pending_dispatch'), 'canceled', 'the pending dispatch is canceled');
SELECT results_eq(format($$SELECT status, finished_at FROM awp.attempts WHERE run_id = %L$$, :'run2'),
                  format($$VALUES ('canceled'::text, %L::timestamptz)$$, :'t3'), 'the running attempt is canceled');
SELECT is((SELECT finished_at FROM awp.runs WHERE run_id = :'run2'), :'t3'::timestamptz, 'the run''s finished_at is the convergence time');
SELECT is((SELECT started_at FROM awp.runs WHERE run_id = :'run2'), :'t_claim'::timestamptz, 'started_at stays the first dispatch time');
SELECT results_eq(format($$SELECT entity_type, from_status, count(*)::integer FROM awp.events WHERE run_id = %L AND to_status = 'canceled' GROUP BY 1, 2 ORDER BY 1, 2$$, :'run2'),
                  $$VALUES ('attempt'::text, 'running'::text, 1), ('dispatch', 'leased', 1), ('dispatch', 'pending', 1),
                           ('run', 'running', 1), ('task', 'queued', 1), ('task', 'ready', 1), ('task', 'running', 1),
                           ('task', 'waiting_dependencies', 1)$$,
                  'every cancellation is an event with its from status');
SELECT ok(tests.sequences_contiguous(:'run2'), 'sequences stay contiguous');
SELECT is((SELECT count(DISTINCT revision) FROM awp.events WHERE run_id = :'run2' AND reason IN ('run canceled', 'cancellation converged')),
          1::bigint, 'convergence is one revision');
SELECT is((awp.coordinator_tick()->>'canceled')::integer, 0, 'a converged run is not converged again');
SELECT is((SELECT active_leases FROM awp.get_worker(:'w1_worker_id')), 0, 'the worker''s slot is free again');

-- A running run whose only dispatch is still pending (nothing leased) cancels at once.
SELECT tests.make_run('wf3', jsonb_build_array(tests.task('a'))) AS run3 \gset
SELECT tests.dispatch_all();
SELECT is(tests.run_status(:'run3'), 'running', 'setup: a running run with a pending dispatch');
SELECT is((SELECT status FROM awp.request_cancel(:'run3')), 'canceled', 'with nothing leased it cancels at once');
SELECT is((SELECT status FROM awp.dispatches WHERE run_id = :'run3'), 'canceled', 'its pending dispatch is canceled');

SELECT * FROM finish();
ROLLBACK;
