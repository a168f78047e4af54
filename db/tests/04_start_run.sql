-- awp.start_run: tasks created (roots ready, others waiting), defaults applied, creation events
-- 1..n, idempotency keys, versions, AWNTF.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(30);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT tests.make_workflow('wf', jsonb_build_array(
         tests.task('a'), tests.task('b', '{a}'), tests.task('c'),
         tests.task('d', '{b,c}', '{"action": "merge", "input": {"n": 1}, "retry": {"max_attempts": 3, "interval_ms": 250}, "timeout_ms": 5000}')),
         4) \gset
SELECT awp.start_run('wf') AS run \gset

SELECT is(tests.run_status(:'run'), 'pending', 'a new run is pending');
SELECT is((SELECT workflow_version FROM awp.runs WHERE run_id = :'run'), 1, 'the latest version is used when null');
SELECT is((SELECT concurrency FROM awp.runs WHERE run_id = :'run'), 4, 'the run takes the definition''s concurrency');
SELECT is(tests.task_statuses(:'run'), ARRAY['a=ready', 'b=waiting_dependencies', 'c=ready', 'd=waiting_dependencies'],
          'roots are ready, the others wait for their dependencies');
SELECT results_eq(format($$SELECT task_key, pending_deps, depends_on, dependants FROM awp.tasks WHERE run_id = %L ORDER BY ordinal$$, :'run'),
                  $$VALUES ('a'::text, 0, '{}'::text[], '{b}'::text[]), ('b', 1, '{a}', '{d}'), ('c', 0, '{}', '{d}'), ('d', 2, '{b,c}', '{}')$$,
                  'dependencies and dependants are wired both ways');
SELECT results_eq(format($$SELECT action, input, max_attempts, interval_ms, timeout_ms FROM awp.tasks WHERE run_id = %L AND task_key = 'a'$$, :'run'),
                  $$VALUES ('a'::text, '{}'::jsonb, 1, 1000, 300000)$$,
                  'defaults: action = key, input {}, max_attempts 1, interval 1000 ms, timeout 300000 ms');
SELECT results_eq(format($$SELECT action, input, max_attempts, interval_ms, timeout_ms FROM awp.tasks WHERE run_id = %L AND task_key = 'd'$$, :'run'),
                  $$VALUES ('merge'::text, '{"n": 1}'::jsonb, 3, 250, 5000)$$, 'given values are kept');
SELECT is((SELECT count(*) FROM awp.attempts WHERE run_id = :'run'), 0::bigint, 'no attempt exists before a claim');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run'), 0::bigint, 'start_run itself creates no dispatch when no worker exists');
SELECT is((SELECT created_at FROM awp.runs WHERE run_id = :'run'), :'t0'::timestamptz, 'created_at is database (frozen) time');
SELECT is((SELECT started_at FROM awp.runs WHERE run_id = :'run'), NULL, 'started_at is empty until the first dispatch');

-- Events: run created, then every task, contiguous from 1, all in revision 1.
SELECT results_eq(format($$SELECT sequence, revision, entity_type, CASE entity_type WHEN 'run' THEN NULL ELSE entity_key END, from_status, to_status FROM awp.events WHERE run_id = %L ORDER BY sequence$$, :'run'),
                  $$VALUES (1::bigint, 1::bigint, 'run'::text, NULL::text, NULL::text, 'pending'::text),
                           (2, 1, 'task', 'a', NULL, 'ready'), (3, 1, 'task', 'c', NULL, 'ready'),
                           (4, 1, 'task', 'b', NULL, 'waiting_dependencies'), (5, 1, 'task', 'd', NULL, 'waiting_dependencies')$$
                  || '', 'creation events: the run, then each task; sequences 1..5 in revision 1');
SELECT is((SELECT entity_key FROM awp.events WHERE run_id = :'run' AND sequence = 1), :'run', 'the run event names the run');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences are contiguous and last_sequence matches');
SELECT is(tests.rev(:'run'), 1::bigint, 'a new run is at revision 1');

-- Idempotency keys.
SELECT awp.start_run('wf', NULL, 'key-1') AS k1 \gset
SELECT is(awp.start_run('wf', NULL, 'key-1'), :'k1', 'the same idempotency key returns the same run');
SELECT is(awp.start_run('wf', 1, 'key-1'), :'k1', '... also when the version is spelled out');
SELECT is((SELECT count(*) FROM awp.runs WHERE workflow_id = 'wf' AND idempotency_key = 'key-1'), 1::bigint,
          'only one run exists for the key');
SELECT is(tests.event_count(:'k1'), 5::bigint, 'the replay appended no event (1 run + 4 tasks)');
SELECT isnt(awp.start_run('wf', NULL, 'key-2'), :'k1', 'another key is another run');
SELECT isnt(awp.start_run('wf'), :'run', 'no key: every call is a new run');
SELECT tests.make_workflow('other') \gset
SELECT isnt(awp.start_run('other', NULL, 'key-1'), :'k1', 'keys are scoped per workflow');
SELECT throws_ok($$SELECT awp.start_run('wf', NULL, '')$$, 'AWREQ', NULL, 'an empty idempotency key is AWREQ');
SELECT throws_ok(format($$SELECT awp.start_run('wf', NULL, %L)$$, repeat('k', 256)), 'AWREQ', NULL,
                 'a 256-character idempotency key is AWREQ');

-- Versions.
SELECT tests.make_workflow('wf', jsonb_build_array(tests.task('only')), 2) \gset
SELECT awp.start_run('wf') AS run2 \gset
SELECT is((SELECT workflow_version FROM awp.runs WHERE run_id = :'run2'), 2, 'null version: the latest (2)');
SELECT is(tests.task_statuses(awp.start_run('wf', 1)), ARRAY['a=ready', 'b=waiting_dependencies', 'c=ready', 'd=waiting_dependencies'],
          'an explicit older version starts with that version''s tasks');
SELECT throws_ok($$SELECT awp.start_run('nope')$$, 'AWNTF', NULL, 'an unknown workflow is AWNTF');
SELECT throws_ok($$SELECT awp.start_run('wf', 3)$$, 'AWNTF', NULL, 'an unknown version is AWNTF');
SELECT throws_ok($$SELECT awp.start_run('nope', 1, 'key-1')$$, 'AWNTF', NULL, 'an unknown workflow with a key is AWNTF');
SELECT is(awp.start_run('wf', NULL, 'key-1'), :'k1', 'a replayed key returns its run even after a new version');

SELECT * FROM finish();
ROLLBACK;
