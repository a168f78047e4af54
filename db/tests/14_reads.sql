-- Read functions: get_run, run_tasks, task_attempts, run_events, list_runs paging, list_workers /
-- get_worker (never a token), AWNTF for unknown ids.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(28);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('reader', '{mock}', 4) \gset w_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'), tests.task('b', '{a}'))) AS run \gset
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l1_
SELECT tests.advance('1 s') AS t1 \gset
SELECT awp.complete_task(:'w_worker_id', :'w_token', :'l1_dispatch_id', :'l1_lease_token',
                         '{"kind": "temporary_failure", "error_code": "e1", "error_message": "first"}');
SELECT * FROM tests.claim_one(:'w_worker_id', :'w_token') \gset l2_

SELECT results_eq(format($$SELECT run_id, workflow_id, workflow_version, status, revision, cancel_requested_at, created_at, started_at, finished_at
                             FROM awp.get_run(%L)$$, :'run'),
                  format($$SELECT %L::text, 'wf'::text, 1, 'running'::text, revision, NULL::timestamptz, %L::timestamptz, %L::timestamptz, NULL::timestamptz
                             FROM awp.runs WHERE run_id = %L$$, :'run', :'t0', :'t0', :'run'),
                  'get_run returns the documented columns');
SELECT is((SELECT task_counts FROM awp.get_run(:'run')), '{"running": 1, "waiting_dependencies": 1}'::jsonb, 'get_run counts tasks by status');
SELECT throws_ok($$SELECT * FROM awp.get_run('run_nope')$$, 'AWNTF', NULL, 'get_run of an unknown run is AWNTF');
SELECT results_eq(format($$SELECT revision, status FROM awp.run_revision(%L)$$, :'run'),
                  format($$SELECT revision, status FROM awp.get_run(%L)$$, :'run'),
                  'run_revision: the revision and status get_run shows');
SELECT throws_ok($$SELECT * FROM awp.run_revision('run_nope')$$, 'AWNTF', NULL, 'run_revision of an unknown run is AWNTF');

SELECT results_eq(format($$SELECT task_key, status, attempts, ready_at FROM awp.run_tasks(%L)$$, :'run'),
                  $$VALUES ('a'::text, 'running'::text, 2, NULL::timestamptz), ('b', 'waiting_dependencies', 0, NULL)$$,
                  'run_tasks: definition order, status and attempts made so far');
SELECT throws_ok($$SELECT * FROM awp.run_tasks('run_nope')$$, 'AWNTF', NULL, 'run_tasks of an unknown run is AWNTF');

SELECT results_eq(format($$SELECT attempt, status, worker_id, dispatch_id, started_at, finished_at, output, error_code, error_message
                             FROM awp.task_attempts(%L, 'a')$$, :'run'),
                  format($$VALUES (1, 'failed'::text, %L::text, %L::text, %L::timestamptz, %L::timestamptz, NULL::jsonb, 'e1'::text, 'first'::text),
                                  (2, 'running', %L, %L, %L, NULL, NULL, NULL, NULL)$$,
                         :'w_worker_id', :'l1_dispatch_id', :'t0', :'t1', :'w_worker_id', :'l2_dispatch_id', :'t1'),
                  'task_attempts: every attempt, oldest first, with worker, dispatch, times and error');
SELECT is((SELECT count(*) FROM awp.task_attempts(:'run', 'b')), 0::bigint, 'a task never claimed has no attempts');
SELECT throws_ok(format($$SELECT * FROM awp.task_attempts(%L, 'nope')$$, :'run'), 'AWNTF', NULL, 'an unknown task is AWNTF');
SELECT throws_ok($$SELECT * FROM awp.task_attempts('run_nope', 'a')$$, 'AWNTF', NULL, 'an unknown run is AWNTF');

SELECT tests.event_count(:'run') AS n \gset
SELECT is((SELECT count(*) FROM awp.run_events(:'run')), :'n'::bigint, 'run_events with the default returns every event');
SELECT is(ARRAY(SELECT sequence FROM awp.run_events(:'run', 3)), ARRAY(SELECT g::bigint FROM generate_series(4, :n) g),
          'run_events after a sequence returns the later ones in order');
SELECT is((SELECT count(*) FROM awp.run_events(:'run', :n)), 0::bigint, 'nothing after the last sequence');
SELECT results_eq(format($$SELECT sequence, revision, entity_type, from_status, to_status, reason, occurred_at FROM awp.run_events(%L, 0) LIMIT 1$$, :'run'),
                  format($$VALUES (1::bigint, 1::bigint, 'run'::text, NULL::text, 'pending'::text, 'run started'::text, %L::timestamptz)$$, :'t0'),
                  'an event has sequence, revision, entity, from, to, reason and time');
SELECT throws_ok($$SELECT * FROM awp.run_events('run_nope')$$, 'AWNTF', NULL, 'run_events of an unknown run is AWNTF');

-- list_runs: newest first, keyset paging, filters.
SELECT tests.advance('1 s');
SELECT tests.make_run('wf') AS r2 \gset
SELECT tests.advance('1 s');
SELECT tests.make_run('other') AS r3 \gset
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs()), ARRAY[:'r3', :'r2', :'run'], 'list_runs: newest first');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs(NULL, NULL, NULL, 2)), ARRAY[:'r3', :'r2'], 'a page of 2');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs(NULL, NULL, :'r2', 2)), ARRAY[:'run'], 'the next page after its last run id');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs('wf')), ARRAY[:'r2', :'run'], 'filtered by workflow');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs(NULL, 'running')),
          ARRAY(SELECT run_id FROM awp.runs WHERE status = 'running' ORDER BY created_at DESC, run_id DESC),
          'filtered by status');
SELECT throws_ok($$SELECT * FROM awp.list_runs(NULL, NULL, NULL, 0)$$, 'AWREQ', NULL, 'limit 0 is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.list_runs(NULL, 'bogus')$$, 'AWREQ', NULL, 'an unknown status is AWREQ');

-- Workers: never a token.
SELECT results_eq(format($$SELECT worker_id, display_name, status, executor_kinds, max_concurrency, active_leases FROM awp.get_worker(%L)$$, :'w_worker_id'),
                  format($$VALUES (%L::text, 'reader'::text, 'active'::text, '{mock}'::text[], 4, 1)$$, :'w_worker_id'),
                  'get_worker: the summary with active leases');
SELECT is((SELECT count(*) FROM awp.list_workers()), 1::bigint, 'list_workers lists the worker');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p, unnest(p.proargnames) n
                 WHERE p.pronamespace = 'awp'::regnamespace AND left(p.proname, 1) <> '_'
                   AND p.proname ~ '^(get_|list_|run_|task_)' AND n ~ '(session|lease)_token|token_hash'),
          '{}'::text[], 'no read function has a session/lease token or token hash argument or column');
SELECT is((SELECT count(*) FROM awp.list_workers() w, jsonb_each_text(to_jsonb(w)) e
            WHERE strpos(e.value, :'w_token') > 0 OR strpos(e.value, encode(sha256(convert_to(:'w_token', 'UTF8')), 'hex')) > 0
               OR e.key ~ '(token|hash)'), 0::bigint, 'list_workers shows neither the session token nor its hash');
SELECT throws_ok($$SELECT * FROM awp.get_worker('wkr_nope')$$, 'AWNTF', NULL, 'get_worker of an unknown worker is AWNTF');

SELECT * FROM finish();
ROLLBACK;
