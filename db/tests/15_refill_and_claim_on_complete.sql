-- Refill and claim on complete (docs/protocol.md, Refill and claim on complete): a completion refills the slot
-- it frees under every limit and the fairness rule, and awp.complete_and_claim (claim on complete) leases in the
-- same transaction (one round trip per task).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(13);

SELECT tests.freeze('2026-01-01 00:00:00+00');
SELECT tests.make_run('chain', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'), tests.task('c', '{a}')), 1) AS run \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 2) \gset w1_
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l1_

-- Completing a unlocks b and c; run concurrency 1 allows one of them at once, in definition order.
SELECT ok(tests.complete(:'w1_worker_id', :'w1_token', :'l1_dispatch_id', :'l1_lease_token'), 'a completes');
SELECT is(tests.task_statuses(:'run'), '{a=succeeded,b=queued,c=ready}'::text[],
          'the completion refilled its slot with the first unlocked dependant, within the run concurrency');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status = 'pending'), 1::bigint,
          'exactly one pending dispatch was created');

-- complete_and_claim: completing b refills the slot with c and leases it in the same call.
SELECT tests.end_tx();
SELECT d.dispatch_id AS b_dispatch, d.lease_token AS b_lease
  FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) d \gset
SELECT tests.rev(:'run') AS rev_before \gset
SELECT tests.end_tx();
SELECT task_key, attempt FROM awp.complete_and_claim(:'w1_worker_id', :'w1_token', :'b_dispatch', :'b_lease',
                                                     tests.result(), 1) \gset cc_
SELECT is(:'cc_task_key'::text, 'c', 'complete_and_claim returns the lease of the task it just dispatched');
SELECT is(tests.task_statuses(:'run'), '{a=succeeded,b=succeeded,c=running}'::text[], 'b succeeded, c running');
SELECT is(tests.rev(:'run'), :rev_before::bigint + 1, 'one transaction, one revision');

-- Errors of the complete part are raised as by complete_task, and nothing is claimed.
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, 'wrong-token', tests.result(), 1)$$,
                        :'w1_worker_id', :'w1_token', :'b_dispatch'),
                 'AWLST', NULL, 'complete_and_claim with a stale lease is lease_lost');

-- A draining worker completes through complete_and_claim but is handed nothing new.
SELECT tests.make_run('more', jsonb_build_array(tests.task('x'), tests.task('y')), 5) AS run2 \gset
SELECT * FROM tests.register_worker('w2', '{mock}', 1) \gset w2_
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset l2_
SELECT * FROM awp.drain_worker(:'w2_worker_id', :'w2_token');
SELECT is((SELECT count(*) FROM awp.complete_and_claim(:'w2_worker_id', :'w2_token', :'l2_dispatch_id',
                                                        :'l2_lease_token', tests.result(), 1)),
          0::bigint, 'a draining worker completes but claims nothing');
SELECT is(tests.task_status(:'l2_run_id', :'l2_task_key'), 'succeeded', 'its completion was applied');

-- A pending dispatch of a run whose cancellation was requested waits for no claim (awp._claim_candidates), so it does
-- not keep a completion from refilling its slot (python workers here: the mock run above left a pending dispatch).
SELECT tests.make_run('refill-py', jsonb_build_array(tests.task('m1', '{}', '{"executor": "python"}'),
                                                     tests.task('m2', '{}', '{"executor": "python"}')), 1) AS run4 \gset
SELECT * FROM tests.register_worker('w3', '{python}', 1) \gset w3_
SELECT * FROM tests.claim_one(:'w3_worker_id', :'w3_token') \gset l3_
SELECT tests.make_run('cancel-py', jsonb_build_array(tests.task('p', '{}', '{"executor": "python"}'),
                                                     tests.task('q', '{}', '{"executor": "python"}')), 2) AS run3 \gset
SELECT * FROM tests.register_worker('w4', '{python}', 2) \gset w4_
SELECT * FROM tests.claim_one(:'w4_worker_id', :'w4_token') \gset l4_
-- Its cancellation requested and not converged yet (awp.request_cancel would withdraw q at once: the state a
-- coordinator pass that dispatched q just before the request leaves until the next convergence).
UPDATE awp.runs SET cancel_requested_at = awp._now() WHERE run_id = :'run3';
SELECT is((SELECT array_agg(d.status ORDER BY d.status) FROM awp.dispatches d
            WHERE d.run_id = :'run3' AND d.status IN ('pending', 'leased')),
          '{leased,pending}'::text[], 'setup: one task of the canceling run leased, the other''s dispatch pending');
SELECT is((SELECT array_agg(task_key) FROM awp.complete_and_claim(:'w3_worker_id', :'w3_token', :'l3_dispatch_id',
                                                                   :'l3_lease_token', tests.result(), 1)),
          '{m2}'::text[], 'the completion refills its slot and leases it, the canceling run''s pending dispatch aside');

-- The invariant checker is clean after all of it, and awp.transitions() lists docs/protocol.md, State machines.
SELECT is_empty('SELECT * FROM awp.check_invariants()', 'no invariant is violated');
SELECT is((SELECT count(*) FROM awp.transitions()), 52::bigint, 'awp.transitions lists 52 allowed transitions');

SELECT * FROM finish();
ROLLBACK;
