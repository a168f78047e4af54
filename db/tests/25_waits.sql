-- Why a task waits (awp.run_waits, run_tasks / get_task wait_reason, get_run waiting; docs/limits.md): one
-- scenario per reason code, checked against what the coordinator then does; the limits a pass reports
-- (coordinator_tick()->'limited'); the default dispatch_limit does not cap 200 worker slots; the cluster
-- signals (executor_stats, cluster_status).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(59);

SELECT tests.freeze('2030-01-01 00:00:00+00');
-- tests.reset(): cancel every live run and stop every live worker, so scenarios do not mix.
CREATE FUNCTION tests.reset() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM awp.request_cancel(run_id) FROM awp.runs WHERE status IN ('pending', 'running');
  PERFORM awp.coordinator_tick();
  UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE status IN ('active', 'draining');
END $$;
-- tests.reasons(run): 'key=reason' in definition order.
CREATE FUNCTION tests.reasons(p_run_id text) RETURNS text[] LANGUAGE sql AS $$
  SELECT array_agg(task_key || '=' || reason) FROM awp.run_waits(p_run_id)
$$;
-- tests.reason_counts(run): 'reason=n' sorted.
CREATE FUNCTION tests.reason_counts(p_run_id text) RETURNS text[] LANGUAGE sql AS $$
  SELECT array_agg(reason || '=' || n ORDER BY reason) FROM (SELECT reason, count(*) AS n FROM awp.run_waits(p_run_id) GROUP BY 1) x
$$;
CREATE FUNCTION tests.detail(p_run_id text, p_key text) RETURNS text LANGUAGE sql AS $$
  SELECT detail FROM awp.run_waits(p_run_id) WHERE task_key = p_key
$$;
CREATE FUNCTION tests.tasks(p_prefix text, p_n integer, p_extra jsonb DEFAULT '{}') RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_agg(tests.task(p_prefix || i, '{}', p_extra) ORDER BY i) FROM generate_series(1, p_n) i
$$;

-- ================================================================ the default dispatch_limit
SELECT is(awp.get_settings()->>'dispatch_limit', '10000', 'the default dispatch_limit is 10,000');
SELECT is((SELECT column_default FROM information_schema.columns
            WHERE table_schema = 'awp' AND table_name = 'settings' AND column_name = 'dispatch_limit'), '10000',
          'and so is the column default of a new database');
-- The issue's cluster: 2 workers x concurrency 100 = 200 slots, one run that allows 250 at once.
SELECT * FROM tests.register_worker('big1', '{mock}', 100) \gset b1_
SELECT * FROM tests.register_worker('big2', '{mock}', 100) \gset b2_
SELECT tests.make_run('wide', tests.tasks('t', 250), 1000) AS wide \gset
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'wide' AND status = 'pending'), 200::bigint,
          'default settings: the run''s start fills all 200 worker slots (the old default held 100)');
SELECT is(awp.coordinator_tick()->'limited', '["workers_full"]', 'what holds the other 50 is the workers, not a global limit');
SELECT is(tests.reason_counts(:'wide'), ARRAY['waiting_for_claim=200', 'workers_full=50'],
          '200 dispatched tasks wait for a claim, 50 for a free worker slot');
SELECT is(tests.detail(:'wide', 't201'),
          'every active worker offering executor mock is busy: 0 of 200 slot(s) on 2 worker(s) leased, 200 dispatch(es) pending',
          'workers_full names the kind, its slots, workers and pending dispatches');
SELECT is((SELECT wait_reason || ' / ' || wait_detail FROM awp.run_tasks(:'wide') WHERE task_key = 't1'),
          'waiting_for_claim / dispatched 0 ms ago; waiting for a worker offering executor mock to claim it (200 free slot(s) on 2 active worker(s))',
          'run_tasks carries wait_reason and wait_detail');
SELECT is((SELECT waiting FROM awp.get_run(:'wide')), '{"waiting_for_claim": 200, "workers_full": 50}'::jsonb,
          'get_run counts the waiting tasks by reason');
SELECT is((SELECT wait_reason FROM awp.get_task(:'wide', 't250')), 'workers_full', 'get_task carries wait_reason');
SELECT is(awp.executor_stats()->'mock', '{"workers": 2, "slots": 200, "free_slots": 200, "pending": 200, "leased": 0, "ready": 50}'::jsonb,
          'executor_stats: per kind workers, slots, free slots, pending and leased dispatches, ready tasks');
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'b1_worker_id', :'b1_token', 100)), 100::bigint, 'setup: big1 leases 100');
SELECT is(awp.cluster_status() - 'last_tick_at' - 'oldest_waiting' - 'executors',
          '{"dispatch_limit": 10000, "dispatches": {"pending": 100, "leased": 100}, "workers": {"active": 2, "draining": 0},
            "runs": {"pending": 0, "running": 1}}'::jsonb, 'cluster_status: in flight vs dispatch_limit, workers, runs');
SELECT is((SELECT jsonb_build_object('run_id', o->>'run_id', 'status', o->>'status', 'reason', o->>'reason')
             FROM (SELECT awp.cluster_status()->'oldest_waiting' AS o) x),
          jsonb_build_object('run_id', :'wide', 'status', 'queued', 'reason', 'waiting_for_claim'),
          'cluster_status: the oldest waiting task (ready or queued) and why');
SELECT tests.reset();

-- ================================================================ no worker, dependencies, waiting for dispatch / claim
SELECT tests.make_run('dag', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'),
                                               tests.task('c', '{}', '{"executor": "python"}'),
                                               tests.task('d', '{a,b}'))) AS dag \gset
SELECT is(tests.reasons(:'dag'), ARRAY['a=no_worker_for_executor', 'b=waiting_dependencies', 'c=no_worker_for_executor',
                                       'd=waiting_dependencies'], 'no active worker offers mock or python; b and d wait for dependencies');
SELECT is((SELECT waiting_on FROM awp.run_waits(:'dag') WHERE task_key = 'd'), ARRAY['a', 'b'], 'waiting_on: the dependencies not yet succeeded');
SELECT is(tests.detail(:'dag', 'd'), 'waiting for 2 of its 2 dependencies: a (ready), b (waiting dependencies)', 'the detail names them with their status');
SELECT is(tests.detail(:'dag', 'c'), 'no active worker offers executor python: the task waits until one registers',
          'no_worker_for_executor names the kind');
SELECT is(awp.coordinator_tick()->'limited', '["no_worker_for_executor"]', 'the pass reports the limit that holds');
SELECT * FROM tests.register_worker('w1', '{mock}', 4) \gset w1_
SELECT is(tests.reasons(:'dag'), ARRAY['a=waiting_for_dispatch', 'b=waiting_dependencies', 'c=no_worker_for_executor',
                                       'd=waiting_dependencies'], 'a worker for mock: nothing holds a until the next pass');
SELECT is(tests.detail(:'dag', 'a'), 'nothing holds it: the next coordinator pass dispatches it', 'waiting_for_dispatch detail');
SELECT is(awp.coordinator_tick()->>'dispatched', '1', 'the pass dispatches exactly the task that said waiting_for_dispatch');
SELECT is(tests.reasons(:'dag'), ARRAY['a=waiting_for_claim', 'b=waiting_dependencies', 'c=no_worker_for_executor',
                                       'd=waiting_dependencies'], 'a is dispatched: it waits for a claim');
UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE worker_id = :'w1_worker_id';
SELECT is(tests.detail(:'dag', 'a'), 'no active worker offers executor mock: the task waits until one registers (its dispatch is withdrawn by the next coordinator pass)',
          'a queued task whose kind lost its workers: no_worker_for_executor');
SELECT is(awp.coordinator_tick()->>'withdrawn', '1', '... and the pass withdraws its dispatch');
SELECT tests.reset();

-- ================================================================ run concurrency
SELECT tests.make_run('narrow', tests.tasks('n', 5), 2) AS narrow \gset
SELECT * FROM tests.register_worker('w2', '{mock}', 10) \gset w2_
SELECT is(tests.reasons(:'narrow'), ARRAY['n1=waiting_for_dispatch', 'n2=waiting_for_dispatch', 'n3=run_concurrency',
                                          'n4=run_concurrency', 'n5=run_concurrency'],
          'concurrency 2: the two places go to the first tasks in definition order');
SELECT is(tests.detail(:'narrow', 'n3'), 'the run''s concurrency is 2 with 0 of its tasks queued or running: the 2 place(s) left go to its tasks before this one',
          'run_concurrency detail before the pass');
SELECT is(awp.coordinator_tick() - 'reaped' - 'offline' - 'canceled' - 'promoted' - 'withdrawn' - 'schedules_fired' - 'resumed' - 'children' - 'waits',
          '{"dispatched": 2, "limited": ["run_concurrency"]}'::jsonb, 'the pass dispatches those two and reports run_concurrency');
SELECT is(tests.detail(:'narrow', 'n5'), 'the run''s concurrency is 2 and 2 of its tasks are queued or running',
          'run_concurrency detail at the limit');
SELECT tests.reset();

-- ================================================================ global dispatch_limit
SELECT awp.configure(dispatch_limit => 3);
SELECT tests.make_run('capped', tests.tasks('c', 5), 10) AS capped \gset
SELECT * FROM tests.register_worker('w3', '{mock}', 10) \gset w3_
SELECT is(tests.reasons(:'capped'), ARRAY['c1=waiting_for_dispatch', 'c2=waiting_for_dispatch', 'c3=waiting_for_dispatch',
                                          'c4=dispatch_limit', 'c5=dispatch_limit'],
          'dispatch_limit 3 with 10 free slots: the limit holds the 4th and 5th');
SELECT is(tests.detail(:'capped', 'c4'), 'the global dispatch_limit 3 allows 3 more dispatch(es), which go to tasks before this one',
          'dispatch_limit detail before the pass');
SELECT is(awp.coordinator_tick() - 'reaped' - 'offline' - 'canceled' - 'promoted' - 'withdrawn' - 'schedules_fired' - 'resumed' - 'children' - 'waits',
          '{"dispatched": 3, "limited": ["dispatch_limit"]}'::jsonb, 'the pass dispatches 3 and reports dispatch_limit');
SELECT is(tests.detail(:'capped', 'c5'), 'the global dispatch_limit 3 is reached: 3 dispatches are pending or leased',
          'dispatch_limit detail at the limit');
SELECT awp.configure(dispatch_limit => 10);
SELECT is(tests.reasons(:'capped'), ARRAY['c1=waiting_for_claim', 'c2=waiting_for_claim', 'c3=waiting_for_claim',
                                          'c4=waiting_for_dispatch', 'c5=waiting_for_dispatch'], 'raised: nothing holds them any more');
SELECT tests.reset();
SELECT awp.configure(dispatch_limit => 10000);

-- ================================================================ workers full, fairness
SELECT tests.make_run('first', tests.tasks('a', 4), 10) AS first \gset
SELECT * FROM tests.register_worker('w4', '{mock}', 2) \gset w4_
SELECT is(tests.reasons(:'first'), ARRAY['a1=waiting_for_dispatch', 'a2=waiting_for_dispatch', 'a3=workers_full', 'a4=workers_full'],
          '2 free slots: the first two go, the others wait for the workers');
SELECT is(tests.detail(:'first', 'a3'), 'every active worker offering executor mock is busy: 0 of 2 slot(s) on 1 worker(s) leased, 0 dispatch(es) pending; the 2 slot(s) left go to tasks before this one',
          'workers_full detail before the pass');
SELECT is(awp.coordinator_tick()->'limited', '["workers_full"]', 'the pass fills the worker and reports workers_full');
CREATE TEMP TABLE fl AS SELECT * FROM awp.claim_tasks(:'w4_worker_id', :'w4_token', 2);
SELECT is((SELECT count(*) FROM fl), 2::bigint, 'setup: both leased');
SELECT tests.advance('1 s');
SELECT tests.make_run('second', tests.tasks('b', 3), 10) AS second \gset
SELECT is(tests.reasons(:'second'), ARRAY['b1=workers_full', 'b2=fairness', 'b3=fairness'],
          'a newer run never dispatched comes first in the fair order: its first task waits only for a slot, the next ones behind the other run');
SELECT is((SELECT array_agg(task_key || '=' || reason) FROM awp.run_waits(:'first')), ARRAY['a3=fairness', 'a4=fairness'],
          'the older run''s next tasks wait behind the new run''s first one (fairness)');
SELECT is(tests.detail(:'first', 'a3'), 'queued behind other runs: 1 task(s) of other runs come first in the fair order, and every active worker offering executor mock is busy (2 slot(s))',
          'fairness detail');
SELECT ok((SELECT count(*) = 0 FROM awp.run_waits(:'first') WHERE status = 'running'), 'running tasks do not wait (no row)');
-- The completion refills its freed slot for the first run in fair order: b1, the task that said workers_full.
SELECT ok(tests.complete(:'w4_worker_id', :'w4_token', dispatch_id, lease_token), 'setup: a1 completes') FROM fl WHERE task_key = 'a1';
SELECT is(tests.reasons(:'second'), ARRAY['b1=waiting_for_claim', 'b2=fairness', 'b3=fairness'],
          'the freed slot went to b1, as its reason said; its run just got a dispatch, so its next tasks wait behind the other run');
SELECT is(tests.reasons(:'first'), ARRAY['a3=workers_full', 'a4=fairness'],
          'the older run is now first in the fair order: a3 waits only for a slot, a4 behind b2');
SELECT tests.reset();

-- ================================================================ retry
SELECT tests.freeze('2030-01-01 01:00:00+00');
SELECT * FROM tests.register_worker('w5', '{mock}', 2) \gset w5_
SELECT tests.make_run('flaky', jsonb_build_array(tests.task('f', '{}', '{"retry": {"max_attempts": 3, "interval_ms": 60000}}'))) AS flaky \gset
SELECT * FROM tests.claim_one(:'w5_worker_id', :'w5_token') \gset l_
SELECT is(tests.reasons(:'flaky'), NULL, 'a running task does not wait');
SELECT ok(tests.complete(:'w5_worker_id', :'w5_token', :'l_dispatch_id', :'l_lease_token', 'temporary_failure'), 'setup: attempt 1 fails temporarily');
SELECT is(tests.reasons(:'flaky'), ARRAY['f=waiting_retry'], 'waiting_retry');
SELECT is(tests.detail(:'flaky', 'f'), 'attempt 1 of 3 failed; the retry is ready at 2030-01-01T01:01:00.000Z (in 1 min 0 s)',
          'the detail says until when');
SELECT tests.advance('61 s');
SELECT is(tests.detail(:'flaky', 'f'), 'attempt 1 of 3 failed; the retry was due at 2030-01-01T01:01:00.000Z: the next coordinator pass makes it ready; '
                                       'no coordinator pass since 2030-01-01T01:00:00.000Z: is a gateway with its coordinator (awp serve) running?',
          'a due retry waits for the next pass (and no pass for a minute is pointed out)');
SELECT is(awp.coordinator_tick()->>'promoted', '1', '... which promotes it');
SELECT tests.reset();

-- ================================================================ cancel requested
SELECT * FROM tests.register_worker('w6', '{mock}', 1) \gset w6_
SELECT tests.make_run('doomed', tests.tasks('d', 2)) AS doomed \gset
SELECT * FROM tests.claim_one(:'w6_worker_id', :'w6_token') \gset m_
SELECT is(tests.reasons(:'doomed'), ARRAY['d2=workers_full'], 'setup: d1 runs, d2 waits for the worker');
SELECT is((SELECT status FROM awp.request_cancel(:'doomed')), 'running', 'setup: cancel requested while d1 is leased');
SELECT is(tests.reasons(:'doomed'), ARRAY['d2=cancel_requested'], 'cancel_requested comes first');
SELECT is(awp.coordinator_tick()->>'canceled', '1', 'the coordinator converges it');
SELECT is(tests.reasons(:'doomed'), NULL, 'a finished run has no waiting task');
SELECT is((SELECT waiting FROM awp.get_run(:'doomed')), '{}'::jsonb, 'get_run: waiting {} once finished');

-- ================================================================ errors, the limits a pass reports
SELECT throws_ok($$SELECT * FROM awp.run_waits('run_nope')$$, 'AWNTF', NULL, 'run_waits: AWNTF for an unknown run');
SELECT is(awp.coordinator_tick()->'limited', '[]', 'nothing holds anything: limited is []');
SELECT ok(has_function_privilege('awp_gateway', 'awp.run_waits(text)', 'EXECUTE')
          AND has_function_privilege('awp_gateway', 'awp.cluster_status()', 'EXECUTE')
          AND has_function_privilege('awp_gateway', 'awp.executor_stats()', 'EXECUTE'),
          'the gateway may call run_waits, cluster_status and executor_stats');

SELECT * FROM finish();
ROLLBACK;
