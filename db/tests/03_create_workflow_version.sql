-- awp.create_workflow_version: versions, identical definitions, defaults, and every validation
-- rule of docs/protocol.md, Objects (each violation is AWREQ with a DETAIL saying what is wrong).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(65);

CREATE FUNCTION tests.cwv(p jsonb) RETURNS text LANGUAGE sql AS $$
  SELECT format('SELECT * FROM awp.create_workflow_version(%L::jsonb)', p)
$$;
CREATE FUNCTION tests.bad_task(p_extra jsonb) RETURNS text LANGUAGE sql AS $$
  SELECT tests.cwv(tests.def(jsonb_build_array(tests.task('a') || p_extra)))
$$;

-- ---------------------------------------------------------------- versions
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a')))), $$VALUES ('wf'::text, 1)$$,
                  'a valid definition becomes (wf, 1)');
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a')))), $$VALUES ('wf'::text, 1)$$,
                  'an identical definition returns the same version');
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a'), tests.task('b', '{a}')))),
                  $$VALUES ('wf'::text, 2)$$, 'a changed definition becomes version 2');
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a')))), $$VALUES ('wf'::text, 3)$$,
                  'going back to the first definition is a new version (only the latest is compared)');
SELECT is((SELECT count(*) FROM awp.workflow_versions WHERE workflow_id = 'wf'), 3::bigint, 'three versions stored');
SELECT is((SELECT task_count FROM awp.workflow_versions WHERE workflow_id = 'wf' AND version = 2), 2,
          'task_count is stored');
SELECT is((SELECT definition_hash FROM awp.workflow_versions WHERE workflow_id = 'wf' AND version = 1),
          (SELECT definition_hash FROM awp.workflow_versions WHERE workflow_id = 'wf' AND version = 3),
          'the hash depends on the definition only');
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"id": "other.wf-1_x"}')),
                  $$VALUES ('other.wf-1_x'::text, 1)$$, 'versions are numbered per workflow');

-- The definition is stored as given (its hash is that of the given JSON); start_run applies the
-- defaults (04_start_run checks them).
SELECT is((SELECT definition FROM awp.workflow_versions WHERE workflow_id = 'wf' AND version = 2),
          tests.def(jsonb_build_array(tests.task('a'), tests.task('b', '{a}'))), 'the definition is stored as given');
SELECT is((SELECT definition_hash FROM awp.workflow_versions WHERE workflow_id = 'wf' AND version = 2),
          encode(sha256(convert_to(tests.def(jsonb_build_array(tests.task('a'), tests.task('b', '{a}')))::text, 'UTF8')), 'hex'),
          'definition_hash is the SHA-256 of the stored definition');

-- ---------------------------------------------------------------- the definition object
SELECT throws_ok(format('SELECT * FROM awp.create_workflow_version(%L::jsonb)', '[]'), 'AWREQ', NULL,
                 'a definition that is not an object is AWREQ');
SELECT throws_ok('SELECT * FROM awp.create_workflow_version(NULL)', 'AWREQ', NULL, 'a null definition is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"owner": "me"}')), 'AWREQ', NULL,
                 'an unknown top-level field is AWREQ');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"owner": "me"}'))),
          'unknown fields: owner', 'the detail names the unknown field');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"concurency": 2}'))),
          'unknown fields: concurency (did you mean concurrency?)', 'a misspelt field: the detail suggests the right one');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{}', '{"dependson": ["b"]}'))))),
          'tasks[0] (key a): unknown fields: dependson (did you mean depends_on?)', 'a misspelt task field too');
SELECT is((SELECT m FROM (SELECT awp._did_you_mean('zzz', '{id,concurrency,tasks}') m) x), '', 'nothing near: no hint');
SELECT throws_ok(tests.cwv('{"tasks": [{"key": "a", "executor": "mock"}]}'), 'AWREQ', NULL, 'a missing id is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"id": "has space"}')), 'AWREQ', NULL,
                 'an id with a space is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"id": ""}')), 'AWREQ', NULL,
                 'an empty id is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), jsonb_build_object('id', repeat('x', 129)))),
                 'AWREQ', NULL, 'a 129-character id is AWREQ');
SELECT results_eq(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), jsonb_build_object('id', repeat('x', 128)))),
                  format('VALUES (%L::text, 1)', repeat('x', 128)), 'a 128-character id is accepted');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"id": 7}')), 'AWREQ', NULL,
                 'a numeric id is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"concurrency": 0}')), 'AWREQ', NULL,
                 'concurrency 0 is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"concurrency": 10001}')), 'AWREQ', NULL,
                 'concurrency 10001 is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"concurrency": 1.5}')), 'AWREQ', NULL,
                 'a fractional concurrency is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"concurrency": "4"}')), 'AWREQ', NULL,
                 'a string concurrency is AWREQ');
SELECT lives_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a')), '{"id": "c10000", "concurrency": 10000}')),
                'concurrency 10000 is accepted');

-- ---------------------------------------------------------------- tasks
SELECT throws_ok(tests.cwv(tests.def('[]')), 'AWREQ', NULL, 'an empty task list is AWREQ');
SELECT throws_ok(tests.cwv('{"id": "wf"}'), 'AWREQ', NULL, 'missing tasks is AWREQ');
SELECT throws_ok(tests.cwv(tests.def('{"a": 1}')), 'AWREQ', NULL, 'tasks that are not an array is AWREQ');
SELECT throws_ok(tests.cwv(tests.def((SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 10001) i))),
                 'AWREQ', NULL, '10,001 tasks is AWREQ');
SELECT throws_ok(tests.cwv(tests.def('["a"]')), 'AWREQ', NULL, 'a task that is not an object is AWREQ');
SELECT throws_ok(tests.cwv(tests.def('[{"executor": "mock"}]')), 'AWREQ', NULL, 'a task without key is AWREQ');
SELECT throws_ok(tests.bad_task('{"key": ""}'), 'AWREQ', NULL, 'an empty key is AWREQ');
SELECT throws_ok(tests.bad_task('{"key": "a/b"}'), 'AWREQ', NULL, 'a key with "/" is AWREQ');
SELECT throws_ok(tests.bad_task('{"key": 1}'), 'AWREQ', NULL, 'a numeric key is AWREQ');
SELECT throws_ok(tests.bad_task('{"colour": "red"}'), 'AWREQ', NULL, 'an unknown task field is AWREQ');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('a')))),
                 'AWREQ', NULL, 'duplicate keys are AWREQ');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('a'))))),
          'duplicate task keys: a', 'the detail names the duplicate key');
SELECT throws_ok(tests.bad_task('{"executor": "shell"}'), 'AWREQ', NULL, 'an unknown executor is AWREQ');
SELECT matches(tests.error_detail(tests.bad_task('{"executor": "shell"}')), 'unknown executor shell',
               'the detail names the unknown executor');
SELECT throws_ok(tests.cwv(tests.def('[{"key": "a"}]')), 'AWREQ', NULL, 'a missing executor is AWREQ');
SELECT lives_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{}', '{"executor": "python"}')), '{"id": "py"}')),
                'the python executor is known');

-- dependencies
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{ghost}')))), 'AWREQ', NULL,
                 'an unknown dependency is AWREQ');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{ghost}'))))),
          'task a depends on unknown task ghost', 'the detail names the unknown dependency');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{a}')))), 'AWREQ', NULL,
                 'a self-dependency is AWREQ');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{a}'))))),
          'dependency cycle: a -> a', 'a self-dependency is reported as a cycle of one');
SELECT throws_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{c}'), tests.task('b', '{a}'), tests.task('c', '{b}'))))
                 , 'AWREQ', NULL, 'a cycle is AWREQ');
SELECT is(tests.error_detail(tests.cwv(tests.def(jsonb_build_array(
            tests.task('root'), tests.task('a', '{root,c}'), tests.task('b', '{a}'), tests.task('c', '{b}'),
            tests.task('leaf', '{c}'))))),
          'dependency cycle: a -> c -> b -> a', 'the cycle detail names the path (and only the cycle)');
SELECT throws_ok(tests.bad_task('{"depends_on": ["b", "b"]}'), 'AWREQ', NULL, 'a duplicate in depends_on is AWREQ');
SELECT throws_ok(tests.bad_task('{"depends_on": "b"}'), 'AWREQ', NULL, 'depends_on that is not an array is AWREQ');
SELECT throws_ok(tests.bad_task('{"depends_on": [1]}'), 'AWREQ', NULL, 'a non-string dependency is AWREQ');

-- retry, timeout, input
SELECT throws_ok(tests.bad_task('{"retry": {"max_attempts": 0}}'), 'AWREQ', NULL, 'max_attempts 0 is AWREQ');
SELECT throws_ok(tests.bad_task('{"retry": {"max_attempts": 101}}'), 'AWREQ', NULL, 'max_attempts 101 is AWREQ');
SELECT throws_ok(tests.bad_task('{"retry": {"interval_ms": -1}}'), 'AWREQ', NULL, 'interval_ms -1 is AWREQ');
SELECT throws_ok(tests.bad_task('{"retry": {"interval_ms": 86400001}}'), 'AWREQ', NULL, 'interval_ms 86400001 is AWREQ');
SELECT throws_ok(tests.bad_task('{"retry": {"tries": 2}}'), 'AWREQ', NULL, 'an unknown retry field is AWREQ');
SELECT throws_ok(tests.bad_task('{"timeout_ms": 0}'), 'AWREQ', NULL, 'timeout_ms 0 is AWREQ');
SELECT throws_ok(tests.bad_task('{"timeout_ms": 86400001}'), 'AWREQ', NULL, 'timeout_ms 86400001 is AWREQ');
SELECT throws_ok(tests.bad_task(jsonb_build_object('input', jsonb_build_object('s', repeat('x', 65536)))),
                 'AWREQ', NULL, 'an input over 64 KiB is AWREQ');
SELECT lives_ok(tests.cwv(tests.def(jsonb_build_array(tests.task('a', '{}', jsonb_build_object(
                  'input', jsonb_build_object('s', repeat('x', 65000)),
                  'retry', '{"max_attempts": 100, "interval_ms": 0}'::jsonb, 'timeout_ms', 86400000))),
                  '{"id": "limits"}')),
                'the upper limits themselves are accepted');

-- 10,000 tasks in one long chain are accepted, and a cycle closing it is reported with its path.
SELECT results_eq(tests.cwv(tests.def((SELECT jsonb_agg(tests.task('t' || i, CASE WHEN i > 1 THEN ARRAY['t' || (i - 1)] ELSE '{}' END) ORDER BY i)
                                         FROM generate_series(1, 10000) i), '{"id": "chain"}')),
                  $$VALUES ('chain'::text, 1)$$, 'a 10,000-task chain is accepted');
SELECT matches(tests.error_detail(tests.cwv(tests.def((SELECT jsonb_agg(tests.task('t' || i, ARRAY['t' || CASE WHEN i > 1 THEN i - 1 ELSE 10000 END]) ORDER BY i)
                                                         FROM generate_series(1, 10000) i), '{"id": "chain"}'))),
               '^dependency cycle: t1 -> t10000 -> t9999 -> .* -> t2 -> t1$', 'a 10,000-task cycle is reported with its path');
SELECT is((SELECT count(*) FROM awp.workflow_versions WHERE workflow_id = 'chain'), 1::bigint,
          'a rejected definition stores nothing');

SELECT * FROM finish();
ROLLBACK;
