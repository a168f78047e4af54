-- awp.next_due_ms (AWP issue 41): when the coordinator's next pass is needed for a retry or a wait that falls due,
-- so a retry becomes ready close to its due time rather than at the next regular pass.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(6);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w', '{mock}', 2) \gset w_
SELECT is(awp.next_due_ms(), NULL::bigint, 'nothing waits: NULL');
SELECT tests.make_run('wf', jsonb_build_array(
  tests.task('a', '{}', '{"retry": {"max_attempts": 3, "interval_ms": 200}}'),
  tests.task('s', '{}', '{"executor": "sleep", "input": {"sleep_ms": 5000}}'))) AS run \gset
SELECT tests.dispatch_all();
SELECT is(awp.next_due_ms(), 5000::bigint, 'a sleep task: its end');
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset a_
SELECT is(tests.complete(:'w_worker_id', :'w_token', :'a_dispatch_id', :'a_lease_token', 'temporary_failure'), true, '(a fails)');
SELECT is(awp.next_due_ms(), 200::bigint, 'a retry due in 200 ms comes first');
SELECT tests.advance('150 ms');
SELECT is(awp.next_due_ms(), 50::bigint, '... 50 ms later');
SELECT tests.advance('100 ms');
SELECT is(awp.next_due_ms(), 0::bigint, 'past due: 0');

SELECT * FROM finish();
ROLLBACK;
