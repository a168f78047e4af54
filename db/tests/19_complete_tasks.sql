-- awp.complete_tasks: several completions and a claim in one transaction (a worker with several slots).
-- Each result is settled as by complete_task and answered on its own; the freed slots are refilled
-- round-robin over runs in fairness order; one revision per run; the run counters are written once
-- (awp._log_flush) and the checker stays clean.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(25);

SELECT tests.freeze('2026-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 4) \gset w1_
SELECT tests.make_run('big', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 10) i), 10) AS run \gset
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 4);
SELECT is((SELECT count(*) FROM l), 4::bigint, 'setup: four leases');
-- tests.items(n, result): the first n leases of l as complete_tasks items.
CREATE FUNCTION tests.items(p_keys text[], p_result jsonb DEFAULT '{"kind": "success", "output": {"ok": 1}}')
RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_agg(jsonb_build_object('dispatch_id', l.dispatch_id, 'lease_token', l.lease_token, 'result', p_result)
                   ORDER BY array_position(p_keys, l.task_key))
    FROM l WHERE l.task_key = ANY (p_keys)
$$;

-- ================================================================ shape errors
SELECT throws_ok(format($$SELECT awp.complete_tasks(%L, %L, '[]', 0)$$, :'w1_worker_id', :'w1_token'), 'AWREQ', 'invalid results', 'an empty array is AWREQ');
SELECT throws_ok(format($$SELECT awp.complete_tasks(%L, %L, '{}', 0)$$, :'w1_worker_id', :'w1_token'), 'AWREQ', 'invalid results', 'an object is AWREQ');
SELECT throws_ok(format($$SELECT awp.complete_tasks(%L, %L, %L, 0)$$, :'w1_worker_id', :'w1_token',
                        tests.items('{t1}') || tests.items('{t1}')), 'AWREQ', 'invalid results', 'a dispatch twice is AWREQ');
SELECT throws_ok(format($$SELECT awp.complete_tasks(%L, %L, %L, 0)$$, :'w1_worker_id', :'w1_token',
                        jsonb_set(tests.items('{t1}'), '{0,extra}', '1')), 'AWREQ', 'invalid results', 'an unknown field is AWREQ');
SELECT throws_ok(format($$SELECT awp.complete_tasks(%L, 'wrong', %L, 0)$$, :'w1_worker_id', tests.items('{t1}')),
                 'AWSES', NULL, 'the session is checked first');

-- ================================================================ a batch: applied, refused, refilled, claimed
SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev0 \gset
SELECT awp.complete_tasks(:'w1_worker_id', :'w1_token',
         tests.items('{t2,t1}')
         || jsonb_build_array(jsonb_build_object('dispatch_id', (SELECT dispatch_id FROM l WHERE task_key = 't3'),
                                                 'lease_token', 'not-the-token', 'result', '{"kind": "success"}'::jsonb),
                              jsonb_build_object('dispatch_id', (SELECT dispatch_id FROM l WHERE task_key = 't4'),
                                                 'lease_token', (SELECT lease_token FROM l WHERE task_key = 't4'),
                                                 'result', '{"kind": "bogus"}'::jsonb)),
         3) AS answer \gset
SELECT is(jsonb_path_query_array(:'answer'::jsonb, '$.results[*].dispatch_id'),
          (SELECT jsonb_agg(dispatch_id ORDER BY array_position('{t2,t1,t3,t4}'::text[], task_key)) FROM l),
          'one answer per result, in the order given');
SELECT is(jsonb_path_query_array(:'answer'::jsonb, '$.results[*].applied'), '[true, true]'::jsonb,
          'the two valid results are applied');
SELECT is(jsonb_path_query_array(:'answer'::jsonb, '$.results[*].error.sqlstate'), '["AWLST", "AWREQ"]'::jsonb,
          'a wrong lease token is AWLST and a bad result AWREQ, answered per item');
SELECT is(tests.task_statuses(:'run'), '{t1=succeeded,t2=succeeded,t3=running,t4=running,t5=running,t6=running,t7=ready,t8=ready,t9=ready,t10=ready}'::text[],
          'applied ones succeeded, refused ones still run, the two freed slots were refilled and leased');
SELECT is(jsonb_array_length(:'answer'::jsonb->'leases'), 2, 'leases for the two freed slots (the other two slots still hold t3 and t4)');
SELECT is((SELECT array_agg(x ORDER BY x) FROM jsonb_array_elements_text(jsonb_path_query_array(:'answer'::jsonb, '$.leases[*].task_key')) x),
          '{t5,t6}'::text[], 'the leases are the next tasks in definition order');
SELECT is(tests.rev(:'run'), :rev0::bigint + 1, 'one revision for the whole batch');
SELECT ok(tests.sequences_contiguous(:'run'), 'events stay contiguous and last_sequence matches');
SELECT is(coalesce(current_setting('awp.log_state', true), ''), '', 'the caller''s awp.log_state is as it was (empty)');

-- A replay of an applied result in a batch is applied again (idempotent); a different result conflicts.
SELECT is(awp.complete_tasks(:'w1_worker_id', :'w1_token', tests.items('{t1}'), 0)->'results'->0->'applied', 'true'::jsonb,
          'replaying an applied result answers applied');
SELECT is(awp.complete_tasks(:'w1_worker_id', :'w1_token', tests.items('{t1}', '{"kind": "success", "output": 2}'), 0)
            #>> '{results,0,error,sqlstate}', 'AWCNF', 'the same lease with another result is AWCNF');
SELECT is((SELECT count(*) FROM awp.attempts WHERE run_id = :'run' AND task_key = 't1'), 1::bigint, 'no second attempt');

-- ================================================================ fairness of the refills
-- Two more runs with ready tasks: the slots freed by a batch go round-robin in fairness order.
SELECT * FROM tests.register_worker('w2', '{mock}', 4) \gset w2_
SELECT tests.make_run('r-a', (SELECT jsonb_agg(tests.task('a' || i)) FROM generate_series(1, 6) i), 10) AS ra \gset
SELECT tests.make_run('r-b', (SELECT jsonb_agg(tests.task('b' || i)) FROM generate_series(1, 6) i), 10) AS rb \gset
UPDATE awp.runs SET cancel_requested_at = awp._now() WHERE run_id = :'run';
SELECT awp.converge_cancellations();
SELECT status FROM awp.drain_worker(:'w1_worker_id', :'w1_token');
SELECT tests.dispatch_all();
TRUNCATE l;
INSERT INTO l SELECT * FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 4);
SELECT is((SELECT count(*) FROM l), 4::bigint, 'setup: w2 holds four leases of r-a and r-b');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE status = 'pending'), 0::bigint, 'setup: nothing else pending (w1 was full)');
UPDATE awp.runs SET last_dispatch_seq = 1 WHERE run_id = :'rb';   -- r-b is first in fairness order now
-- Three of the four leases complete: three slots, shared 2 + 1 in fairness order (r-b first).
SELECT awp.complete_tasks(:'w2_worker_id', :'w2_token', (SELECT jsonb_agg(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token, 'result', '{"kind": "success"}'::jsonb)) FROM (SELECT * FROM l ORDER BY dispatch_id LIMIT 3) x), 0) AS fair \gset
SELECT is(jsonb_path_query_array(:'fair'::jsonb, '$.results[*].applied'), '[true, true, true]'::jsonb, 'all three applied');
SELECT results_eq($$SELECT r.workflow_id, count(*) FROM awp.dispatches d JOIN awp.runs r USING (run_id) WHERE d.status = 'pending' GROUP BY 1 ORDER BY 1$$,
                  $$VALUES ('r-a'::text, 1::bigint), ('r-b', 2)$$,
                  'the freed slots were refilled round-robin, the first run in fairness order taking the extra one');
SELECT ok((SELECT last_dispatch_seq FROM awp.runs WHERE run_id = :'rb') > 1, 'r-b moved to the back of the fairness order');

-- ================================================================ a draining worker completes, claims nothing
SELECT * FROM awp.drain_worker(:'w2_worker_id', :'w2_token');
SELECT * FROM tests.register_worker('w3', '{mock}', 2) \gset w3_
TRUNCATE l;
INSERT INTO l SELECT * FROM awp.claim_tasks(:'w3_worker_id', :'w3_token', 2);
SELECT * FROM awp.drain_worker(:'w3_worker_id', :'w3_token');
SELECT is(awp.complete_tasks(:'w3_worker_id', :'w3_token', (SELECT jsonb_agg(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token, 'result', '{"kind": "success"}'::jsonb)) FROM l), 5)->'leases',
          '[]'::jsonb, 'a draining worker completes but is handed nothing');

SELECT is_empty('SELECT * FROM awp.check_invariants()', 'no invariant is violated');

SELECT * FROM finish();
ROLLBACK;
