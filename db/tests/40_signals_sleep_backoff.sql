-- Waiting without a worker (docs/waits.md, db/functions/send_signal.sql): signal tasks (awp.send_signal, its
-- idempotency, its errors, the timeout with the retry policy, cancel), sleep tasks (sleep_ms, until), and backoff
-- between retries (db/functions/_task_outcome.sql, awp._retry_wait); with the frozen clock, edges pinned exactly.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(59);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
-- tests.finish(run, key, kind): w1 claims what is pending and completes the task's lease (kind: a result kind).
CREATE FUNCTION tests.finish(p_run text, p_key text, p_kind text DEFAULT 'success', p_output jsonb DEFAULT '{"ok": true}')
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  l record;
BEGIN
  PERFORM awp.coordinator_tick();
  SELECT d.dispatch_id, d.attempt INTO l FROM awp.dispatches d
   WHERE d.run_id = p_run AND d.task_key = p_key AND d.status = 'pending';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tests.finish: no pending dispatch for %', p_key;
  END IF;
  FOR l IN SELECT * FROM awp.claim_tasks(current_setting('tests.w'), current_setting('tests.t'), 10) c
            WHERE c.run_id = p_run AND c.task_key = p_key LOOP
    RETURN awp.complete_task(current_setting('tests.w'), current_setting('tests.t'), l.dispatch_id, l.lease_token,
                             tests.result(p_kind, p_output, CASE WHEN p_kind <> 'success' THEN 'boom' END));
  END LOOP;
  RAISE EXCEPTION 'tests.finish: % not leased', p_key;
END $$;
SELECT set_config('tests.w', :'w1_worker_id', true), set_config('tests.t', :'w1_token', true);
CREATE FUNCTION tests.signal_task(p_key text, p_deps text[], p_input jsonb DEFAULT '{}', p_retry jsonb DEFAULT '{}')
RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('key', p_key, 'executor', 'signal', 'depends_on', to_jsonb(p_deps), 'input', p_input)
         || CASE WHEN p_retry = '{}' THEN '{}'::jsonb ELSE jsonb_build_object('retry', p_retry) END
$$;

-- ================================================================ validation
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.signal_task('ok', '{}', '{"timeout_ms": 0}'))))$$),
          'tasks[0] (key ok): input.timeout_ms of a signal task must be an integer from 1 to 2147483647', 'timeout_ms 0');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.signal_task('ok', '{}', '{"timeout": 5}'))))$$),
          'tasks[0] (key ok): input of a signal task has unknown fields (allowed: timeout_ms)', 'signal: unknown field');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            '{"key": "z", "executor": "sleep", "input": {"sleep_ms": 5, "until": "2030-01-01T00:00:00Z"}}'::jsonb)))$$),
          'tasks[0] (key z): a sleep task needs exactly one of input.sleep_ms and input.until', 'sleep: both');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            '{"key": "z", "executor": "sleep"}'::jsonb)))$$),
          'tasks[0] (key z): a sleep task needs exactly one of input.sleep_ms and input.until', 'sleep: neither');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            '{"key": "z", "executor": "sleep", "input": {"until": "tomorrow"}}'::jsonb)))$$),
          'tasks[0] (key z): input.until of a sleep task must be an RFC 3339 timestamp with an offset, e.g. "2030-01-01T09:00:00Z"',
          'sleep: until not a timestamp');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            '{"key": "z", "executor": "sleep", "input": {"sleep_ms": -1}}'::jsonb)))$$),
          'tasks[0] (key z): input.sleep_ms of a sleep task must be an integer from 0 to 2147483647', 'sleep: negative');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a', '{}', '{"retry": {"backoff": 0.5}}'))))$$),
          'tasks[0] (key a): retry.backoff must be a number from 1 to 10 (1: the same interval every time)', 'backoff < 1');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a', '{}', '{"retry": {"jitter": 1.5}}'))))$$),
          'tasks[0] (key a): retry.jitter must be a number from 0 to 1 (the part of each wait that may be taken off at random)',
          'jitter > 1');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.task('a', '{}', '{"retry": {"max_interval_ms": -5}}'))))$$),
          'tasks[0] (key a): retry.max_interval_ms must be an integer from 0 to 86400000', 'max_interval_ms negative');
SELECT throws_ok($$SELECT awp.register_worker('w', '{signal}', 1)$$, 'AWREQ', NULL, 'no worker may offer executor signal');

-- ================================================================ a signal: approval
SELECT tests.make_workflow('approve', jsonb_build_array(
         tests.task('draft'),
         tests.signal_task('approval', '{draft}', '{"timeout_ms": 60000}'),
         tests.task('publish', '{approval}')));
SELECT awp.start_run('approve') AS run \gset
SELECT ok(tests.finish(:'run', 'draft'), 'draft done');
SELECT results_eq($$SELECT status, wait_reason FROM awp.run_tasks('$$ || :'run' || $$') WHERE task_key = 'approval'$$,
                  $$VALUES ('running', 'waiting_signal')$$, 'the approval waits: running, wait reason waiting_signal');
SELECT is((SELECT wait_detail FROM awp.get_task(:'run', 'approval')),
          'waiting for a signal (awp.send_signal, POST /api/v1/runs/' || :'run' || '/tasks/approval/signal); without one it times out at 2030-01-01T00:01:00.000Z (in 1 min 0 s)',
          'its detail says how to send it and when it times out');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND task_key = 'approval'), 0::bigint, 'no dispatch');
SELECT is((SELECT waiting FROM awp.get_run(:'run')), '{"waiting_signal": 1, "waiting_dependencies": 1}'::jsonb, 'get_run counts it');
SELECT ok(tests.ok_run(:'run'), 'invariants hold while it waits');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'run' || $$', 'approval', '[1]')$$, 'AWREQ', NULL, 'a payload must be an object');
SELECT throws_ok($$SELECT * FROM awp.send_signal('run_nope', 'approval', '{}')$$, 'AWNTF', NULL, 'unknown run: AWNTF');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'run' || $$', 'nope', '{}')$$, 'AWNTF', NULL, 'unknown task: AWNTF');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'run' || $$', 'publish', '{}')$$, 'AWSIG',
                 'task not waiting for a signal', 'a task that is not a signal task: AWSIG');
SELECT results_eq($$SELECT status, attempt, received_at FROM awp.send_signal('$$ || :'run' || $$', 'approval', '{"approved": true, "by": "ann"}', 'k-1')$$,
                  $$VALUES ('succeeded', 1, '2030-01-01 00:00:00+00'::timestamptz)$$, 'the signal is accepted: succeeded');
SELECT is((SELECT output FROM awp.get_task(:'run', 'approval')), '{"approved": true, "by": "ann"}'::jsonb, 'its payload is the output');
SELECT is(tests.events_of(:'run', 'approval'),
          '{"created->waiting_dependencies (task created)","waiting_dependencies->ready (dependencies succeeded)","ready->running (waiting for a signal until 2030-01-01T00:01:00.000Z)","running->succeeded (signal received)"}',
          'its events');
SELECT tests.advance('1 s');
SELECT tests.end_tx();
SELECT results_eq($$SELECT status, attempt, received_at FROM awp.send_signal('$$ || :'run' || $$', 'approval', '{"by": "ann", "approved": true}', 'k-1')$$,
                  $$VALUES ('succeeded', 1, '2030-01-01 00:00:00+00'::timestamptz)$$, 'the same key and payload: the first answer');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'run' || $$', 'approval', '{"approved": false}', 'k-1')$$, 'AWIDM', NULL,
                 'the same key with another payload: AWIDM');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'run' || $$', 'approval', '{"approved": true}')$$, 'AWSIG', NULL,
                 'a second signal without the key: AWSIG (not waiting)');
SELECT ok(tests.finish(:'run', 'publish'), 'publish runs');
SELECT is(tests.run_status(:'run'), 'succeeded', 'the run succeeds');
SELECT is((SELECT upstream FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) LIMIT 1), NULL, 'nothing left to claim');
SELECT ok(tests.ok_run(:'run'), 'invariants hold (signal)');

-- ================================================================ a signal's timeout, with the retry policy
SELECT tests.make_workflow('timeout', jsonb_build_array(
         tests.signal_task('approval', '{}', '{"timeout_ms": 1000}', '{"max_attempts": 2, "interval_ms": 0}')));
SELECT awp.start_run('timeout') AS trun \gset
SELECT is(tests.task_status(:'trun', 'approval'), 'running', 'a root signal task waits from the start');
SELECT tests.advance('999 ms');
SELECT awp.coordinator_tick();
SELECT is(tests.task_status(:'trun', 'approval'), 'running', 'at 999 ms: still waiting');
SELECT tests.advance('1 ms');
SELECT is((awp.coordinator_tick())->'waits', '1'::jsonb, 'at 1,000 ms the pass times it out');
SELECT results_eq($$SELECT status, error_code, error_message FROM awp.get_task('$$ || :'trun' || $$', 'approval')$$,
                  $$VALUES ('waiting_retry', 'signal_timeout', 'no signal within 1000 ms')$$, 'signal_timeout, retried');
SELECT awp.coordinator_tick();
SELECT results_eq($$SELECT status, attempts FROM awp.run_tasks('$$ || :'trun' || $$') WHERE task_key = 'approval'$$,
                  $$VALUES ('running', 2)$$, 'attempt 2 waits again');
SELECT tests.end_tx();
SELECT tests.advance('1000 ms');
SELECT awp.coordinator_tick();
SELECT results_eq($$SELECT status, error_code FROM awp.get_task('$$ || :'trun' || $$', 'approval')$$,
                  $$VALUES ('failed', 'signal_timeout')$$, 'no attempt left: failed');
SELECT is(tests.run_status(:'trun'), 'failed', 'the run fails');
SELECT ok(tests.ok_run(:'trun'), 'invariants hold (timeout)');

-- Cancel cancels a waiting signal task.
SELECT awp.start_run('approve') AS crun \gset
SELECT ok(tests.finish(:'crun', 'draft'), 'draft done');
SELECT results_eq($$SELECT status FROM awp.request_cancel('$$ || :'crun' || $$')$$, $$VALUES ('canceled')$$,
                  'nothing leased: canceled at once');
SELECT is(tests.task_status(:'crun', 'approval'), 'canceled', 'the signal task is canceled');
SELECT throws_ok($$SELECT * FROM awp.send_signal('$$ || :'crun' || $$', 'approval', '{}')$$, 'AWSIG', NULL,
                 'a signal after the cancel: AWSIG');
SELECT ok(tests.ok_run(:'crun'), 'invariants hold (canceled)');

-- ================================================================ sleep
SELECT tests.make_workflow('nap', jsonb_build_array(
         '{"key": "nap", "executor": "sleep", "input": {"sleep_ms": 5000}}'::jsonb, tests.task('after', '{nap}')));
SELECT awp.start_run('nap') AS srun \gset
SELECT results_eq($$SELECT status, wait_reason, wait_detail FROM awp.run_tasks('$$ || :'srun' || $$') WHERE task_key = 'nap'$$,
                  $$VALUES ('running', 'sleeping', 'sleeping until 2030-01-01T00:00:08.000Z (in 5.0 s)')$$,
                  'a sleep task sleeps: wait reason sleeping');
SELECT tests.advance('4999 ms');
SELECT awp.coordinator_tick();
SELECT is(tests.task_status(:'srun', 'nap'), 'running', 'at 4,999 ms: still sleeping');
SELECT tests.advance('1 ms');
SELECT awp.coordinator_tick();
SELECT is(tests.task_status(:'srun', 'nap'), 'succeeded', 'at 5,000 ms the pass ends it');
SELECT is((SELECT output FROM awp.get_task(:'srun', 'nap')), '{"slept_until": "2030-01-01T00:00:08+00:00"}'::jsonb,
          'its output says until when');
SELECT ok(tests.finish(:'srun', 'after'), 'its dependant runs');
SELECT ok(tests.ok_run(:'srun'), 'invariants hold (sleep)');
SELECT tests.make_workflow('until', jsonb_build_array(
         '{"key": "wake", "executor": "sleep", "input": {"until": "2029-12-31T23:00:00+00:00"}}'::jsonb));
SELECT awp.start_run('until') AS urun \gset
SELECT awp.coordinator_tick();
SELECT is(tests.run_status(:'urun'), 'succeeded', 'until in the past: done at the next pass');
SELECT tests.make_workflow('forever', jsonb_build_array(tests.signal_task('ok', '{}')));
SELECT awp.start_run('forever') AS frun \gset
SELECT is((SELECT wait_detail FROM awp.get_task(:'frun', 'ok')),
          'waiting for a signal (awp.send_signal, POST /api/v1/runs/' || :'frun' || '/tasks/ok/signal)',
          'without a timeout the detail names none');

-- ================================================================ backoff
SELECT tests.make_workflow('backoff', jsonb_build_array(
         tests.task('b', '{}', '{"retry": {"max_attempts": 4, "interval_ms": 1000, "backoff": 2, "max_interval_ms": 3000}}')));
SELECT awp.start_run('backoff') AS brun \gset
SELECT ok(tests.finish(:'brun', 'b', 'temporary_failure'), 'attempt 1 fails');
SELECT is((SELECT ready_at - awp._now() FROM awp.tasks WHERE run_id = :'brun' AND task_key = 'b'), interval '1 s', 'wait 1: interval_ms');
SELECT tests.advance('1 s');
SELECT tests.end_tx();
SELECT ok(tests.finish(:'brun', 'b', 'temporary_failure'), 'attempt 2 fails');
SELECT is((SELECT ready_at - awp._now() FROM awp.tasks WHERE run_id = :'brun' AND task_key = 'b'), interval '2 s', 'wait 2: x 2');
SELECT tests.advance('2 s');
SELECT tests.end_tx();
SELECT ok(tests.finish(:'brun', 'b', 'temporary_failure'), 'attempt 3 fails');
SELECT is((SELECT ready_at - awp._now() FROM awp.tasks WHERE run_id = :'brun' AND task_key = 'b'), interval '3 s',
          'wait 3: 4 s capped at max_interval_ms 3 s');
SELECT tests.make_workflow('jitter', jsonb_build_array(
         tests.task('j', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 1000, "jitter": 0.5}}')));
SELECT awp.start_run('jitter') AS jrun \gset
SELECT ok(tests.finish(:'jrun', 'j', 'temporary_failure'), 'a jittered retry');
SELECT ok((SELECT ready_at - awp._now() BETWEEN interval '500 ms' AND interval '1 s' FROM awp.tasks
            WHERE run_id = :'jrun' AND task_key = 'j'), 'jitter 0.5: the wait is between 500 ms and 1 s');

SELECT * FROM finish();
ROLLBACK;
