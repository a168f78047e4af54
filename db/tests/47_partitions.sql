-- Partitioned history (db/functions/_partitions.sql, migration 0023): time ids, the ranges awp.maintain_partitions
-- makes, a run's rows in its range, retention dropping a range whole once every run in it may be pruned (and only
-- then), the _default partition, the new invariants. (The migration of a database with rows, the background
-- retention and the soak: python/tests/integration/test_partitions.py, make soak.)
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(53);
SELECT tests.no_history_ranges();   -- only the ranges this file makes

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT throws_ok($$SELECT awp.configure(history_partition_ms => 999)$$, 'AWREQ', 'invalid history_partition_ms',
                 'history_partition_ms below 1 s is AWREQ');
SELECT throws_ok($$SELECT awp.configure(history_partition_ms => 2592000001)$$, 'AWREQ', 'invalid history_partition_ms',
                 'history_partition_ms above 30 days is AWREQ');
SELECT is(awp.configure(history_partition_ms => 3600000)->'history_partition_ms', '3600000'::jsonb,
          'history_partition_ms: an hour');

-- ================================================================ ranges
SELECT is(awp._partition_ms(), 3600000::bigint, 'the range: history_partition_ms');
SELECT is(awp.maintain_partitions(), 2, 'maintain_partitions makes the current range and the next');
SELECT is(ARRAY(SELECT suffix FROM awp.history_partitions ORDER BY lower_ms),
          '{20300101_000000000,20300101_010000000}', 'named by their start (UTC), an hour each');
SELECT is(awp.maintain_partitions(), 0, 'called again at once: nothing to make');
SELECT is((SELECT count(*)::integer FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE c.relname LIKE '%\_p20300101\_000000000'), 8, 'a range has one partition in each of the eight tables');
SELECT is(pg_get_expr(c.relpartbound, c.oid), $$FOR VALUES FROM ('run_t01b8dac5b400') TO ('run_t01b8dafca280')$$,
          'its bounds: the run ids of its first and its end millisecond')
  FROM pg_class c WHERE c.relname = 'runs_p20300101_000000000';
SELECT is((SELECT count(*)::integer FROM awp.check_invariants()), 0, 'invariants hold');

-- ================================================================ ids and where rows go
SELECT tests.make_workflow('wf', jsonb_build_array(tests.task('a'), tests.task('b', '{a}')));
SELECT * FROM tests.register_worker('w1') \gset w1_
SELECT tests.make_run('wf') AS r_a \gset
SELECT ok(:'r_a' ~ '^run_t01b8dac5b400[0-9a-f]{19}$', 'a run id: run_t + its time in ms (12 hex digits) + 19 random ones');
SELECT is((SELECT tableoid::regclass::text FROM awp.runs WHERE run_id = :'r_a'), 'awp.runs_p20300101_000000000',
          'the run is in its time range');
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT is(left(:'l_dispatch_id', 17), 'dsp_' || substr(:'r_a', 5, 13), 'a dispatch id begins with its run''s time');
SELECT is((SELECT tableoid::regclass::text FROM awp.dispatches WHERE dispatch_id = :'l_dispatch_id'),
          'awp.dispatches_p20300101_000000000', 'the dispatch is in its run''s range');
SELECT is(ARRAY(SELECT DISTINCT tableoid::regclass::text FROM awp.events WHERE run_id = :'r_a'),
          '{awp.events_p20300101_000000000}', 'the run''s events are in its range');
SELECT throws_ok(format($$INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
                          VALUES ('dsp_t01b8dafca280aaaaaaaaaaaaaaaaaaa', %L, 'b', 'mock', now())$$, :'r_a'),
                 '23514', NULL, 'a dispatch id outside its run''s range is rejected (CHECK dispatch_in_run_range)');
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'l_dispatch_id', :'l_lease_token');
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'l_dispatch_id', :'l_lease_token');
SELECT is(tests.run_status(:'r_a'), 'succeeded', 'run a (range 00:00) succeeded');
SELECT tests.end_tx();

-- Run b, an hour later (range 01:00), stays pending: its task is of an executor no worker here runs.
SELECT tests.advance('1 hour');
SELECT tests.make_workflow('wfb', jsonb_build_array(tests.task('a', '{}', '{"executor": "python"}')));
SELECT tests.make_run('wfb') AS r_b \gset
SELECT is((SELECT tableoid::regclass::text FROM awp.runs WHERE run_id = :'r_b'), 'awp.runs_p20300101_010000000',
          'run b is in the next range');

-- A run at a time no range covers goes to the _default partition.
SELECT tests.advance('5 hours');
SELECT tests.make_run('wf') AS r_d \gset
SELECT is((SELECT tableoid::regclass::text FROM awp.runs WHERE run_id = :'r_d'), 'awp.runs_default',
          'a run of 06:00 (no range yet) is in runs_default');
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset ld_
SELECT is((SELECT tableoid::regclass::text FROM awp.dispatches WHERE dispatch_id = :'ld_dispatch_id'),
          'awp.dispatches_default', 'its dispatch too');
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'ld_dispatch_id', :'ld_lease_token');
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset ld_
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'ld_dispatch_id', :'ld_lease_token');
SELECT tests.end_tx();
-- maintain_partitions does not make a range whose rows went to _default: 06:00 stays there; 07:00 is made.
SELECT is(awp.maintain_partitions(), 1, 'the current range holds rows in _default: not made; the next is');
SELECT is(ARRAY(SELECT suffix FROM awp.history_partitions ORDER BY lower_ms),
          '{20300101_000000000,20300101_010000000,20300101_070000000}',
          'ranges 00:00, 01:00, then 07:00 (02:00 to 05:00: none; 06:00''s rows in _default)');
SELECT is((SELECT count(*)::integer FROM awp.check_invariants()), 0, 'invariants hold');

-- ================================================================ retention drops whole ranges
SELECT is(awp._counts_by_status('run'), '{"pending": 1, "succeeded": 2}'::jsonb, 'runs by status (/metrics): a, d; b');
SELECT awp.prune('1 minute') AS p \gset
SELECT is(:'p'::jsonb - 'cutoff', '{"runs": 1, "tasks": 2, "dispatches": 2, "attempts": 2, "events": 22, "workers": 0,
                                    "idempotency_keys": 0, "batches": 1, "more": true}'::jsonb,
          'the first call drops range 00:00 (run a, all of it prunable): its counts, more to come');
SELECT is(tests.event_count(:'r_a'), 0::bigint, 'run a is gone with its events');
SELECT is(awp._counts_by_status('run'), '{"pending": 1, "succeeded": 1}'::jsonb,
          'and with its count by status (a DROP fires no trigger: the range''s counts go with it)');
SELECT throws_ok(format($$SELECT * FROM awp.get_run(%L)$$, :'r_a'), 'AWNTF', NULL, 'get_run of a dropped run is AWNTF');
SELECT is(to_regclass('awp.runs_p20300101_000000000'), NULL, 'its partitions are dropped');
SELECT is(to_regclass('awp.events_p20300101_000000000'), NULL, '(events too)');
SELECT awp.prune('1 minute') AS p \gset
SELECT is(:'p'::jsonb - 'cutoff', '{"runs": 0, "tasks": 0, "dispatches": 0, "attempts": 0, "events": 0, "workers": 0,
                                    "idempotency_keys": 0, "batches": 1, "more": false}'::jsonb,
          'then nothing: 01:00 holds pending run b, 07:00 is not over, run d (succeeded 06:00 in _default) too recent');
SELECT is(ARRAY(SELECT suffix FROM awp.history_partitions ORDER BY lower_ms),
          '{20300101_010000000,20300101_070000000}', 'range 01:00 kept');
SELECT is(tests.run_status(:'r_b'), 'pending', 'run b untouched');

-- Run b's range goes once b finished long enough ago; run d, in _default, row by row.
SELECT awp.request_cancel(:'r_b');   -- (no coordinator pass after a drop in this one transaction: a SQL function's
                                     -- plans live for the transaction in PL/pgSQL's simple expressions)
SELECT tests.end_tx();
SELECT is(tests.run_status(:'r_b'), 'canceled', 'run b canceled (at 06:00)');
SELECT tests.advance('30 minutes');
SELECT is((awp.prune('40 minutes')->>'runs')::integer, 0, 'a cutoff before its end keeps run b''s range');
SELECT is(ARRAY(SELECT suffix FROM awp.history_partitions ORDER BY lower_ms),
          '{20300101_010000000,20300101_070000000}', '(still there)');
SELECT tests.advance('1 hour');
ANALYZE awp.runs_p20300101_010000000, awp.tasks_p20300101_010000000, awp.dispatches_p20300101_010000000,
        awp.events_p20300101_010000000;
SELECT awp.prune('1 hour') AS p \gset
SELECT is(:'p'::jsonb - 'cutoff', '{"runs": 1, "tasks": 1, "dispatches": 0, "attempts": 0, "events": 5, "workers": 0,
                                    "idempotency_keys": 0, "batches": 1, "more": true}'::jsonb,
          'range 01:00 dropped, counted by its statistics (ANALYZEd: exact here)');
SELECT is((awp.prune('1 hour')->>'runs')::integer, 1, 'run d, in _default, pruned row by row');
SELECT is((SELECT count(*)::integer FROM awp.runs), 0, 'no run left');
SELECT is((SELECT count(*)::integer FROM awp.check_invariants()), 0, 'invariants hold');

-- ================================================================ the invariants
SAVEPOINT broken;
SELECT tests.make_run('wf') AS r_e \gset
DELETE FROM awp.runs WHERE run_id = :'r_e';
SELECT ARRAY(SELECT DISTINCT invariant || ' ' || detail FROM awp.check_invariants() ORDER BY 1)::text AS orphans \gset
SELECT ARRAY(SELECT DISTINCT invariant || ' ' || detail FROM awp.check_invariants(ARRAY['run_x', :'r_e']) ORDER BY 1)::text
       AS orphans_of \gset
SELECT count(*) AS orphans_elsewhere FROM awp.check_invariants(ARRAY['run_x']) WHERE invariant = 'orphan_row' \gset
DROP TABLE awp.signals_p20300101_070000000;
SELECT ARRAY(SELECT entity_key || ': ' || detail FROM awp.check_invariants() WHERE invariant = 'history_partitions')::text AS missing \gset
ROLLBACK TO SAVEPOINT broken;
SELECT is(:'orphans'::text, '{"orphan_row a task of no run","orphan_row events of no run"}',
          'orphan_row: the tasks and events of a run that is gone');
SELECT is(:'orphans_of'::text, :'orphans'::text, 'orphan_row: the same when the gone run is in the list of runs checked');
SELECT is(:'orphans_elsewhere'::integer, 0, 'orphan_row: none when it is not');
SELECT is(:'missing'::text, '{"20300101_070000000: range 20300101_070000000 has no partition of awp.signals"}',
          'history_partitions: a range without one of its partitions');

-- ================================================================ the group path reads and writes tasks by TID
-- A ctid names a row only within its partition: two runs in two ranges whose tasks sit at the same ctids; the group
-- path completes run x's two tasks (awp.complete_and_claim_many) and must not touch run y's.
SELECT tests.freeze('2030-02-01 00:00:00+00');
SELECT awp.maintain_partitions();
SELECT tests.make_workflow('gp', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'), tests.task('d')), 2);
SET LOCAL track_functions = 'all';   -- to see that the group path ran
SELECT tests.make_run('gp') AS r_x \gset
SELECT tests.advance('1 hour');
SELECT tests.make_run('gp') AS r_y \gset
CREATE TEMP TABLE gw AS SELECT n, r.* FROM generate_series(1, 4) n, LATERAL tests.register_worker('g' || n, '{mock}', 1) r;
-- (claim_tasks, not tests.claim_one: no coordinator pass after a drop in this one transaction, see above; the runs'
-- dispatches were made as they started)
CREATE TEMP TABLE gl AS SELECT g.n, g.worker_id, g.token, c.dispatch_id, c.lease_token, c.run_id, c.task_key
  FROM gw g, LATERAL awp.claim_tasks(g.worker_id, g.token, 1) c;
SELECT is((SELECT array_agg(run_id || ':' || task_key ORDER BY run_id <> :'r_x', task_key) FROM gl),
          ARRAY[:'r_x' || ':a', :'r_x' || ':b', :'r_y' || ':a', :'r_y' || ':b'], 'four workers hold x''s and y''s tasks');
SELECT is((SELECT count(DISTINCT t.ctid)::integer FROM awp.tasks t WHERE t.run_id IN (:'r_x', :'r_y') AND t.task_key IN ('a', 'b')), 2,
          'x''s and y''s tasks sit at the same two ctids, in two partitions');
SELECT tests.end_tx();
SELECT is((SELECT count(*)::integer FROM awp.complete_and_claim_many(
             (SELECT jsonb_agg(jsonb_build_object('worker_id', worker_id, 'session_token', token, 'dispatch_id', dispatch_id,
                                                  'lease_token', lease_token, 'result', '{"kind": "success"}'::jsonb,
                                                  'slots', 1, 'claim_seq', NULL) ORDER BY n)
                FROM gl WHERE run_id = :'r_x')) m WHERE m.error IS NULL), 2, 'x''s two completions, as a group');
SELECT is((SELECT calls::integer FROM pg_stat_xact_user_functions WHERE funcname = '_complete_and_refill_group'), 1,
          'settled by the group path (each worker refilled)');
SELECT is(ARRAY[tests.task_status(:'r_x', 'a'), tests.task_status(:'r_x', 'b'), tests.task_status(:'r_y', 'a'),
                tests.task_status(:'r_y', 'b')],
          '{succeeded,succeeded,running,running}', 'x''s a and b succeeded; y''s a and b untouched');
SELECT is((SELECT count(*)::integer FROM awp.check_invariants()), 0, 'invariants hold');

-- ================================================================ the background waits for the range
-- Run p1 finished at 00:00 and p2 at 00:50, both in range 00:00; at 01:10 with a 30-minute retention p1 is past
-- the cutoff but its range is not (p2): the background leaves p1 for the range's drop; awp.prune deletes it now.
SELECT tests.freeze('2030-03-01 00:00:00+00');
SELECT awp.maintain_partitions();
SELECT tests.make_run('wfb') AS r_p1 \gset
SELECT awp.request_cancel(:'r_p1');
SELECT tests.advance('50 minutes');
SELECT tests.make_run('wfb') AS r_p2 \gset
SELECT awp.request_cancel(:'r_p2');
SELECT tests.advance('20 minutes');
SELECT awp.configure(retention_ms => 1800000);
SELECT is((SELECT sum((awp.apply_retention()->>'runs')::integer)::integer FROM generate_series(1, 4)), 0,
          'the background (four batches: empty ranges dropped first) leaves p1 to its range (p2 keeps it)');
SELECT is(tests.run_status(:'r_p1'), 'canceled', '(p1 still there)');
SELECT is((awp.prune('30 minutes')->>'runs')::integer, 1, 'awp.prune deletes what is older than its cutoff: p1');

SELECT * FROM finish();
ROLLBACK;
