-- Grouped completions and the refill leased to its worker (docs/protocol.md, Refill and claim on complete):
-- awp.complete_and_claim refills the slot it frees straight to the completing worker (the same rows and events
-- as a refill then a claim), unless a pending dispatch waits to be claimed; awp.complete_and_claim_many
-- settles several workers' completions in one transaction, each item as its own call would, each refused item
-- answered with its own error.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(26);

SELECT tests.freeze('2026-01-01 00:00:00+00');
SELECT tests.make_run('g', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'), tests.task('d'),
                                             tests.task('e'), tests.task('f')), 2) AS run \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 1) \gset w2_
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l1_
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset l2_
SELECT is(ARRAY(SELECT unnest(ARRAY[:'l1_task_key', :'l2_task_key']) ORDER BY 1), '{a,b}'::text[], 'w1 and w2 hold a and b');
SELECT tests.end_tx();

-- 1. The refill leased to its worker: one call, the next task, created leased (no pending row in between).
SELECT tests.rev(:'run') AS rev1 \gset
SELECT tests.event_count(:'run') AS ev1 \gset
SELECT dispatch_id AS c_dispatch, lease_token AS c_lease, task_key AS c_key, attempt AS c_attempt
  FROM awp.complete_and_claim(:'w1_worker_id', :'w1_token', :'l1_dispatch_id', :'l1_lease_token', tests.result(), 1) \gset
SELECT is(:'c_key'::text, 'c', 'complete_and_claim leases the first ready task to the completing worker');
SELECT is((SELECT row(status, worker_id, attempt, claim_seq IS NULL)::text FROM awp.dispatches WHERE dispatch_id = :'c_dispatch'),
          row('leased', :'w1_worker_id', 1, true)::text, 'its dispatch is leased to that worker, attempt 1');
SELECT is((SELECT status FROM awp.attempts WHERE dispatch_id = :'c_dispatch'), 'running', 'its attempt is running');
SELECT is(tests.rev(:'run'), :rev1::bigint + 1, 'one transaction, one revision');
SELECT is((SELECT array_agg(entity_type || ':' || coalesce(from_status, '-') || '>' || to_status ORDER BY sequence)
             FROM awp.events WHERE run_id = :'run' AND sequence > :ev1),
          '{dispatch:leased>completed,attempt:running>succeeded,task:running>succeeded,task:ready>queued,dispatch:->pending,dispatch:pending>leased,task:queued>running,attempt:->running}'::text[],
          'the events of a completion, then those of a refill and a claim, in that order');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences stay contiguous');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status = 'pending'), 0::bigint,
          'no pending dispatch was left behind');
SELECT tests.end_tx();

-- 2. A pending dispatch that waits to be claimed is claimed first (oldest first), and the freed slot is
--    refilled as complete_task does. A third worker makes room for one (the coordinator dispatches d).
SELECT * FROM tests.register_worker('w3', '{mock}', 1) \gset w3_
UPDATE awp.runs SET concurrency = 3 WHERE run_id = :'run';
SELECT tests.dispatch_all();
SELECT dispatch_id AS d_pending FROM awp.dispatches WHERE run_id = :'run' AND status = 'pending' \gset
SELECT tests.end_tx();
SELECT tests.advance('1 second');   -- the refill below is younger than d's dispatch
SELECT dispatch_id AS e_dispatch, lease_token AS e_lease, task_key AS e_key
  FROM awp.complete_and_claim(:'w2_worker_id', :'w2_token', :'l2_dispatch_id', :'l2_lease_token', tests.result(), 1) \gset
SELECT is(:'e_dispatch'::text, :'d_pending', 'with a pending dispatch waiting, the claim takes it (oldest first)');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status = 'pending'), 1::bigint,
          'and the freed slot was refilled with a pending dispatch, as complete_task does');
SELECT tests.end_tx();

-- 3. complete_and_claim_many: two workers' completions in one transaction.
SELECT dispatch_id AS w3_dispatch, lease_token AS w3_lease, task_key AS w3_key
  FROM awp.claim_tasks(:'w3_worker_id', :'w3_token', 1) \gset
SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev3 \gset
CREATE TEMP TABLE g AS
SELECT m.item, m.error, (m.lease).task_key, (m.lease).dispatch_id, (m.lease).lease_token
  FROM awp.complete_and_claim_many(jsonb_build_array(
    jsonb_build_object('worker_id', :'w1_worker_id', 'session_token', :'w1_token', 'dispatch_id', :'c_dispatch',
                       'lease_token', :'c_lease', 'result', tests.result(), 'slots', 1, 'claim_seq', 7),
    jsonb_build_object('worker_id', :'w2_worker_id', 'session_token', :'w2_token', 'dispatch_id', :'e_dispatch',
                       'lease_token', 'wrong', 'result', tests.result(), 'slots', 1, 'claim_seq', null),
    jsonb_build_object('worker_id', :'w3_worker_id', 'session_token', :'w3_token', 'dispatch_id', :'w3_dispatch',
                       'lease_token', :'w3_lease', 'result', tests.result(), 'slots', 0, 'claim_seq', null))) m;
SELECT is((SELECT array_agg(item ORDER BY item) FROM g), '{1,2,3}'::integer[], 'one row per item');
SELECT is((SELECT error->>'sqlstate' FROM g WHERE item = 2), 'AWLST', 'a wrong lease token: that item is lease_lost');
SELECT is((SELECT error->>'detail' FROM g WHERE item = 2),
          tests.error_detail(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, 'wrong', tests.result(), 1)$$,
                                    :'w2_worker_id', :'w2_token', :'e_dispatch')),
          'with the detail its own call would give');
SELECT ok((SELECT error IS NULL AND dispatch_id IS NOT NULL FROM g WHERE item = 1), 'item 1 applied, with a lease');
SELECT is((SELECT claim_seq FROM awp.dispatches WHERE dispatch_id = (SELECT dispatch_id FROM g WHERE item = 1)), 7::bigint,
          'its claim_seq is stored on its lease');
SELECT ok((SELECT error IS NULL AND dispatch_id IS NULL FROM g WHERE item = 3), 'item 3 applied, no lease asked');
SELECT is(ARRAY[tests.dispatch_status(:'c_dispatch'), tests.dispatch_status(:'e_dispatch'), tests.dispatch_status(:'w3_dispatch')],
          '{completed,leased,completed}'::text[], 'the refused item changed nothing, the others are settled');
SELECT is(tests.rev(:'run'), :rev3::bigint + 1, 'one transaction: the run''s revision moved once');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences stay contiguous');
SELECT tests.end_tx();

-- 4. Same item again (same result): applied again, no second state change of that dispatch; another result
--    -> AWCNF; an invalid session -> AWSES; both answered per item.
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok') ORDER BY m.item)
             FROM awp.complete_and_claim_many(jsonb_build_array(
               jsonb_build_object('worker_id', :'w3_worker_id', 'session_token', :'w3_token', 'dispatch_id', :'w3_dispatch',
                                  'lease_token', :'w3_lease', 'result', tests.result(), 'slots', 0, 'claim_seq', null),
               jsonb_build_object('worker_id', :'w3_worker_id', 'session_token', :'w3_token', 'dispatch_id', :'w3_dispatch',
                                  'lease_token', :'w3_lease', 'result', tests.result('permanent_failure'), 'slots', 0,
                                  'claim_seq', null),
               jsonb_build_object('worker_id', :'w1_worker_id', 'session_token', 'bad', 'dispatch_id', :'c_dispatch',
                                  'lease_token', :'c_lease', 'result', tests.result(), 'slots', 1, 'claim_seq', null))) m),
          '{ok,AWCNF,AWSES}'::text[], 'idempotent again, result_conflict, worker_session_invalid: each on its own item');
SELECT is(tests.task_status(:'run', :'w3_key'), 'succeeded', 'the duplicate left the task as it was');

-- 5. Malformed input: AWREQ for the whole call.
SELECT throws_ok($$SELECT * FROM awp.complete_and_claim_many('[]')$$, 'AWREQ', NULL, 'an empty array is invalid_request');
SELECT throws_ok($$SELECT * FROM awp.complete_and_claim_many('{"a": 1}')$$, 'AWREQ', NULL, 'not an array: invalid_request');
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim_many(jsonb_build_array(jsonb_build_object(
                   'worker_id', %L, 'session_token', %L, 'dispatch_id', 'x', 'lease_token', 'y', 'result', '{}'::jsonb,
                   'slots', 1, 'claim_seq', null, 'extra', 1)))$$, :'w1_worker_id', :'w1_token'),
                 'AWREQ', NULL, 'an unknown field: invalid_request');
SELECT is((SELECT m.error->>'sqlstate' FROM awp.complete_and_claim_many(jsonb_build_array(jsonb_build_object(
             'worker_id', :'w1_worker_id', 'session_token', :'w1_token', 'dispatch_id', :'c_dispatch',
             'lease_token', :'c_lease', 'result', tests.result(), 'slots', 1.5, 'claim_seq', null))) m),
          'AWREQ', 'a fractional slots value: that item is invalid_request');

SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');
SELECT * FROM finish();
ROLLBACK;
