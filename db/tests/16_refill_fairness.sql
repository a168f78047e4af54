-- The refill obeys the fairness rule (docs/protocol.md, rule 9): the slot a completion frees goes to the run that
-- never got a dispatch, not to the completing run.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(5);

SELECT tests.freeze('2026-01-01 00:00:00+00');
-- Fairness: a completion does not refill its slot for its own run while another run with ready work is ahead.
SELECT awp.configure(dispatch_limit => 1);
SELECT tests.make_run('big', jsonb_build_array(tests.task('p'), tests.task('q')), 5) AS big \gset
SELECT * FROM tests.register_worker('w3', '{mock}', 1) \gset w3_
SELECT awp.coordinator_tick();
SELECT dispatch_id AS f_dispatch, lease_token AS f_lease, run_id AS f_run
  FROM awp.claim_tasks(:'w3_worker_id', :'w3_token', 1) \gset
SELECT tests.make_run('small', jsonb_build_array(tests.task('s')), 5) AS small \gset
SELECT ok(tests.complete(:'w3_worker_id', :'w3_token', :'f_dispatch', :'f_lease'), 'the first run''s task completes');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'f_run' AND status = 'pending'), 0::bigint,
          'no dispatch for the completing run while a never-dispatched run waits');
SELECT is((SELECT run_id FROM awp.dispatches WHERE status = 'pending'), :'small',
          'the freed slot went to the never-dispatched run, in the same transaction');
SELECT is((SELECT awp.coordinator_tick()->>'dispatched'), '0', 'nothing was left for the coordinator (dispatch_limit 1)');

SELECT is_empty('SELECT * FROM awp.check_invariants()', 'no invariant is violated');

SELECT * FROM finish();
ROLLBACK;
