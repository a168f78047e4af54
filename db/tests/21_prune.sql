-- Retention: awp.prune(older_than) and awp.apply_retention(): what is deleted (terminal runs with all their
-- rows, ended unreferenced workers, old idempotency records) and what never is (pending and running runs,
-- active and draining workers, workers still referenced, anything newer than the cutoff); AWREQ; counts;
-- bounded batches (run and task budgets); AWNTF for pruned ids; invariants and status counts afterwards.
-- (Concurrency, SKIP LOCKED and the coordinator's background retention: python/tests/integration/test_retention.py.)
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(62);
SELECT tests.no_history_ranges();   -- row by row at the frozen time (_fixtures.sql.inc)

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT tests.make_workflow('wf');
SELECT tests.make_workflow('wf2', jsonb_build_array(tests.task('a'), tests.task('b', '{a}')));
SELECT tests.make_workflow('wf3', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c')));
SELECT tests.make_workflow('wfpy', jsonb_build_array(tests.task('a', '{}', '{"executor": "python"}')));

-- tests.rows_of(run): rows of a run in every table, e.g. {1,1,1,1,6} (runs, tasks, dispatches, attempts, events).
CREATE FUNCTION tests.rows_of(p_run_id text) RETURNS bigint[]
LANGUAGE sql AS $$
  SELECT ARRAY[(SELECT count(*) FROM awp.runs WHERE run_id = p_run_id),
               (SELECT count(*) FROM awp.tasks WHERE run_id = p_run_id),
               (SELECT count(*) FROM awp.dispatches WHERE run_id = p_run_id),
               (SELECT count(*) FROM awp.attempts WHERE run_id = p_run_id),
               (SELECT count(*) FROM awp.events WHERE run_id = p_run_id)]
$$;
CREATE FUNCTION tests.worker_exists(p_worker_id text) RETURNS boolean
LANGUAGE sql AS $$ SELECT EXISTS (SELECT 1 FROM awp.workers WHERE worker_id = p_worker_id) $$;

-- ================================================================ the old world (t0, t0 + 60 s)
-- w_old: a session that ended at once; w1 runs the old runs and stops.
SELECT * FROM tests.register_worker('w_old') \gset wo_
SELECT status FROM awp.drain_worker(:'wo_worker_id', :'wo_token');
SELECT * FROM tests.register_worker('w1') \gset w1_
SELECT * FROM awp.apply_workflow_idempotent('kw-old', 'hw', tests.def(jsonb_build_array(tests.task('a')), '{"id": "wfk"}'));
SELECT run_id AS r_ok FROM awp.start_run_idempotent('k-old', 'h1', 'wf', NULL, NULL) \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'l_dispatch_id', :'l_lease_token');
SELECT tests.make_run('wf') AS r_failed \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'l_dispatch_id', :'l_lease_token', 'permanent_failure');
SELECT tests.make_run('wf') AS r_canceled \gset
SELECT status FROM awp.request_cancel(:'r_canceled');

-- r_long (a -> b) stays running: w3 did `a` and stopped (so w3 is still referenced), w_dr holds `b` and drains.
SELECT * FROM tests.register_worker('w3') \gset w3_
SELECT * FROM tests.register_worker('w_dr') \gset wd_
SELECT tests.make_run('wf2') AS r_long \gset
SELECT * FROM tests.claim_one(:'w3_worker_id', :'w3_token') \gset l_
SELECT tests.complete(:'w3_worker_id', :'w3_token', :'l_dispatch_id', :'l_lease_token');
SELECT status FROM awp.drain_worker(:'w3_worker_id', :'w3_token');
SELECT * FROM tests.claim_one(:'wd_worker_id', :'wd_token') \gset l_
SELECT status FROM awp.drain_worker(:'wd_worker_id', :'wd_token');
-- r_off: its lease is held by a worker that went offline (not reaped yet).
SELECT * FROM tests.register_worker('w_off') \gset wf_
SELECT tests.make_run('wf') AS r_off \gset
SELECT * FROM tests.claim_one(:'wf_worker_id', :'wf_token') \gset l_
UPDATE awp.workers SET status = 'offline', offline_at = awp._now() WHERE worker_id = :'wf_worker_id';
SELECT * FROM tests.register_worker('w_active') \gset wa_
-- r_pending waits for a python worker forever; a schedule's run is canceled.
SELECT tests.make_run('wfpy') AS r_pending \gset
SELECT schedule_id FROM awp.create_schedule('s1', 'wf', interval_ms => 60000);
SELECT tests.advance('60 s');
SELECT awp.fire_schedules();
SELECT last_run_id AS r_sched FROM awp.schedules WHERE schedule_id = 's1' \gset
SELECT status FROM awp.request_cancel(:'r_sched');
SELECT status FROM awp.drain_worker(:'w1_worker_id', :'w1_token');

-- ================================================================ t0 + 5 days: a recent run, by w2
SELECT tests.advance('5 days');
SELECT * FROM tests.register_worker('w2') \gset w2_
SELECT run_id AS r_recent FROM awp.start_run_idempotent('k-recent', 'h2', 'wf', NULL, NULL) \gset
SELECT awp.create_dispatches();   -- not a whole tick: that would mark the silent workers offline
SELECT dispatch_id AS l_dispatch_id, lease_token AS l_lease_token FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 1) \gset
SELECT tests.complete(:'w2_worker_id', :'w2_token', :'l_dispatch_id', :'l_lease_token');
SELECT status FROM awp.drain_worker(:'w2_worker_id', :'w2_token');

SELECT is(ARRAY[tests.run_status(:'r_ok'), tests.run_status(:'r_failed'), tests.run_status(:'r_canceled'),
                tests.run_status(:'r_sched'), tests.run_status(:'r_long'), tests.run_status(:'r_off'),
                tests.run_status(:'r_pending'), tests.run_status(:'r_recent')],
          ARRAY['succeeded', 'failed', 'canceled', 'canceled', 'running', 'running', 'pending', 'succeeded'],
          'the scene: four old finished runs, three live ones, a recent one');
SELECT is(ARRAY(SELECT w.status FROM unnest(ARRAY[:'wo_worker_id', :'w1_worker_id', :'w3_worker_id', :'wd_worker_id',
                                                   :'wf_worker_id', :'wa_worker_id', :'w2_worker_id']) WITH ORDINALITY x(id, i)
                   JOIN awp.workers w ON w.worker_id = x.id ORDER BY x.i),
          ARRAY['stopped', 'stopped', 'stopped', 'draining', 'offline', 'active', 'stopped'],
          'the workers: three stopped long ago, draining, offline with a lease, active, stopped recently');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'no violation before pruning');

SELECT tests.rows_of(:'r_long') AS long_rows, tests.rows_of(:'r_off') AS off_rows,
       tests.rows_of(:'r_pending') AS pending_rows, tests.rows_of(:'r_recent') AS recent_rows,
       tests.rev(:'r_long') AS long_rev \gset
SELECT (SELECT sum(x) FROM unnest(tests.rows_of(:'r_ok') || tests.rows_of(:'r_failed') || tests.rows_of(:'r_canceled')
                                  || tests.rows_of(:'r_sched')) x) AS old_rows \gset
SELECT is(tests.rows_of(:'r_ok'), ARRAY[1, 1, 1, 1, (SELECT count(*) FROM awp.events WHERE run_id = :'r_ok')]::bigint[],
          'an old run has rows in every table before');

-- ================================================================ validation
SELECT throws_ok($$SELECT awp.prune(NULL)$$, 'AWREQ', NULL, 'prune(NULL) is AWREQ');
SELECT throws_ok($$SELECT awp.prune('-1 second')$$, 'AWREQ', NULL, 'a negative older_than is AWREQ');
SELECT throws_ok($$SELECT awp.prune('1 day -25 hours')$$, 'AWREQ', NULL, 'an interval that sums to less than 0 is AWREQ');
SELECT is((SELECT count(*) FROM awp.runs), 8::bigint, 'a refused prune deleted nothing');

-- ================================================================ prune at t0 + 10 days, keeping 7 days
SELECT tests.advance('5 days') AS t10 \gset
SELECT awp.prune(older_than => '7 days') AS p \gset
SELECT is((:'p'::jsonb - 'cutoff' - 'batches'),
          jsonb_build_object('runs', 4, 'tasks', 4, 'dispatches', 4, 'attempts', 2,
                             'events', :old_rows - 4 - 4 - 4 - 2, 'workers', 2, 'idempotency_keys', 2, 'more', false),
          'counts: 4 runs (with 4 tasks, 4 dispatches, 2 attempts, their events), 2 workers, 2 idempotency records');
SELECT is((:'p'::jsonb->>'cutoff')::timestamptz, :'t10'::timestamptz - interval '7 days', 'the cutoff is now - older_than');
SELECT ok(:'p'::jsonb ? 'runs' AND :'p'::jsonb ? 'workers' AND :'p'::jsonb ? 'idempotency_keys', 'the three counts the issue names');

SELECT is(tests.rows_of(x), '{0,0,0,0,0}'::bigint[], 'pruned run ' || n || ': no row left in runs, tasks, dispatches, attempts, events')
  FROM (VALUES ('r_ok', :'r_ok'), ('r_failed', :'r_failed'), ('r_canceled', :'r_canceled'), ('r_sched', :'r_sched')) v(n, x);
SELECT is(tests.rows_of(:'r_long'), :'long_rows'::bigint[], 'a running run is untouched');
SELECT is(tests.rev(:'r_long'), :'long_rev'::bigint, '... its revision too');
SELECT is(tests.rows_of(:'r_off'), :'off_rows'::bigint[], 'a running run whose lease holder is offline is untouched');
SELECT is(tests.rows_of(:'r_pending'), :'pending_rows'::bigint[], 'a pending run created 10 days ago is untouched');
SELECT is(tests.rows_of(:'r_recent'), :'recent_rows'::bigint[], 'a run finished 5 days ago is kept');

SELECT ok(NOT tests.worker_exists(:'wo_worker_id'), 'a session stopped 10 days ago that did nothing is deleted');
SELECT ok(NOT tests.worker_exists(:'w1_worker_id'), 'a stopped worker whose runs were all pruned in this call is deleted');
SELECT ok(tests.worker_exists(:'w3_worker_id'), 'a stopped worker with an attempt in a retained run is kept');
SELECT ok(tests.worker_exists(:'wd_worker_id'), 'a draining worker is kept');
SELECT ok(tests.worker_exists(:'wf_worker_id'), 'an offline worker that holds a lease is kept');
SELECT ok(tests.worker_exists(:'wa_worker_id'), 'an active worker (silent for 10 days) is kept');
SELECT ok(tests.worker_exists(:'w2_worker_id'), 'a worker stopped 5 days ago is kept');

SELECT is(ARRAY(SELECT scope || ':' || idempotency_key FROM awp.idempotency_keys ORDER BY 1), ARRAY['runs:k-recent'],
          'idempotency records older than the cutoff are gone (runs and workflows scopes), the recent one stays');
SELECT is((SELECT last_run_id FROM awp.schedules WHERE schedule_id = 's1'), :'r_sched',
          'a schedule keeps naming its last run, which was pruned');

SELECT throws_ok(format($$SELECT * FROM awp.get_run(%L)$$, :'r_ok'), 'AWNTF', NULL, 'get_run of a pruned run is AWNTF');
SELECT throws_ok(format($$SELECT * FROM awp.run_tasks(%L)$$, :'r_ok'), 'AWNTF', NULL, 'run_tasks of a pruned run is AWNTF');
SELECT throws_ok(format($$SELECT * FROM awp.run_events(%L)$$, :'r_ok'), 'AWNTF', NULL, 'run_events of a pruned run is AWNTF');
SELECT throws_ok(format($$SELECT * FROM awp.task_attempts(%L, 'a')$$, :'r_ok'), 'AWNTF', NULL, 'task_attempts of a pruned run is AWNTF');
SELECT throws_ok(format($$SELECT * FROM awp.get_worker(%L)$$, :'w1_worker_id'), 'AWNTF', NULL, 'get_worker of a pruned worker is AWNTF');

SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'no violation after pruning');
SELECT is(awp.metrics_snapshot()->'runs', (SELECT jsonb_object_agg(status, n) FROM (SELECT status, count(*) n FROM awp.runs GROUP BY 1) x),
          'metrics: runs by status still equal the table');
SELECT is(awp.metrics_snapshot()->'workers', (SELECT jsonb_object_agg(status, n) FROM (SELECT status, count(*) n FROM awp.workers GROUP BY 1) x),
          'metrics: workers by status still equal the table');
SELECT is((SELECT count(*) FROM awp.status_counts), (SELECT count(DISTINCT (entity, status)) FROM awp.status_counts),
          'the status count deltas were folded to one row per status');

SELECT is(awp.prune('7 days') - 'cutoff' - 'batches',
          '{"runs": 0, "tasks": 0, "dispatches": 0, "attempts": 0, "events": 0, "workers": 0, "idempotency_keys": 0, "more": false}'::jsonb,
          'a second prune finds nothing');

-- The recent run's idempotency key still deduplicates while the run exists, also once its record is gone.
DELETE FROM awp.idempotency_keys WHERE idempotency_key = 'k-recent';
SELECT is((SELECT run_id FROM awp.start_run_idempotent('k-recent', 'h2', 'wf', NULL, NULL)), :'r_recent',
          'a replay whose record was pruned returns the same run while the run exists');

-- ================================================================ apply_retention (the coordinator's batch)
SELECT is((awp.configure(retention_ms => 0))->>'retention_ms', '0', 'retention off');
SELECT is(awp.apply_retention()->>'runs', '0', 'retention_ms 0: apply_retention deletes nothing');
SELECT is(tests.rows_of(:'r_recent'), :'recent_rows'::bigint[], '... the recent run is still there');
SELECT awp.configure(retention_ms => 86400000);
SELECT awp.apply_retention() AS a \gset
SELECT is(ARRAY[(:'a'::jsonb->>'runs')::int, (:'a'::jsonb->>'workers')::int, (:'a'::jsonb->>'retention_ms')::bigint::int],
          ARRAY[1, 1, 86400000], 'retention 1 day: the run of 5 days ago and its (stopped) worker go');
SELECT is((:'a'::jsonb->>'cutoff')::timestamptz, awp._now() - interval '1 day', 'apply_retention cuts at now - retention_ms');
SELECT ok(NOT tests.worker_exists(:'w2_worker_id'), 'the worker went with its last run');
SELECT is(ARRAY[tests.run_status(:'r_long'), tests.run_status(:'r_off'), tests.run_status(:'r_pending')],
          ARRAY['running', 'running', 'pending'], 'live runs still untouched');

-- ================================================================ bounded batches
SELECT tests.make_run('wf3') AS b1 \gset
SELECT tests.make_run('wf3') AS b2 \gset
SELECT tests.make_run('wf3') AS b3 \gset
SELECT tests.make_run('wf3') AS b4 \gset
SELECT tests.make_run('wf3') AS b5 \gset
SELECT status, tests.advance('1 s') FROM awp.request_cancel(:'b1');
SELECT status, tests.advance('1 s') FROM awp.request_cancel(:'b2');
SELECT status, tests.advance('1 s') FROM awp.request_cancel(:'b3');
SELECT status, tests.advance('1 s') FROM awp.request_cancel(:'b4');
SELECT status, tests.advance('1 s') FROM awp.request_cancel(:'b5');
SELECT tests.advance('1 hour');
SELECT awp._prune_batch(awp._now(), 2, 1000, 100, 100) AS b \gset
SELECT is(ARRAY[:'b'::jsonb->>'runs', :'b'::jsonb->>'tasks', :'b'::jsonb->>'more'], ARRAY['2', '6', 'true'],
          'a batch stops at its run limit and says there is more');
SELECT is((SELECT count(*) FROM awp.runs WHERE run_id IN (:'b1', :'b2')), 0::bigint, 'oldest first (by finish time, then id)');
SELECT awp._prune_batch(awp._now(), 100, 4, 100, 100) AS b \gset
SELECT is(ARRAY[:'b'::jsonb->>'runs', :'b'::jsonb->>'tasks', :'b'::jsonb->>'more'], ARRAY['2', '6', 'true'],
          'a batch stops at its task budget (3 + 3 tasks: the second run starts below 4) and says there is more');
SELECT awp._prune_batch(awp._now(), 100, 4, 100, 100) AS b \gset
SELECT is(ARRAY[:'b'::jsonb->>'runs', :'b'::jsonb->>'more'], ARRAY['1', 'false'], 'the last one; nothing more');
SELECT awp._prune_batch(awp._now(), 100, 1, 100, 100) AS b \gset
SELECT is(:'b'::jsonb->>'runs', '0', 'nothing left to prune');
SELECT tests.make_run('wf3') AS big \gset
SELECT status FROM awp.request_cancel(:'big');
SELECT tests.advance('1 hour');
SELECT is(awp._prune_batch(awp._now(), 100, 1, 100, 100)->>'runs', '1', 'a run larger than the task budget still goes (alone)');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'no violation after the batches');

-- ================================================================ prune(0) and the function's shape
SELECT ok((awp.prune('0') ? 'runs'), 'older_than 0 is allowed');
SELECT is(ARRAY[tests.run_status(:'r_long'), tests.run_status(:'r_off'), tests.run_status(:'r_pending')],
          ARRAY['running', 'running', 'pending'], 'older_than 0 still leaves live runs alone');
SELECT ok(tests.worker_exists(:'wa_worker_id') AND tests.worker_exists(:'wd_worker_id') AND tests.worker_exists(:'wf_worker_id'),
          'older_than 0 still leaves active, draining and lease-holding workers alone');
SELECT is((SELECT prosecdef FROM pg_proc WHERE oid = 'awp.prune(interval)'::regprocedure), true, 'prune is SECURITY DEFINER');
SELECT ok(has_function_privilege('awp_gateway', 'awp.prune(interval)', 'EXECUTE')
          AND has_function_privilege('awp_gateway', 'awp.apply_retention(bigint)', 'EXECUTE'), 'awp_gateway may prune');
SELECT ok(NOT has_function_privilege('awp_gateway', 'awp._prune_batch(timestamptz, integer, integer, integer, integer, boolean)', 'EXECUTE'),
          '... but not call the private batch');
SELECT isnt(obj_description('awp.prune(interval)'::regprocedure, 'pg_proc'), NULL, 'prune has a COMMENT');
SELECT is((SELECT array_agg(a ORDER BY a) FROM pg_proc p, unnest(p.proargnames) a WHERE p.oid = 'awp.prune(interval)'::regprocedure),
          ARRAY['older_than'], 'the argument is named older_than');

SELECT * FROM finish();
ROLLBACK;
