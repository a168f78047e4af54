-- What a caller's session holds cannot change what the functions do (AWP issue 44; db/functions/zz_grants.sql,
-- db/migrations/0012_caller_environment.sql): a caller-set awp.log_state or awp.new_dispatches is never read
-- and never written to a run, and a coordinator pass goes on past one bad run. The attacks as a real gateway
-- login (pg_temp type shadowing, TEMPORARY refused, a forged state committed) are in
-- python/tests/sql/test_caller_environment.py.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(26);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT tests.make_run('a', jsonb_build_array(tests.task('a1'), tests.task('a2'))) AS run_a \gset
SELECT tests.make_run('b', jsonb_build_array(tests.task('b1'), tests.task('b2', '{b1}'))) AS run_b \gset
SELECT tests.end_tx();
SELECT revision AS b_rev, last_sequence AS b_seq, unfinished_tasks AS b_unf FROM awp.runs WHERE run_id = :'run_b' \gset

-- ================================================================ a forged awp.log_state before a call
-- The finding: this made request_cancel write run b's counters (revision 999, last_sequence 999, 50 more
-- unfinished tasks) without its lock, and every later pass failed on events_pkey.
SELECT set_config('awp.log_state', format(';%s,999,999,50', :'run_b'), true);
SELECT lives_ok(format($$SELECT awp.request_cancel(%L)$$, :'run_a'), 'request_cancel with a forged awp.log_state');
SELECT is((SELECT ARRAY[revision, last_sequence, unfinished_tasks] FROM awp.runs WHERE run_id = :'run_b'),
          ARRAY[:b_rev, :b_seq, :b_unf]::bigint[], 'run b''s counters are untouched');
SELECT is(current_setting('awp.log_state'), format(';%s,999,999,50', :'run_b'),
          'the caller gets its own value back (the function worked on an empty state)');
SELECT ok(tests.sequences_contiguous(:'run_a'), 'run a''s own events and counters agree');
SELECT ok((awp.coordinator_tick() ? 'isolated') IS FALSE, 'the next pass (same forged setting) runs whole');
SELECT is(tests.run_status(:'run_a'), 'canceled', 'run a converged to canceled');
SELECT ok(tests.sequences_contiguous(:'run_b'), 'run b''s events and counters still agree');
SELECT set_config('awp.log_state', '', true);
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

-- ================================================================ a forged awp.new_dispatches
SELECT tests.end_tx();
SELECT dispatch_id AS b1_dispatch FROM awp.dispatches WHERE run_id = :'run_b' AND task_key = 'b1' \gset
SELECT set_config('awp.new_dispatches', repeat('x', 100) || ' ' || :'b1_dispatch' || ' ', true);
SELECT lives_ok($$SELECT awp.create_dispatches()$$, 'create_dispatches with a forged awp.new_dispatches');
SELECT is(current_setting('awp.new_dispatches'), repeat('x', 100) || ' ' || :'b1_dispatch' || ' ',
          'the forged list was neither read nor consumed');
SELECT set_config('awp.new_dispatches', '', true);

-- ================================================================ one bad run does not stop a pass
-- Run c's counters are broken by hand (its last_sequence back to 0): every event appended for it collides
-- with events_pkey. A pass must still dispatch run d, skip c, and say so.
SELECT tests.end_tx();
UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE status = 'active';   -- no room: not dispatched
SELECT tests.make_run('c', jsonb_build_array(tests.task('c1'))) AS run_c \gset
SELECT tests.make_run('d', jsonb_build_array(tests.task('d1'))) AS run_d \gset
SELECT tests.end_tx();
SELECT * FROM tests.register_worker('w2', '{mock}', 10) \gset w2_
UPDATE awp.runs SET last_sequence = 0 WHERE run_id = :'run_c';
SELECT awp.coordinator_tick() AS pass \gset
SELECT is((:'pass'::jsonb)->'isolated', 'true'::jsonb, 'the pass failed whole, then ran run by run (isolated: true)');
SELECT is(tests.task_status(:'run_d', 'd1'), 'queued', 'run d got its dispatch');
SELECT is(tests.task_status(:'run_c', 'c1'), 'ready', 'run c was skipped, left as it was');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run_c' AND status = 'pending'), 0::bigint,
          'nothing half-done for run c');
UPDATE awp.runs SET last_sequence = (SELECT max(sequence) FROM awp.events WHERE run_id = :'run_c') WHERE run_id = :'run_c';
SELECT tests.end_tx();
SELECT ok(NOT (awp.coordinator_tick() ? 'isolated'), 'once repaired, a pass runs whole again');
SELECT is(tests.task_status(:'run_c', 'c1'), 'queued', 'and run c gets its dispatch');

-- ================================================================ a backlog of a kind nobody serves
-- 300 runs wait for the executor kind `python`, which no worker offers. A start of another run, and a pass,
-- must not walk them (the finding: 6,500 such runs made each start take 0.25-0.66 s and 301 starts got 503).
SET LOCAL track_functions = 'pl';
CREATE FUNCTION pg_temp.dispatch_calls() RETURNS bigint LANGUAGE sql AS $$
  SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
   WHERE schemaname = 'awp' AND funcname = '_dispatch_one'
$$;
SELECT tests.make_workflow('py', jsonb_build_array(jsonb_build_object('key', 'p1', 'executor', 'python')));
SELECT count(awp.start_run('py')) FROM generate_series(1, 300);
SELECT tests.end_tx();
SELECT is((awp.executor_stats()->'python'->>'ready')::integer, 300, 'the backlog is visible: 300 ready python tasks');
SELECT pg_temp.dispatch_calls() AS calls0 \gset
SELECT tests.make_run('m', jsonb_build_array(tests.task('m1'), tests.task('m2'))) AS run_m \gset
SELECT is(tests.task_statuses(:'run_m'), '{m1=queued,m2=queued}'::text[], 'a new mock run is dispatched on start');
SELECT cmp_ok(pg_temp.dispatch_calls() - :calls0, '<=', 3::bigint, 'its start looked at its own run only (no walk of the backlog)');
SELECT tests.end_tx();
SELECT pg_temp.dispatch_calls() AS calls1 \gset
SELECT awp.coordinator_tick();
SELECT cmp_ok(pg_temp.dispatch_calls() - :calls1, '<=', 2::bigint, 'a pass does not visit runs of a kind without a free slot');
SELECT throws_ok($$SELECT awp.cancel_waiting_runs('python', 0)$$, 'AWREQ', NULL, 'cancel_waiting_runs: limit 1-1000');
SELECT is(awp.cancel_waiting_runs('python', 200), 200, 'the backlog is prunable: 200 oldest runs canceled');
SELECT is(awp.cancel_waiting_runs('python'), 100, 'and the rest');
SELECT is((SELECT count(*) FROM awp.runs WHERE workflow_id = 'py' AND status <> 'canceled'), 0::bigint,
          'every python run is canceled (nothing was leased: converged at once)');
SELECT is(tests.task_statuses(:'run_m'), '{m1=queued,m2=queued}'::text[], 'the mock run is untouched');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

SELECT * FROM finish();
ROLLBACK;
