-- Dynamic workflows (docs/dynamic.md, db/functions/_dynamic.sql): `when` conditions (skip with condition_false,
-- branch-and-join) and `for_each` (instances created from a dependency's output when it succeeds, their leases'
-- item and item_index, the mapped task's output, empty and invalid lists, an instance failing), on the general
-- path (complete_task), the hot path (complete_and_claim) and the group path (complete_and_claim_many);
-- validation at definition time; the run's invariants after each.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(131);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 50) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 50) \gset w2_
SELECT set_config('tests.w1', :'w1_worker_id', true), set_config('tests.t1', :'w1_token', true);
SELECT set_config('tests.w2', :'w2_worker_id', true), set_config('tests.t2', :'w2_token', true);
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) WITH NO DATA;
ALTER TABLE l ADD COLUMN done boolean NOT NULL DEFAULT false;

-- tests.output_for(outputs, lease): what a task's worker reports: outputs->key when given ({"fail": true}: a
-- permanent failure), for an instance {"item": item, "index": item_index}, else {"ok": true}.
CREATE FUNCTION tests.result_for(p_outputs jsonb, p_key text, p_item jsonb, p_index integer) RETURNS jsonb
LANGUAGE sql AS $$
  SELECT CASE WHEN p_outputs->p_key = '{"fail": true}' THEN '{"kind": "permanent_failure", "error_code": "boom"}'::jsonb
              WHEN p_outputs ? p_key THEN jsonb_build_object('kind', 'success', 'output', p_outputs->p_key)
              WHEN p_index IS NOT NULL THEN jsonb_build_object('kind', 'success', 'output',
                                                              jsonb_build_object('item', p_item, 'index', p_index))
              ELSE '{"kind": "success", "output": {"ok": true}}'::jsonb END
$$;

-- tests.step(run, outputs, mode): one step of work with w1: a coordinator pass, w1 claims what is pending, then
-- completes its oldest open lease of the run: mode 'general' with complete_task, 'hot' with complete_and_claim
-- (1 slot; its refill is kept for a later step), 'group' its oldest two with complete_and_claim_many (one batch).
CREATE FUNCTION tests.step(p_run text, p_outputs jsonb DEFAULT '{}', p_mode text DEFAULT 'general') RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  x record;
  y record;
BEGIN
  PERFORM awp.coordinator_tick();
  INSERT INTO l SELECT c.*, false FROM awp.claim_tasks(current_setting('tests.w1'), current_setting('tests.t1'),
    (SELECT 50 - count(*) FROM awp.dispatches d WHERE d.worker_id = current_setting('tests.w1') AND d.status = 'leased')::integer) c
   WHERE (SELECT count(*) FROM awp.dispatches d WHERE d.worker_id = current_setting('tests.w1') AND d.status = 'leased') < 50;
  SELECT * INTO x FROM l WHERE NOT l.done AND l.run_id = p_run ORDER BY l.dispatch_id LIMIT 1;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tests.step: nothing to work on, tasks %', tests.task_statuses(p_run);
  END IF;
  IF p_mode = 'group' THEN   -- FOUND: a second lease
    SELECT * INTO y FROM l WHERE NOT l.done AND l.run_id = p_run AND l.dispatch_id > x.dispatch_id
     ORDER BY l.dispatch_id LIMIT 1;
  END IF;
  IF p_mode = 'group' AND FOUND THEN
    UPDATE l SET done = true WHERE l.dispatch_id IN (x.dispatch_id, y.dispatch_id);
    INSERT INTO l SELECT (m.lease).*, false FROM awp.complete_and_claim_many(jsonb_build_array(
      jsonb_build_object('worker_id', current_setting('tests.w1'), 'session_token', current_setting('tests.t1'),
                         'dispatch_id', x.dispatch_id, 'lease_token', x.lease_token, 'slots', 1,
                         'result', tests.result_for(p_outputs, x.task_key, x.item, x.item_index)),
      jsonb_build_object('worker_id', current_setting('tests.w1'), 'session_token', current_setting('tests.t1'),
                         'dispatch_id', y.dispatch_id, 'lease_token', y.lease_token, 'slots', 1,
                         'result', tests.result_for(p_outputs, y.task_key, y.item, y.item_index)))) m
     WHERE (m.lease).dispatch_id IS NOT NULL;
  ELSIF p_mode IN ('hot', 'group') THEN
    UPDATE l SET done = true WHERE l.dispatch_id = x.dispatch_id;
    INSERT INTO l SELECT c.*, false FROM awp.complete_and_claim(current_setting('tests.w1'), current_setting('tests.t1'),
      x.dispatch_id, x.lease_token, tests.result_for(p_outputs, x.task_key, x.item, x.item_index), 1) c;
  ELSE
    UPDATE l SET done = true WHERE l.dispatch_id = x.dispatch_id;
    PERFORM awp.complete_task(current_setting('tests.w1'), current_setting('tests.t1'), x.dispatch_id, x.lease_token,
                              tests.result_for(p_outputs, x.task_key, x.item, x.item_index));
  END IF;
  PERFORM tests.end_tx();
END $$;

-- tests.drive(run, outputs, mode): tests.step until the run ends; returns its status.
CREATE FUNCTION tests.drive(p_run text, p_outputs jsonb DEFAULT '{}', p_mode text DEFAULT 'general') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  n integer := 0;
BEGIN
  WHILE (SELECT status FROM awp.runs WHERE run_id = p_run) IN ('pending', 'running') LOOP
    n := n + 1;
    IF n > 500 THEN RAISE EXCEPTION 'tests.drive: no end'; END IF;
    PERFORM tests.step(p_run, p_outputs, p_mode);
  END LOOP;
  RETURN (SELECT status FROM awp.runs WHERE run_id = p_run);
END $$;



-- ================================================================ validation
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{}', '{"for_each": "a"}'))))$$),
          'tasks[1] (key b): for_each names a, which is not one of its dependencies (depends_on)',
          'for_each must name a dependency');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('c'), tests.task('b', '{c}', '{"when": {"task": "a", "equals": 1}}'))))$$),
          'tasks[2] (key b): when.task names a, which is not one of its dependencies (depends_on)',
          'when must name a dependency');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"when": {"task": "a"}}'))))$$),
          'tasks[1] (key b): when needs exactly one of equals and not_equals', 'when without equals');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"when": {"task": "a", "equals": 1, "not_equals": 2}}'))))$$),
          'tasks[1] (key b): when needs exactly one of equals and not_equals', 'when with both');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"when": {"task": "a", "path": "x", "equals": 1}}'))))$$),
          'tasks[1] (key b): when.path must be an array of at most 32 object keys (strings) or array indexes (integers from 0 to 100000)',
          'when.path must be an array');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"when": {"task": "a", "equals": 1, "eq": 1}}'))))$$),
          'tasks[1] (key b): when has unknown fields (allowed: task, path, equals, not_equals)', 'when: unknown fields');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"max_items": 5}'))))$$),
          'tasks[1] (key b): max_items needs for_each', 'max_items without for_each');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"for_each": "a", "max_items": 10001}'))))$$),
          'tasks[1] (key b): max_items must be an integer from 1 to 10000', 'max_items at most 10,000');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a[0]'))))$$),
          'tasks[0] (key a[0]): key must not end in [<number>]: such keys name the instances of a for_each task',
          'a key cannot look like an instance''s');
SELECT lives_ok($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a'), tests.task('b', '{a}', '{"for_each": "a", "max_items": 10000, "when": {"task": "a", "path": ["x", 0], "not_equals": null}}'))))$$,
          'for_each, max_items and when together are valid');

-- ================================================================ when: branch and join
SELECT tests.make_workflow('branch', jsonb_build_array(
         tests.task('classify'),
         tests.task('urgent', '{classify}', '{"when": {"task": "classify", "path": ["label"], "equals": "urgent"}}'),
         tests.task('normal', '{classify}', '{"when": {"task": "classify", "path": ["label"], "not_equals": "urgent"}}'),
         tests.task('after-urgent', '{urgent}'),
         tests.task('join', '{after-urgent,normal}')));
SELECT awp.start_run('branch') AS run \gset
SELECT is(tests.drive(:'run', '{"classify": {"label": "normal"}, "normal": {"n": 1}}'), 'succeeded',
          'a run with a branch skipped by its condition succeeds');
SELECT is(tests.task_statuses(:'run'),
          '{classify=succeeded,urgent=skipped,normal=succeeded,after-urgent=succeeded,join=succeeded}',
          'the false branch is skipped, its dependant runs (the skip counts as done), the join runs');
SELECT is((SELECT skip_reason FROM awp.run_tasks(:'run') WHERE task_key = 'urgent'), 'condition_false',
          'run_tasks gives skip_reason condition_false');
SELECT is(tests.events_of(:'run', 'urgent'),
          '{"created->waiting_dependencies (task created)","waiting_dependencies->skipped (condition_false)"}',
          'the skipped task''s events: reason condition_false');
SELECT is(tests.events_of(:'run', 'normal'),
          '{"created->waiting_dependencies (task created)","waiting_dependencies->ready (condition holds)","ready->queued (dispatch created)","queued->running (attempt 1 started)","running->succeeded (success)"}',
          'the true branch becomes ready when its condition holds');
SELECT is((SELECT upstream FROM l WHERE run_id = :'run' AND task_key = 'after-urgent'), '{"urgent": null}'::jsonb,
          'a dependant of a skipped task receives null for it in upstream');
SELECT is((SELECT upstream FROM l WHERE run_id = :'run' AND task_key = 'join'), '{"after-urgent": {"ok": true}, "normal": {"n": 1}}'::jsonb,
          'the join receives both branches');
SELECT is((SELECT output FROM awp.get_run(:'run')), '{"join": {"ok": true}}'::jsonb, 'the run''s output');
SELECT ok(tests.ok_run(:'run'), 'invariants hold, events contiguous (branch)');

-- The other branch, on the hot path.
SELECT awp.start_run('branch') AS run2 \gset
SELECT is(tests.drive(:'run2', '{"classify": {"label": "urgent"}}', 'hot'), 'succeeded', 'the urgent branch (hot path)');
SELECT is(tests.task_statuses(:'run2'),
          '{classify=succeeded,urgent=succeeded,normal=skipped,after-urgent=succeeded,join=succeeded}',
          'not_equals false: normal skipped');
SELECT ok(tests.ok_run(:'run2'), 'invariants hold (hot path)');

-- A condition on a missing path compares JSON null; a skipped leaf: the run's output maps it to null.
SELECT tests.make_workflow('leafskip', jsonb_build_array(
         tests.task('a'), tests.task('b', '{a}', '{"when": {"task": "a", "path": ["no", "such"], "equals": 1}}'),
         tests.task('c', '{a}', '{"when": {"task": "a", "path": ["no"], "equals": null}}')));
SELECT awp.start_run('leafskip') AS run3 \gset
SELECT is(tests.drive(:'run3'), 'succeeded', 'a run whose only leaves are skipped or conditional succeeds');
SELECT is(tests.task_statuses(:'run3'), '{a=succeeded,b=skipped,c=succeeded}', 'a missing path is JSON null');
SELECT is((SELECT output FROM awp.get_run(:'run3')), '{"b": null, "c": {"ok": true}}'::jsonb, 'a skipped leaf is null in the run output');

-- A failed dependency still skips (dependency_failed), the run fails.
SELECT awp.start_run('branch') AS run4 \gset
SELECT is(tests.drive(:'run4', '{"classify": {"fail": true}}'), 'failed', 'a failed dependency fails the run');
SELECT is(tests.task_statuses(:'run4'),
          '{classify=failed,urgent=skipped,normal=skipped,after-urgent=skipped,join=skipped}', 'its dependants skipped');
SELECT is((SELECT array_agg(DISTINCT skip_reason) FROM awp.run_tasks(:'run4') WHERE status = 'skipped'),
          '{dependency_failed}', 'skip_reason dependency_failed');

-- ================================================================ for_each
SELECT tests.make_workflow('fan', jsonb_build_array(
         tests.task('split'),
         tests.task('each', '{split}', '{"for_each": "split", "input": {"model": "m"}, "retry": {"max_attempts": 2, "interval_ms": 0}}'),
         tests.task('merge', '{each}')), 3);
SELECT awp.start_run('fan') AS frun \gset
SELECT tests.step(:'frun', '{"split": ["x", {"y": 2}, 3]}', 'hot');
SELECT is(tests.task_statuses(:'frun'),
          '{split=succeeded,each=waiting_dependencies,merge=waiting_dependencies,each[0]=running,each[1]=ready,each[2]=ready}',
          'split''s output [x, {y: 2}, 3]: three instances after the run''s other tasks, the first leased at once to the completing worker');
SELECT results_eq($$SELECT task_key, mapped_task, item_index, item_count, instances_succeeded FROM awp.run_tasks('$$ || :'frun' || $$')$$,
                  $$VALUES ('split', NULL, NULL::integer, NULL::integer, NULL::integer), ('each', NULL, NULL, 3, 0),
                           ('merge', NULL, NULL, NULL, NULL), ('each[0]', 'each', 0, NULL, NULL),
                           ('each[1]', 'each', 1, NULL, NULL), ('each[2]', 'each', 2, NULL, NULL)$$,
                  'run_tasks: instances name their mapped task and index; the mapped task counts them');
SELECT is(tests.events_of(:'frun', 'each[1]'), '{"created->ready (for_each instance of each)"}', 'an instance''s creation event');
SELECT is((SELECT pending_deps FROM awp.tasks WHERE run_id = :'frun' AND task_key = 'each'), 3,
          'the mapped task waits for its three instances');
SELECT is((SELECT unfinished_tasks FROM awp.runs WHERE run_id = :'frun'), 5, 'unfinished: each, merge and three instances');
SELECT ok(tests.ok_run(:'frun'), 'invariants hold after the expansion');
SELECT tests.step(:'frun', '{}', 'hot');
SELECT results_eq($$SELECT task_key, item, item_index, input FROM l WHERE run_id = '$$ || :'frun' || $$' AND task_key LIKE 'each[%' ORDER BY item_index$$,
                  $$VALUES ('each[0]', '"x"'::jsonb, 0, '{"model": "m"}'::jsonb), ('each[1]', '{"y": 2}', 1, '{"model": "m"}'),
                           ('each[2]', '3', 2, '{"model": "m"}')$$,
                  'each instance''s lease carries its item, item_index and the task''s input (claim and refill)');
SELECT is((SELECT upstream FROM l WHERE run_id = :'frun' AND task_key = 'each[0]'), '{}'::jsonb,
          'an instance''s upstream leaves the list out (its element is item)');
SELECT is(tests.drive(:'frun', '{}', 'hot'), 'succeeded', 'the run succeeds once every instance and merge did');
SELECT is((SELECT output FROM awp.get_task(:'frun', 'each')),
          '[{"item": "x", "index": 0}, {"item": {"y": 2}, "index": 1}, {"item": 3, "index": 2}]'::jsonb,
          'the mapped task''s output: its instances'' outputs in index order');
SELECT is((SELECT upstream FROM l WHERE run_id = :'frun' AND task_key = 'merge'),
          '{"each": [{"item": "x", "index": 0}, {"item": {"y": 2}, "index": 1}, {"item": 3, "index": 2}]}'::jsonb,
          'merge receives the array as upstream["each"]');
SELECT is(tests.events_of(:'frun', 'each'),
          '{"created->waiting_dependencies (task created)","waiting_dependencies->succeeded (every instance succeeded)"}',
          'the mapped task''s events');
SELECT is((SELECT instances_succeeded FROM awp.run_tasks(:'frun') WHERE task_key = 'each'), 3, 'instances_succeeded 3');
SELECT is((SELECT task_counts FROM awp.get_run(:'frun')), '{"succeeded": 6}'::jsonb, 'task counts include the instances');
SELECT ok(tests.ok_run(:'frun'), 'invariants hold (for_each, hot path)');

-- Run concurrency (3) and wait reasons apply to instances.
SELECT awp.start_run('fan') AS krun \gset
SELECT tests.step(:'krun', '{"split": [1, 2, 3, 4, 5]}');
SELECT awp.coordinator_tick();
SELECT is((SELECT count(*) FROM awp.tasks WHERE run_id = :'krun' AND status IN ('queued', 'running')), 3::bigint,
          'three instances in flight: the run''s concurrency');
SELECT is((SELECT array_agg(task_key || ':' || wait_reason ORDER BY task_key) FROM awp.run_tasks(:'krun') WHERE status = 'ready'),
          '{each[3]:run_concurrency,each[4]:run_concurrency}', 'the other instances wait for run_concurrency');
SELECT results_eq($$SELECT wait_reason, wait_detail FROM awp.run_tasks('$$ || :'krun' || $$') WHERE task_key = 'each'$$,
                  $$VALUES ('waiting_dependencies', 'waiting for its 5 instances (for_each over split): 5 of them not yet succeeded')$$,
                  'the mapped task waits for its instances, and says so');
SELECT is(tests.drive(:'krun'), 'succeeded', 'all five instances run');

-- The group path and the general path.
SELECT awp.start_run('fan') AS grun \gset
SELECT is(tests.drive(:'grun', '{"split": [1, 2, 3, 4, 5]}', 'group'), 'succeeded', 'for_each over five items (group path)');
SELECT is((SELECT output FROM awp.get_task(:'grun', 'each')),
          (SELECT jsonb_agg(jsonb_build_object('item', g, 'index', g - 1) ORDER BY g) FROM generate_series(1, 5) g),
          'the mapped output in index order (group path)');
SELECT ok(tests.ok_run(:'grun'), 'invariants hold (group path)');
SELECT awp.start_run('fan') AS prun \gset
SELECT is(tests.drive(:'prun', '{"split": [1, 2]}', 'general'), 'succeeded', 'for_each (general path)');
SELECT ok(tests.ok_run(:'prun'), 'invariants hold (general path)');

-- An empty list: the mapped task succeeds at once with [].
SELECT awp.start_run('fan') AS erun \gset
SELECT is(tests.drive(:'erun', '{"split": []}'), 'succeeded', 'for_each over [] succeeds');
SELECT is(tests.task_statuses(:'erun'), '{split=succeeded,each=succeeded,merge=succeeded}', 'no instance; merge runs');
SELECT is((SELECT output FROM awp.get_task(:'erun', 'each')), '[]'::jsonb, 'the mapped output is []');
SELECT is((SELECT upstream FROM l WHERE run_id = :'erun' AND task_key = 'merge'), '{"each": []}'::jsonb, 'merge receives []');
SELECT is(tests.events_of(:'erun', 'each'),
          '{"created->waiting_dependencies (task created)","waiting_dependencies->succeeded (for_each over an empty list)"}',
          'its events');
SELECT ok(tests.ok_run(:'erun'), 'invariants hold (empty)');

-- Not an array; too many elements: for_each_invalid, nothing created, dependants skipped, the run fails.
SELECT awp.start_run('fan') AS irun \gset
SELECT is(tests.drive(:'irun', '{"split": {"not": "a list"}}'), 'failed', 'a for_each over an object fails the run');
SELECT is(tests.task_statuses(:'irun'), '{split=succeeded,each=failed,merge=skipped}', 'no instance created; merge skipped');
SELECT results_eq($$SELECT error_code, error_message FROM awp.get_task('$$ || :'irun' || $$', 'each')$$,
                  $$VALUES ('for_each_invalid', 'for_each: the output of split is a JSON object, not an array')$$,
                  'error code for_each_invalid and a message that says why');
SELECT ok(tests.ok_run(:'irun'), 'invariants hold (invalid)');
SELECT tests.make_workflow('fan2', jsonb_build_array(
         tests.task('split'), tests.task('each', '{split}', '{"for_each": "split", "max_items": 2}')));
SELECT awp.start_run('fan2') AS mrun \gset
SELECT is(tests.drive(:'mrun', '{"split": [1, 2, 3]}'), 'failed', 'over max_items fails the run');
SELECT results_eq($$SELECT error_code, error_message FROM awp.get_task('$$ || :'mrun' || $$', 'each')$$,
                  $$VALUES ('for_each_invalid', 'for_each: the output of split has 3 elements, over max_items 2')$$,
                  'the message names the count and max_items');
SELECT is((SELECT count(*) FROM awp.tasks WHERE run_id = :'mrun'), 2::bigint, 'nothing half-created');
SELECT awp.start_run('fan2') AS m2run \gset
SELECT is(tests.drive(:'m2run', '{"split": [1, 2]}'), 'succeeded', 'exactly max_items is accepted');

-- An instance that fails for good fails its mapped task; the dependants are skipped; the run fails.
SELECT awp.start_run('fan') AS xrun \gset
SELECT is(tests.drive(:'xrun', '{"split": ["a", "b"], "each[1]": {"fail": true}}'), 'failed', 'an instance failing fails the run');
SELECT is(tests.task_statuses(:'xrun'),
          '{split=succeeded,each=failed,merge=skipped,each[0]=succeeded,each[1]=failed}',
          'the mapped task failed, merge skipped, the other instance ran');
SELECT results_eq($$SELECT error_code, error_message FROM awp.get_task('$$ || :'xrun' || $$', 'each')$$,
                  $$VALUES ('instance_failed', 'instance each[1] failed')$$, 'error instance_failed');
SELECT ok(tests.ok_run(:'xrun'), 'invariants hold (an instance failed)');

-- A retry of an instance: the instance retries on its own (max_attempts 2 from the task).
SELECT awp.start_run('fan') AS rrun \gset
SELECT tests.step(:'rrun', '{"split": ["only"]}');
SELECT tests.step(:'rrun', '{"each[0]": {"fail": true}}');
SELECT is(tests.task_status(:'rrun', 'each[0]'), 'failed', 'a permanent failure does not retry');
SELECT awp.start_run('fan') AS r2run \gset
SELECT tests.step(:'r2run', '{"split": ["only"]}');
SELECT tests.step(:'r2run');
SELECT is(tests.task_status(:'r2run', 'each[0]'), 'succeeded', 'the instance ran');

-- Cancel: instances are canceled with the run.
SELECT awp.start_run('fan') AS crun \gset
SELECT tests.step(:'crun', '{"split": [1, 2, 3, 4]}');
SELECT ok((SELECT count(*) FROM awp.tasks WHERE run_id = :'crun' AND mapped_task = 'each') = 4, 'four instances');
SELECT awp.request_cancel(:'crun');
SELECT awp.coordinator_tick();
SELECT is(tests.run_status(:'crun'), 'canceled', 'the run is canceled');
SELECT is((SELECT array_agg(DISTINCT status) FROM awp.tasks WHERE run_id = :'crun' AND status <> 'succeeded'), '{canceled}',
          'the mapped task and its instances are canceled');
SELECT ok(tests.ok_run(:'crun'), 'invariants hold (canceled)');

-- when together with for_each: the condition first.
SELECT tests.make_workflow('fan3', jsonb_build_array(
         tests.task('split'),
         tests.task('each', '{split}', '{"for_each": "split", "when": {"task": "split", "path": [0], "equals": "go"}}'),
         tests.task('after', '{each}')));
SELECT awp.start_run('fan3') AS wrun \gset
SELECT is(tests.drive(:'wrun', '{"split": ["stop", 1]}'), 'succeeded', 'a for_each whose condition is false');
SELECT is(tests.task_statuses(:'wrun'), '{split=succeeded,each=skipped,after=succeeded}', 'skipped without instances');
SELECT is((SELECT upstream FROM l WHERE run_id = :'wrun' AND task_key = 'after'), '{"each": null}'::jsonb, 'after receives null');
SELECT awp.start_run('fan3') AS w2run \gset
SELECT is(tests.drive(:'w2run', '{"split": ["go", 1]}'), 'succeeded', 'a for_each whose condition holds');
SELECT is((SELECT item_count FROM awp.tasks WHERE run_id = :'w2run' AND task_key = 'each'), 2, 'two instances');

-- The new invariant catches a broken shape.
SELECT is_empty($$SELECT * FROM awp.check_invariants() WHERE invariant = 'for_each_instances'$$, 'no for_each_instances violation');
UPDATE awp.tasks SET item_count = 4 WHERE run_id = :'w2run' AND task_key = 'each';
SELECT is((SELECT array_agg(entity_key) FROM awp.check_invariants(ARRAY[:'w2run']) WHERE invariant = 'for_each_instances'),
          '{each}', 'for_each_instances: item_count without its instances');

-- ================================================================ child runs
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            jsonb_build_object('key', 'sub', 'executor', 'workflow', 'input', '{"workflow": "kid"}'::jsonb))))$$),
          'tasks[0] (key sub): input of a workflow task has unknown fields (allowed: workflow_id, version, run_input)',
          'a workflow task''s input is checked');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            jsonb_build_object('key', 'sub', 'executor', 'workflow'))))$$),
          'tasks[0] (key sub): a task of executor workflow needs an input {"workflow_id", "version", "run_input"}',
          'a workflow task needs an input');
SELECT throws_ok($$SELECT awp.register_worker('w', '{workflow}', 1)$$, 'AWREQ', NULL, 'no worker may offer executor workflow');
SELECT tests.make_workflow('kid', jsonb_build_array(tests.task('k1', '{}', '{"retry": {"max_attempts": 1}}')));
SELECT tests.make_workflow('parent', jsonb_build_array(
         tests.task('prep'),
         jsonb_build_object('key', 'sub', 'executor', 'workflow', 'depends_on', '["prep"]'::jsonb,
                            'input', '{"workflow_id": "kid"}'::jsonb, 'retry', '{"max_attempts": 2, "interval_ms": 0}'::jsonb),
         tests.task('after', '{sub}')));
SELECT awp.start_run('parent') AS prun1 \gset
SELECT tests.step(:'prun1', '{"prep": {"doc": 7}}', 'hot');
SELECT is(tests.task_status(:'prun1', 'sub'), 'running', 'prep done: the child-run task runs');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'prun1') WHERE task_key = 'sub') AS kid1 \gset
SELECT results_eq($$SELECT workflow_id, parent_run_id, parent_task_key, depth, input FROM awp.get_run('$$ || :'kid1' || $$')$$,
                  $$VALUES ('kid', '$$ || :'prun1' || $$', 'sub', 1, '{"prep": {"doc": 7}}'::jsonb)$$,
                  'the child: its workflow, parent run and task, depth 1, and the task''s upstream as input');
SELECT is(tests.events_of(:'prun1', 'sub'),
          ARRAY['created->waiting_dependencies (task created)', 'waiting_dependencies->ready (dependencies succeeded)',
                'ready->running (child run ' || :'kid1' || ' started)'],
          'its events: ready -> running when the child starts');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'prun1' AND task_key = 'sub'), 0::bigint, 'no dispatch for it');
SELECT is((SELECT wait_reason FROM awp.run_tasks(:'prun1') WHERE task_key = 'after'), 'waiting_dependencies', 'after waits');
SELECT ok(tests.ok_run(:'prun1') AND tests.ok_run(:'kid1'), 'invariants hold while the child runs');
SELECT is(tests.drive(:'kid1', '{"k1": {"summary": "ok"}}'), 'succeeded', 'the child runs on the workers and succeeds');
SELECT is(tests.task_status(:'prun1', 'sub'), 'running', 'the parent''s task waits for a coordinator pass');
SELECT is((awp.coordinator_tick())->'children', '1'::jsonb, 'the pass settles it');
SELECT is(tests.task_status(:'prun1', 'sub'), 'succeeded', 'the child-run task succeeded');
SELECT is((SELECT output FROM awp.get_task(:'prun1', 'sub')), '{"k1": {"summary": "ok"}}'::jsonb, 'with the child''s output');
SELECT is(tests.drive(:'prun1'), 'succeeded', 'the parent run succeeds');
SELECT is((SELECT upstream FROM l WHERE run_id = :'prun1' AND task_key = 'after'), '{"sub": {"k1": {"summary": "ok"}}}'::jsonb,
          'after receives the child''s output as upstream["sub"]');
SELECT ok(tests.ok_run(:'prun1') AND tests.ok_run(:'kid1'), 'invariants hold (child succeeded)');

-- A child that fails: the attempt fails (child_run_failed); the retry starts a new child.
SELECT awp.start_run('parent') AS prun2 \gset
SELECT tests.step(:'prun2');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'prun2') WHERE task_key = 'sub') AS kid2 \gset
SELECT is(tests.drive(:'kid2', '{"k1": {"fail": true}}'), 'failed', 'the first child fails');
SELECT awp.coordinator_tick();
SELECT awp.coordinator_tick();
SELECT isnt((SELECT child_run_id FROM awp.run_tasks(:'prun2') WHERE task_key = 'sub'), :'kid2', 'the retry started a new child');
SELECT results_eq($$SELECT status, attempts FROM awp.run_tasks('$$ || :'prun2' || $$') WHERE task_key = 'sub'$$,
                  $$VALUES ('running', 2)$$, 'attempt 2 runs');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'prun2') WHERE task_key = 'sub') AS kid3 \gset
SELECT is(tests.drive(:'kid3', '{"k1": {"fail": true}}'), 'failed', 'the second child fails too');
SELECT awp.coordinator_tick();
SELECT results_eq($$SELECT status, error_code, error_message FROM awp.get_task('$$ || :'prun2' || $$', 'sub')$$,
                  $$VALUES ('failed', 'child_run_failed', 'child run $$ || :'kid3' || $$ failed')$$,
                  'no attempt left: the task fails with child_run_failed');
SELECT is(tests.run_status(:'prun2'), 'failed', 'the parent run fails');
SELECT ok(tests.ok_run(:'prun2'), 'invariants hold (child failed)');

-- An unknown workflow: the attempt fails with not_found at once.
SELECT tests.make_workflow('orphan', jsonb_build_array(
         jsonb_build_object('key', 'sub', 'executor', 'workflow', 'input', '{"workflow_id": "nope"}'::jsonb)));
SELECT awp.start_run('orphan') AS orun \gset
SELECT results_eq($$SELECT status, error_code, error_message FROM awp.get_task('$$ || :'orun' || $$', 'sub')$$,
                  $$VALUES ('failed', 'not_found', 'the child run could not start: no workflow nope')$$,
                  'an unknown target fails with not_found');
SELECT is(tests.run_status(:'orun'), 'failed', 'its run fails');

-- A workflow that contains itself: allowed through the depth limit of 10.
SELECT tests.make_workflow('rec', jsonb_build_array(
         jsonb_build_object('key', 'again', 'executor', 'workflow', 'input', '{"workflow_id": "rec", "run_input": {}}'::jsonb)));
SELECT awp.start_run('rec') AS rrun \gset
SELECT is((SELECT array_agg(depth ORDER BY depth) FROM awp.runs WHERE workflow_id = 'rec'), ARRAY[0,1,2,3,4,5,6,7,8,9,10],
          'eleven nested runs, depths 0-10');
SELECT results_eq($$SELECT error_code FROM awp.get_task((SELECT run_id FROM awp.runs WHERE workflow_id = 'rec' AND depth = 10), 'again')$$,
                  $$VALUES ('invalid_request')$$, 'the deepest task fails: invalid_request (the depth limit)');
CREATE FUNCTION tests.ticks_until_done(p_run text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE n integer := 0;
BEGIN
  WHILE tests.run_status(p_run) IN ('pending', 'running') AND n < 30 LOOP
    PERFORM awp.coordinator_tick();
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;
SELECT cmp_ok(tests.ticks_until_done(:'rrun'), '<', 30, 'the failure climbs the levels, one per pass');
SELECT is(tests.run_status(:'rrun'), 'failed', 'the outermost run fails');
SELECT is_empty($$SELECT * FROM awp.check_invariants((SELECT array_agg(run_id) FROM awp.runs WHERE workflow_id = 'rec'))$$,
                'invariants hold (nested)');

-- Canceling the parent cancels the child.
SELECT awp.start_run('parent') AS prun3 \gset
SELECT tests.step(:'prun3');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'prun3') WHERE task_key = 'sub') AS kid4 \gset
SELECT awp.request_cancel(:'prun3');
SELECT is(ARRAY[tests.run_status(:'prun3'), tests.run_status(:'kid4')], '{canceled,canceled}', 'parent and child canceled');
SELECT is(tests.task_status(:'prun3', 'sub'), 'canceled', 'the child-run task canceled');
SELECT ok(tests.ok_run(:'prun3') AND tests.ok_run(:'kid4'), 'invariants hold (parent canceled)');

-- Canceling the child alone fails the parent's attempt (child_run_failed; max_attempts 2: a new child).
SELECT awp.start_run('parent') AS prun4 \gset
SELECT tests.step(:'prun4');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'prun4') WHERE task_key = 'sub') AS kid5 \gset
SELECT awp.request_cancel(:'kid5');
SELECT awp.coordinator_tick();
SELECT is((SELECT reason FROM awp.events WHERE run_id = :'prun4' AND entity_key = 'sub' AND to_status = 'waiting_retry'),
          'child_run_failed', 'a canceled child fails the attempt (child_run_failed)');

-- The group path counts instances down once per group (called directly: it must apply, or this raises).
SELECT count(*) FROM awp.runs r, LATERAL awp.request_cancel(r.run_id) c WHERE r.status IN ('pending', 'running');   -- nothing else pending
SELECT awp.coordinator_tick();
SELECT tests.make_workflow('fan4', jsonb_build_array(
         tests.task('split'), tests.task('each', '{split}', '{"for_each": "split"}')), 2);
SELECT awp.start_run('fan4') AS g4run \gset
SELECT tests.step(:'g4run', '{"split": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}');
SELECT awp.coordinator_tick();
SELECT c.dispatch_id AS g4d1, c.lease_token AS g4t1 FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) c \gset
SELECT c.dispatch_id AS g4d2, c.lease_token AS g4t2 FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 1) c \gset
SELECT jsonb_build_array(
         jsonb_build_object('worker_id', :'w1_worker_id', 'session_token', :'w1_token', 'dispatch_id', :'g4d1',
                            'lease_token', :'g4t1', 'result', '{"kind": "success", "output": 1}'::jsonb, 'slots', 1,
                            'claim_seq', NULL),
         jsonb_build_object('worker_id', :'w2_worker_id', 'session_token', :'w2_token', 'dispatch_id', :'g4d2',
                            'lease_token', :'g4t2', 'result', '{"kind": "success", "output": 2}'::jsonb, 'slots', 1,
                            'claim_seq', NULL)) AS g4items \gset
SELECT is(jsonb_array_length(:'g4items'), 2, 'two instances leased, nothing pending');
CREATE TEMP TABLE g4 AS SELECT g.item AS pos, (g.lease).* FROM awp._complete_and_refill_group(:'g4items') g;
SELECT is((SELECT array_agg(task_key ORDER BY task_key) FROM g4), '{each[2],each[3]}', 'each refilled with the next instance');
SELECT is((SELECT pending_deps FROM awp.tasks WHERE run_id = :'g4run' AND task_key = 'each'), 8,
          'the group path counted both instances down (10 -> 8)');
SELECT tests.end_tx();
SELECT awp.complete_task(:'w1_worker_id', :'w1_token', dispatch_id, lease_token, '{"kind": "success"}') FROM g4 WHERE pos = 1;
SELECT awp.complete_task(:'w2_worker_id', :'w2_token', dispatch_id, lease_token, '{"kind": "success"}') FROM g4 WHERE pos = 2;
SELECT tests.end_tx();
SELECT is(tests.drive(:'g4run', '{}', 'group'), 'succeeded', 'and the run ends');
SELECT ok(tests.ok_run(:'g4run'), 'invariants hold (group countdown)');

-- Child runs within the run's concurrency: concurrency 1, two child-run tasks: one child at a time.
SELECT tests.make_workflow('twokids', jsonb_build_array(
         jsonb_build_object('key', 'k1', 'executor', 'workflow', 'input', '{"workflow_id": "kid"}'::jsonb),
         jsonb_build_object('key', 'k2', 'executor', 'workflow', 'input', '{"workflow_id": "kid"}'::jsonb)), 1);
SELECT awp.start_run('twokids') AS tk \gset
SELECT is(tests.task_statuses(:'tk'), '{k1=running,k2=ready}', 'concurrency 1: one child at a time');
SELECT is((SELECT wait_reason FROM awp.run_tasks(:'tk') WHERE task_key = 'k2'), 'run_concurrency',
          'the other waits for run_concurrency');
SELECT (SELECT child_run_id FROM awp.run_tasks(:'tk') WHERE task_key = 'k1') AS tk1 \gset
SELECT is(tests.drive(:'tk1'), 'succeeded', 'the first child runs');
SELECT awp.coordinator_tick();
SELECT is(tests.task_statuses(:'tk'), '{k1=succeeded,k2=running}', 'the pass settles it and starts the second');
SELECT ok(tests.ok_run(:'tk'), 'invariants hold (children within concurrency)');

-- The mapped task's output is bounded like an upstream (1 MiB): 20 instance outputs of 60,000 characters.
SELECT tests.make_workflow('fanbig', jsonb_build_array(
         tests.task('split'), tests.task('each', '{split}', '{"for_each": "split"}')), 10);
SELECT awp.start_run('fanbig') AS bigrun \gset
SELECT is(tests.drive(:'bigrun', jsonb_build_object('split', (SELECT jsonb_agg(g) FROM generate_series(1, 20) g))
                                 || (SELECT jsonb_object_agg('each[' || g || ']', repeat('x', 60000)) FROM generate_series(0, 19) g)),
          'failed', 'outputs over 1 MiB in all fail the run');
SELECT results_eq($$SELECT status, error_code FROM awp.get_task('$$ || :'bigrun' || $$', 'each')$$,
                  $$VALUES ('failed', 'for_each_output_too_large')$$, 'the mapped task fails with for_each_output_too_large');
SELECT ok(tests.ok_run(:'bigrun'), 'invariants hold (output too large)');

SELECT * FROM finish();
ROLLBACK;
