-- Data flow through a run (docs/data-flow.md): run input (validation, idempotency with input),
-- leases carrying run_input and upstream (claim_tasks and complete_and_claim), the lease payload
-- limit, the run output of a succeeded run, waiting_for_executors and the metrics snapshot.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(42);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 50) \gset w1_
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) WITH NO DATA;
SELECT set_config('tests.w1', :'w1_worker_id', true), set_config('tests.t1', :'w1_token', true);
-- tests.take(): a coordinator pass and w1 claims everything pending; returns the leases taken.
CREATE FUNCTION tests.take() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  PERFORM awp.coordinator_tick();
  INSERT INTO l SELECT * FROM awp.claim_tasks(current_setting('tests.w1'), current_setting('tests.t1'),
                                              (SELECT greatest(count(*), 1) FROM awp.dispatches WHERE status = 'pending')::integer);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
-- tests.done(run, key, output): complete the latest lease of a task with success and that output.
CREATE FUNCTION tests.done(p_run text, p_key text, p_output jsonb) RETURNS boolean LANGUAGE sql AS $$
  SELECT awp.complete_task(current_setting('tests.w1'), current_setting('tests.t1'), l.dispatch_id, l.lease_token,
                           CASE WHEN p_output IS NULL THEN '{"kind": "success"}'::jsonb
                                ELSE jsonb_build_object('kind', 'success', 'output', p_output) END)
    FROM l WHERE l.run_id = p_run AND l.task_key = p_key ORDER BY l.attempt DESC LIMIT 1
$$;

-- ================================================================ run input
SELECT tests.make_workflow('flow', jsonb_build_array(
         tests.task('fetch-a'), tests.task('fetch-b'), tests.task('summarise', '{fetch-a,fetch-b}'),
         tests.task('review', '{summarise}'), tests.task('audit', '{fetch-a}')));
SELECT has_function('awp', 'start_run', ARRAY['text', 'integer', 'text', 'jsonb'], 'start_run takes an input');
SELECT awp.start_run('flow', NULL, 'key-1', '{"topic": "pg"}') AS run \gset
SELECT is((SELECT input FROM awp.get_run(:'run')), '{"topic": "pg"}'::jsonb, 'get_run shows the run''s input');
SELECT is(awp.start_run('flow', NULL, 'key-1', '{"topic": "pg"}'), :'run', 'the same key with the same input returns the same run');
SELECT throws_ok($$SELECT awp.start_run('flow', NULL, 'key-1', '{"topic": "other"}')$$, 'AWIDM', NULL,
                 'the same key with another input raises AWIDM');
SELECT throws_ok($$SELECT awp.start_run('flow', NULL, 'key-1')$$, 'AWIDM', NULL,
                 'the same key without the input it was started with raises AWIDM');
SELECT is((SELECT count(*) FROM awp.runs WHERE idempotency_key = 'key-1'), 1::bigint, 'one run for the key');
SELECT throws_ok($$SELECT awp.start_run('flow', NULL, NULL, '[1, 2]')$$, 'AWREQ', 'invalid run input', 'an array input raises AWREQ');
SELECT throws_ok($$SELECT awp.start_run('flow', NULL, NULL, '"text"')$$, 'AWREQ', 'invalid run input', 'a string input raises AWREQ');
SELECT throws_ok(format($$SELECT awp.start_run('flow', NULL, NULL, %L)$$, jsonb_build_object('big', repeat('x', 65536))),
                 'AWREQ', 'run input too large', 'an input over 64 KiB raises AWREQ');
SELECT lives_ok(format($$SELECT awp.start_run('flow', NULL, NULL, %L)$$, jsonb_build_object('big', repeat('x', 65536 - 12))),
                'an input of exactly 64 KiB is accepted');
SELECT awp.start_run('flow') AS plain \gset
SELECT is((SELECT input FROM awp.get_run(:'plain')), '{}'::jsonb, 'a run started without input has input {}');
SELECT is(awp.start_run('flow', NULL, 'key-2'), awp.start_run('flow', NULL, 'key-2', '{}'),
          'no input and {} are the same input for idempotency');

-- ================================================================ leases carry run_input and upstream
UPDATE awp.runs SET cancel_requested_at = awp._now() WHERE run_id <> :'run';
SELECT awp.converge_cancellations();
SELECT is(tests.take(), 2::bigint, 'setup: the two roots are leased');
SELECT results_eq($$SELECT task_key, run_input, upstream FROM l ORDER BY task_key$$,
                  $$VALUES ('fetch-a'::text, '{"topic": "pg"}'::jsonb, '{}'::jsonb), ('fetch-b', '{"topic": "pg"}', '{}')$$,
                  'roots get the run input and an empty upstream');
SELECT ok(tests.done(:'run', 'fetch-a', '{"pages": 3}'), 'fetch-a completes with an output');
SELECT is(tests.take(), 1::bigint, 'audit (depends on fetch-a only) is leased');
SELECT is((SELECT upstream FROM l WHERE task_key = 'audit'), '{"fetch-a": {"pages": 3}}'::jsonb,
          'upstream maps the dependency''s key to its output');
SELECT ok(tests.done(:'run', 'fetch-b', NULL), 'fetch-b completes without an output');
-- complete_and_claim returns the same lease columns.
INSERT INTO l SELECT * FROM awp.complete_and_claim(:'w1_worker_id', :'w1_token',
  (SELECT dispatch_id FROM l WHERE task_key = 'audit'), (SELECT lease_token FROM l WHERE task_key = 'audit'),
  '{"kind": "success", "output": [1, 2]}', 1);
SELECT results_eq($$SELECT task_key, run_input, upstream FROM l WHERE task_key = 'summarise'$$,
                  $$VALUES ('summarise'::text, '{"topic": "pg"}'::jsonb, '{"fetch-a": {"pages": 3}, "fetch-b": null}'::jsonb)$$,
                  'complete_and_claim leases the fan-in with every dependency''s output (null when it had none)');

-- A retried dependency: upstream holds the output of the succeeded attempt, not an earlier one.
SELECT tests.make_workflow('retry-flow', jsonb_build_array(
         tests.task('a', '{}', '{"retry": {"max_attempts": 3, "interval_ms": 0}}'), tests.task('b', '{a}')));
SELECT awp.start_run('retry-flow', NULL, NULL, '{"n": 7}') AS rrun \gset
SELECT is(tests.take(), 1::bigint, 'setup: a is leased');
SELECT ok(awp.complete_task(:'w1_worker_id', :'w1_token', l.dispatch_id, l.lease_token,
                            '{"kind": "temporary_failure", "output": {"try": 1}}'), 'a fails once with an output')
  FROM l WHERE run_id = :'rrun' AND task_key = 'a';
SELECT tests.advance('1 second');
SELECT is(tests.take(), 1::bigint, 'a is leased again');
SELECT ok(tests.done(:'rrun', 'a', '{"try": 2}'), 'the second attempt succeeds');
SELECT is(tests.take(), 1::bigint, 'b is leased');
SELECT is((SELECT upstream FROM l WHERE run_id = :'rrun' AND task_key = 'b'), '{"a": {"try": 2}}'::jsonb,
          'upstream is the output of the succeeded attempt');

-- ================================================================ run output
SELECT is((SELECT output FROM awp.get_run(:'run')), NULL::jsonb, 'no output while the run is running');
SELECT ok(tests.done(:'run', 'summarise', '{"summary": "ok"}'), 'summarise completes');
SELECT is(tests.take(), 1::bigint, 'review is leased');
SELECT is((SELECT upstream FROM l WHERE task_key = 'review'), '{"summarise": {"summary": "ok"}}'::jsonb,
          'review sees summarise''s output');
SELECT ok(tests.done(:'run', 'review', '"approved"'), 'review completes with a string output');
SELECT results_eq(format($$SELECT status, output, output_truncated FROM awp.get_run(%L)$$, :'run'),
                  $$VALUES ('succeeded'::text, '{"audit": [1, 2], "review": "approved"}'::jsonb, false)$$,
                  'a succeeded run''s output maps each task without dependants to its output');
SELECT ok(tests.done(:'rrun', 'b', NULL), 'b completes without an output');
SELECT is((SELECT output FROM awp.get_run(:'rrun')), '{"b": null}'::jsonb, 'a leaf without output maps to null');

-- ================================================================ lease payload limit
-- 20 fan-out tasks of 60,000 bytes each: 1.2 MB of upstream for the fan-in, over the 1 MiB limit.
SELECT tests.make_workflow('wide', (SELECT jsonb_agg(tests.task('p' || i)) FROM generate_series(1, 20) i)
                                   || jsonb_build_array(tests.task('join', (SELECT array_agg('p' || i) FROM generate_series(1, 20) i))), 50);
SELECT awp.start_run('wide') AS wide \gset
SELECT is(tests.take(), 20::bigint, 'setup: 20 fan-out tasks leased');
SELECT ok(bool_and(tests.done(:'wide', 'p' || i, jsonb_build_object('blob', repeat('y', 60000)))), 'each completes with 60 kB')
  FROM generate_series(1, 20) i;
SELECT is(tests.take(), 0::bigint, 'the fan-in is not handed out');
SELECT results_eq(format($$SELECT status, error_code FROM awp.task_attempts(%L, 'join')$$, :'wide'),
                  $$VALUES ('failed'::text, 'lease_payload_too_large'::text)$$,
                  'its attempt failed with lease_payload_too_large');
SELECT is(tests.run_status(:'wide'), 'failed', 'and the run failed');
SELECT is_empty(format($$SELECT * FROM awp.check_invariants(ARRAY[%L, %L, %L])$$, :'run', :'rrun', :'wide'),
                'every invariant holds');

-- ================================================================ waiting for an executor nobody offers
SELECT tests.make_workflow('py', jsonb_build_array(jsonb_build_object('key', 'p', 'executor', 'python'),
                                                     tests.task('m')));
SELECT awp.start_run('py') AS pyrun \gset
SELECT tests.dispatch_all();
SELECT is((SELECT waiting_for_executors FROM awp.get_run(:'pyrun')), ARRAY['python'],
          'a run whose ready task no active worker can take names the executor it waits for');
SELECT is((awp.metrics_snapshot())->'ready_without_worker', '{"python": 1}'::jsonb,
          'the metrics snapshot counts ready tasks per executor without a worker');
SELECT * FROM tests.register_worker('w2', '{python}', 1) \gset w2_
SELECT is((SELECT waiting_for_executors FROM awp.get_run(:'pyrun')), '{}'::text[], 'nothing once a python worker is active');

SELECT * FROM finish();
ROLLBACK;
