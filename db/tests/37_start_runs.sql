-- awp.start_runs and awp.start_runs_idempotent (AWP issue 46): many runs of one workflow version in one call, all
-- or nothing, with the limits and the idempotency of a single start.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(19);

SELECT tests.make_workflow('b', jsonb_build_array(tests.task('a'), tests.task('b', '{a}')));
SELECT is((SELECT count(*) FROM awp.start_runs('b', NULL, '[{}, {"input": {"n": 1}}, {"idempotency_key": "k1", "input": {"n": 2}}]')),
          3::bigint, 'three items, three rows');
SELECT results_eq($$SELECT item, status FROM awp.start_runs('b', 1, '[{"idempotency_key": "k2"}, {"input": null}]')$$,
                  $$VALUES (0, 'pending'::text), (1, 'pending'::text)$$, 'one row per item, in order, with its status');
SELECT is((SELECT input FROM awp.runs WHERE idempotency_key = 'k1'), '{"n": 2}'::jsonb, 'each run has its item''s input');
SELECT is((SELECT count(*) FROM awp.tasks t JOIN awp.runs r USING (run_id) WHERE r.workflow_id = 'b'), 10::bigint,
          'every run got its tasks');
SELECT is((SELECT run_id FROM awp.start_runs('b', NULL, '[{"idempotency_key": "k1", "input": {"n": 2}}]')),
          (SELECT run_id FROM awp.runs WHERE idempotency_key = 'k1'), 'a key used before with the same input: the same run');
SELECT count(*) AS runs0 FROM awp.runs \gset

-- All or nothing, and the error names the item.
SELECT throws_ok($$SELECT * FROM awp.start_runs('b', NULL, '[{}, {"idempotency_key": "k1", "input": {"n": 3}}]')$$,
                 'AWIDM', NULL, 'a key reused with another input: AWIDM');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, ('[{}, {}, {"input": {"x": "' || repeat('y', 70000) || '"}}]')::jsonb)$$),
          'runs[2]: input is 70009 bytes, over the 65536-byte limit', 'an input over the limit: the detail names the item');
SELECT is((SELECT count(*) FROM awp.runs), :runs0::bigint, 'nothing was started by the refused calls');
SELECT throws_ok($$SELECT * FROM awp.start_runs('nope', NULL, '[{}]')$$, 'AWNTF', NULL, 'an unknown workflow: AWNTF');
SELECT throws_ok($$SELECT * FROM awp.start_runs('b', 9, '[{}]')$$, 'AWNTF', NULL, 'an unknown version: AWNTF');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, '[]')$$), 'runs must be an array of 1-1000 objects',
          'an empty list is refused');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, (SELECT jsonb_agg('{}'::jsonb) FROM generate_series(1, 1001)))$$),
          'runs must be an array of 1-1000 objects', 'more than 1,000 items are refused');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, '[{}, {"inputs": {}}]')$$), 'runs[1]: unknown fields: inputs',
          'an unknown field is named');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, '[{"input": [1]}]')$$), 'runs[0]: input must be a JSON object',
          'an input that is not an object');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs('b', NULL, '[{"idempotency_key": ""}]')$$),
          'runs[0]: idempotency key must have 1-255 characters', 'a bad key: the rule of start_run');
SELECT is((SELECT count(*) FROM awp.runs), :runs0::bigint, 'still nothing started');

-- Behind Idempotency-Keys (the gateway's batch route): a replay answers as the first time.
SELECT results_eq($$SELECT item, replayed FROM awp.start_runs_idempotent('b', 1,
                     '[{"idempotency_key": "h1", "request_hash": "x1"}, {"idempotency_key": "h2", "request_hash": "x2", "input": {"n": 5}}]')$$,
                  $$VALUES (0, false), (1, false)$$, 'start_runs_idempotent: two new runs');
SELECT results_eq($$SELECT item, replayed FROM awp.start_runs_idempotent('b', 1,
                     '[{"idempotency_key": "h2", "request_hash": "x2"}, {"idempotency_key": "h3", "request_hash": "x3"}]')$$,
                  $$VALUES (0, true), (1, false)$$, 'a key seen before is a replay, in the same call as a new one');
SELECT is(tests.error_detail($$SELECT * FROM awp.start_runs_idempotent('b', 1, '[{"idempotency_key": "h9"}]')$$),
          'runs[0]: request_hash must be a string', 'each item needs its request hash');

SELECT * FROM finish();
ROLLBACK;
