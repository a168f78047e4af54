-- Keyset paging of the list functions: list_workers, list_runs (with after_created_at), run_tasks,
-- list_workflows, workflow_versions, list_schedules. Calls without the new arguments return what they did;
-- pages concatenate to the whole list; rows added while paging do not shift later pages; a cursor whose
-- row was deleted (pruned) still pages on; bad limits and cursors are AWREQ; unknown parents AWNTF.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(31);
SELECT tests.no_history_ranges();   -- row by row at the frozen time (_fixtures.sql.inc)

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset

-- ================================================================ workers (registered_at, worker_id)
SELECT count(*) FROM (SELECT tests.register_worker('w' || g), tests.advance('1 s') FROM generate_series(1, 5) g) x;
SELECT is(ARRAY(SELECT display_name FROM awp.list_workers()), '{w1,w2,w3,w4,w5}', 'list_workers(): every worker, oldest first');
SELECT registered_at AS k_at, worker_id AS k_id FROM awp.list_workers(NULL, NULL, 2) OFFSET 1 \gset
SELECT is(ARRAY(SELECT display_name FROM awp.list_workers(NULL, NULL, 2)), '{w1,w2}', 'a first page of 2');
SELECT tests.register_worker('w6');   -- added while paging: at the end, not in a page already read
SELECT is(ARRAY(SELECT display_name FROM awp.list_workers(:'k_at', :'k_id', 2)), '{w3,w4}', 'the next page after (registered_at, worker_id)');
SELECT is(ARRAY(SELECT display_name FROM awp.list_workers(:'k_at', :'k_id')), '{w3,w4,w5,w6}', 'no limit: the rest');
DELETE FROM awp.workers WHERE worker_id = :'k_id';
SELECT is(ARRAY(SELECT display_name FROM awp.list_workers(:'k_at', :'k_id', 2)), '{w3,w4}', 'the cursor still works once its row is gone');
SELECT throws_ok(format($$SELECT * FROM awp.list_workers(%L, NULL, 2)$$, :'k_at'), 'AWREQ', NULL, 'half a worker cursor is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.list_workers(NULL, NULL, 0)$$, 'AWREQ', NULL, 'limit 0 is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.list_workers(NULL, NULL, 1001)$$, 'AWREQ', NULL, 'limit 1001 is AWREQ');

-- ================================================================ workflows and versions
SELECT tests.make_workflow(id) FROM unnest(ARRAY['wf-c', 'wf-a', 'wf-b']) id;
SELECT tests.make_workflow('wf-a', jsonb_build_array(tests.task('x')));
SELECT tests.make_workflow('wf-a', jsonb_build_array(tests.task('y')));
SELECT is(ARRAY(SELECT workflow_id || ':' || latest_version FROM awp.list_workflows()), '{wf-a:3,wf-b:1,wf-c:1}',
          'list_workflows(): every workflow by id with its latest version');
SELECT is(ARRAY(SELECT workflow_id FROM awp.list_workflows(NULL, 2)), '{wf-a,wf-b}', 'a page of 2');
SELECT is(ARRAY(SELECT workflow_id FROM awp.list_workflows('wf-b', 2)), '{wf-c}', 'the last page');
SELECT is(ARRAY(SELECT workflow_id FROM awp.list_workflows('wf-c', 2)), '{}'::text[], 'past the end: empty');
SELECT is((SELECT updated_at FROM awp.get_workflow('wf-a')), (SELECT max(created_at) FROM awp.workflow_versions WHERE workflow_id = 'wf-a'),
          'get_workflow: updated_at is when the latest version was stored');
SELECT is(ARRAY(SELECT version FROM awp.workflow_versions('wf-a')), '{1,2,3}', 'workflow_versions(id): every version');
SELECT is(ARRAY(SELECT version FROM awp.workflow_versions('wf-a', NULL, 2)), '{1,2}', 'a page of versions');
SELECT is(ARRAY(SELECT version FROM awp.workflow_versions('wf-a', 2, 2)), '{3}', 'the next page after version 2');
SELECT is(ARRAY(SELECT version FROM awp.workflow_versions('wf-a', 3, 2)), '{}'::integer[], 'past the last version: empty, not AWNTF');
SELECT throws_ok($$SELECT * FROM awp.workflow_versions('nope', NULL, 2)$$, 'AWNTF', NULL, 'an unknown workflow is AWNTF');

-- ================================================================ runs (created_at DESC, run_id DESC)
SELECT tests.make_run('wf-b') AS r1 \gset
SELECT tests.advance('1 s');
SELECT tests.make_run('wf-b') AS r2 \gset
SELECT tests.advance('1 s');
SELECT tests.make_run('wf-b') AS r3 \gset
SELECT tests.advance('1 s');
SELECT created_at AS r3_at FROM awp.runs WHERE run_id = :'r3' \gset
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs('wf-b', NULL, :'r3', 10, :'r3_at')), ARRAY[:'r2', :'r1'],
          'list_runs after (created_at, run_id)');
-- A newer run: not in the pages after r3.
SELECT tests.make_run('wf-b') AS r4 \gset
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs('wf-b', NULL, :'r3', 1, :'r3_at')), ARRAY[:'r2'], 'a new run does not shift the next page');
SELECT status FROM awp.request_cancel(:'r3');
SELECT tests.advance('1 hour');
SELECT awp.prune('1 minute');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs('wf-b', NULL, :'r3', 10, :'r3_at')), ARRAY[:'r2', :'r1'],
          'with after_created_at the page follows a cursor run that was pruned');
SELECT is(ARRAY(SELECT run_id FROM awp.list_runs('wf-b', NULL, :'r3', 10)), '{}'::text[],
          'without it (the old call) a pruned cursor run ends the listing');
SELECT throws_ok(format($$SELECT * FROM awp.list_runs(NULL, NULL, NULL, 10, %L)$$, :'r3_at'), 'AWREQ', NULL,
                 'after_created_at without a run id is AWREQ');

-- ================================================================ tasks (definition order)
SELECT tests.make_run('tasks', jsonb_build_array(tests.task('z'), tests.task('m'), tests.task('a', '{z}'), tests.task('q'))) AS rt \gset
SELECT is(ARRAY(SELECT task_key FROM awp.run_tasks(:'rt')), '{z,m,a,q}', 'run_tasks(run): every task in definition order');
SELECT is(ARRAY(SELECT task_key FROM awp.run_tasks(:'rt', NULL, 3)), '{z,m,a}', 'a page of 3');
SELECT is(ARRAY(SELECT task_key FROM awp.run_tasks(:'rt', 'a', 3)), '{q}', 'the page after task a');
SELECT is(ARRAY(SELECT task_key FROM awp.run_tasks(:'rt', 'q', 3)), '{}'::text[], 'after the last task: empty');
SELECT throws_ok(format($$SELECT * FROM awp.run_tasks(%L, 'nope', 3)$$, :'rt'), 'AWREQ', NULL, 'a cursor naming no task of the run is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.run_tasks('run_nope', NULL, 3)$$, 'AWNTF', NULL, 'an unknown run is still AWNTF');

-- ================================================================ schedules (schedule_id)
SELECT count(*) FROM (SELECT awp.create_schedule(id, 'wf-b', interval_ms => 60000) FROM unnest(ARRAY['s-b', 's-a', 's-c']) id) x;
SELECT is(ARRAY(SELECT schedule_id FROM awp.list_schedules()), '{s-a,s-b,s-c}', 'list_schedules(): every schedule by id');
SELECT is(ARRAY(SELECT schedule_id FROM awp.list_schedules('s-a', 1)), '{s-b}', 'a page after s-a');

SELECT * FROM finish();
ROLLBACK;
