-- Many live runs at once (AWP issue 46): what a coordinator pass and a run's start cost does not grow with the
-- number of live runs that cannot be dispatched. Counted with track_functions (calls), never timed.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(9);

SET LOCAL track_functions = 'all';
CREATE FUNCTION pg_temp.calls(p_name text) RETURNS bigint LANGUAGE sql AS $$
  SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions WHERE schemaname = 'awp' AND funcname = p_name
$$;

-- 400 live runs, each with ready tasks; one worker of one slot, busy: nothing can be dispatched.
SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT tests.make_workflow('many', jsonb_build_array(tests.task('a'), tests.task('b')), 4);
SELECT count(awp.start_run('many')) FROM generate_series(1, 400);
SELECT tests.end_tx();
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1)), 1::bigint, 'setup: the one slot is busy');
SELECT tests.end_tx();

SELECT pg_temp.calls('_dispatch_one') AS d0, pg_temp.calls('_limits_held') AS l0 \gset
SELECT awp.coordinator_tick(false, NULL, false) AS pass \gset
SELECT ok(NOT (:'pass'::jsonb ? 'limited'), 'a pass with p_limits false leaves "limited" out');
SELECT is(pg_temp.calls('_limits_held') - :l0, 0::bigint, 'and does not look for the limits');
SELECT is(pg_temp.calls('_dispatch_one') - :d0, 0::bigint, 'with no free slot, a pass visits none of the 400 runs');
SELECT is((:'pass'::jsonb->>'dispatched')::integer, 0, 'and dispatches nothing');
SELECT is(awp.coordinator_tick()->'limited', '["workers_full"]'::jsonb,
          'coordinator_tick(takeover, term) (a DBA''s pass) still says which limit holds them');
SELECT is(awp.coordinator_tick(false, NULL, true)->'limited', '["workers_full"]'::jsonb, 'so does p_limits true');

-- jit off for a pass (compiling cost 600 of a pass's 700 ms at 10,000 live runs).
SELECT ok((SELECT 'jit=off' = ANY (proconfig) FROM pg_proc WHERE oid = 'awp.coordinator_tick(boolean, bigint, boolean)'::regprocedure),
          'coordinator_tick runs with jit off');
SELECT ok((SELECT 'jit=off' = ANY (proconfig) FROM pg_proc WHERE oid = 'awp._limits_held()'::regprocedure),
          'awp._limits_held runs with jit off');

SELECT * FROM finish();
ROLLBACK;
