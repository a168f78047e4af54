-- awp.complete_task: fenced and idempotent (docs/protocol.md, rule 7); success unlocks dependants and settles
-- the run; temporary failures retry per policy; exhausted/permanent failures skip descendants
-- and fail the run only when nothing else can run.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(70);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 10) \gset w2_
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) WITH NO DATA;
-- tests.take(): a coordinator pass and w1 claims everything pending; leases land in temp table l.
CREATE FUNCTION tests.take() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
  PERFORM awp.coordinator_tick();
  INSERT INTO l SELECT * FROM awp.claim_tasks(current_setting('tests.w1'), current_setting('tests.t1'),
                                              (SELECT greatest(count(*), 1) FROM awp.dispatches WHERE status = 'pending')::integer);
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
SELECT set_config('tests.w1', :'w1_worker_id', true), set_config('tests.t1', :'w1_token', true);
-- tests.done(run, key, result [, worker, token]): complete the latest lease of a task.
CREATE FUNCTION tests.done(p_run text, p_key text, p_result jsonb, p_worker text DEFAULT NULL, p_token text DEFAULT NULL)
RETURNS boolean LANGUAGE sql AS $$
  SELECT awp.complete_task(coalesce(p_worker, current_setting('tests.w1')), coalesce(p_token, current_setting('tests.t1')),
                           l.dispatch_id, l.lease_token, p_result)
    FROM l WHERE l.run_id = p_run AND l.task_key = p_key ORDER BY l.attempt DESC LIMIT 1
$$;
CREATE FUNCTION tests.done_sql(p_run text, p_key text, p_result jsonb, p_worker text DEFAULT NULL, p_token text DEFAULT NULL)
RETURNS text LANGUAGE sql AS $$ SELECT format('SELECT tests.done(%L, %L, %L, %L, %L)', p_run, p_key, p_result, p_worker, p_token) $$;

-- ================================================================ success, replay, conflict
SELECT tests.make_run('wf', jsonb_build_array(
         tests.task('a', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 1000}}'),
         tests.task('b', '{a}'), tests.task('c'))) AS run \gset
SELECT is(tests.take(), 2::bigint, 'setup: a and c leased');
SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev0 \gset
SELECT tests.event_count(:'run') AS ev0 \gset
SELECT tests.advance('2 s') AS t2 \gset
SELECT is(tests.done(:'run', 'c', '{"kind": "success", "output": {"rows": 3}}'), true, 'a valid success is applied');
SELECT is(tests.task_status(:'run', 'c'), 'succeeded', 'the task succeeded');
SELECT results_eq(format($$SELECT status, finished_at, output, error_code FROM awp.attempts WHERE run_id = %L AND task_key = 'c'$$, :'run'),
                  format($$VALUES ('succeeded'::text, %L::timestamptz, '{"rows": 3}'::jsonb, NULL::text)$$, :'t2'),
                  'the attempt succeeded with its output');
SELECT results_eq(format($$SELECT d.status, d.finished_at, d.result_hash IS NOT NULL FROM awp.dispatches d JOIN l USING (dispatch_id) WHERE l.task_key = 'c' AND l.run_id = %L$$, :'run'),
                  format($$VALUES ('completed'::text, %L::timestamptz, true)$$, :'t2'), 'the dispatch is completed with a result hash');
SELECT is(tests.run_status(:'run'), 'running', 'the run goes on while a is running');
SELECT is(tests.rev(:'run'), (:'rev0'::bigint + 1), 'the completion is one revision');
SELECT results_eq(format($$SELECT entity_type, from_status, to_status FROM awp.events WHERE run_id = %L AND sequence > %s ORDER BY sequence$$, :'run', :'ev0'),
                  $$VALUES ('dispatch'::text, 'leased'::text, 'completed'::text), ('attempt', 'running', 'succeeded'), ('task', 'running', 'succeeded')$$,
                  'events: dispatch completed, attempt succeeded, task succeeded');

SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev1 \gset
SELECT tests.event_count(:'run') AS ev1 \gset
SELECT is(tests.done(:'run', 'c', '{"output": {"rows": 3}, "kind": "success"}'), true, 'the same result again is applied: true');
SELECT is(tests.rev(:'run'), :'rev1'::bigint, '... with the revision unchanged');
SELECT is(tests.event_count(:'run'), :'ev1'::bigint, '... and no event');
SELECT is(tests.done(:'run', 'c', '{"kind": "success", "output": {"rows": 3}, "error_code": null}'), true,
          'an explicit null field is the same result');
SELECT throws_ok(tests.done_sql(:'run', 'c', '{"kind": "success", "output": {"rows": 4}}'), 'AWCNF', NULL, 'a different output is AWCNF');
SELECT throws_ok(tests.done_sql(:'run', 'c', '{"kind": "permanent_failure"}'), 'AWCNF', NULL, 'a different kind is AWCNF');
SELECT is((SELECT output FROM awp.attempts WHERE run_id = :'run' AND task_key = 'c'), '{"rows": 3}'::jsonb, 'the first result stands');
SELECT throws_ok(tests.done_sql(:'run', 'c', '{"kind": "success", "output": {"rows": 3}}', :'w2_worker_id', :'w2_token'), 'AWLST', NULL,
                 'another worker with the right lease token is AWLST');
SELECT throws_ok(format($$SELECT awp.complete_task(%L, %L, (SELECT dispatch_id FROM l WHERE task_key = 'c'), 'wrong', '{"kind": "success", "output": {"rows": 3}}')$$,
                        :'w1_worker_id', :'w1_token'), 'AWLST', NULL, 'a wrong lease token is AWLST (even after completion)');
SELECT throws_ok(format($$SELECT awp.complete_task(%L, %L, 'dsp_nope', 'x', '{"kind": "success"}')$$, :'w1_worker_id', :'w1_token'),
                 'AWLST', NULL, 'an unknown dispatch is AWLST');
SELECT is(tests.rev(:'run'), :'rev1'::bigint, 'refused completions leave the revision alone');

-- Result validation; the session first.
SELECT throws_ok(tests.done_sql(:'run', 'a', '{"kind": "maybe"}'), 'AWREQ', NULL, 'an unknown kind is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', '{"output": 1}'), 'AWREQ', NULL, 'a missing kind is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', '"success"'), 'AWREQ', NULL, 'a result that is not an object is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', '{"kind": "success", "extra": 1}'), 'AWREQ', NULL, 'an unknown result field is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', jsonb_build_object('kind', 'success', 'output', repeat('x', 65536))), 'AWREQ', NULL,
                 'an output over 64 KiB is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', jsonb_build_object('kind', 'permanent_failure', 'error_code', repeat('e', 129))), 'AWREQ', NULL,
                 'an error_code over 128 characters is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', jsonb_build_object('kind', 'permanent_failure', 'error_message', repeat('m', 8193))), 'AWREQ', NULL,
                 'an error_message over 8 KiB is AWREQ');
SELECT throws_ok(tests.done_sql(:'run', 'a', '{"kind": "maybe"}', :'w1_worker_id', 'wrong'), 'AWSES', NULL,
                 'a wrong session with a bad result is AWSES (session first)');
SELECT is(tests.task_status(:'run', 'a'), 'running', 'refused results changed nothing');

-- ================================================================ temporary failure, retry, exhaustion
SELECT tests.advance('1 s') AS t3 \gset
SELECT is(tests.done(:'run', 'a', '{"kind": "temporary_failure", "error_code": "flaky", "error_message": "try again"}'), true,
          'a temporary failure is applied');
SELECT results_eq(format($$SELECT status, ready_at, attempts FROM awp.tasks WHERE run_id = %L AND task_key = 'a'$$, :'run'),
                  format($$VALUES ('waiting_retry'::text, %L::timestamptz + interval '1 s', 1)$$, :'t3'),
                  'attempt 1 of 2 failed: waiting_retry with ready_at = now + interval_ms');
SELECT results_eq(format($$SELECT status, error_code, error_message FROM awp.attempts WHERE run_id = %L AND task_key = 'a'$$, :'run'),
                  $$VALUES ('failed'::text, 'flaky'::text, 'try again'::text)$$, 'the attempt failed with its error');
SELECT is(tests.task_status(:'run', 'b'), 'waiting_dependencies', 'the dependant keeps waiting');
SELECT is((awp.coordinator_tick()->>'promoted')::integer, 0, 'not promoted before ready_at');
SELECT tests.advance('1 s');
SELECT is(tests.take(), 1::bigint, 'after the interval the task is promoted, dispatched and claimed again');
SELECT results_eq(format($$SELECT attempt, fencing_token > (SELECT min(fencing_token) FROM l WHERE run_id = %L AND task_key = 'a') FROM l WHERE run_id = %L AND task_key = 'a' ORDER BY attempt DESC LIMIT 1$$, :'run', :'run'),
                  $$VALUES (2, true)$$, 'the retry is attempt 2 with a larger fencing token');
SELECT throws_ok(format($$SELECT awp.complete_task(%L, %L, l.dispatch_id, l.lease_token, '{"kind": "success"}') FROM l WHERE run_id = %L AND task_key = 'a' AND attempt = 1$$,
                        :'w1_worker_id', :'w1_token', :'run'), 'AWCNF', NULL, 'the stale attempt-1 lease cannot turn its failure into a success');
SELECT is(tests.done(:'run', 'a', '{"kind": "temporary_failure"}'), true, 'attempt 2 fails temporarily too');
SELECT is(tests.task_statuses(:'run'), ARRAY['a=failed', 'b=skipped', 'c=succeeded'], 'retries exhausted: a failed, its dependant skipped');
SELECT is(tests.run_status(:'run'), 'failed', 'nothing else can run: the run failed');
SELECT isnt((SELECT finished_at FROM awp.runs WHERE run_id = :'run'), NULL, 'the run has finished_at');
SELECT ok(tests.sequences_contiguous(:'run'), 'the run''s events are contiguous');

-- ================================================================ permanent failure, independent branch
SELECT tests.make_run('wf2', jsonb_build_array(
         tests.task('p', '{}', '{"retry": {"max_attempts": 3}}'), tests.task('q', '{p}'), tests.task('q2', '{q}'),
         tests.task('r'), tests.task('s', '{r}'))) AS run2 \gset
SELECT is(tests.take(), 2::bigint, 'setup: p and r leased');
SELECT is(tests.done(:'run2', 'p', '{"kind": "permanent_failure", "error_code": "bad_input"}'), true, 'a permanent failure is applied');
SELECT is(tests.task_statuses(:'run2'), ARRAY['p=failed', 'q=skipped', 'q2=skipped', 'r=running', 's=waiting_dependencies'],
          'a permanent failure does not retry (3 attempts allowed); all its descendants are skipped');
SELECT is(tests.run_status(:'run2'), 'running', 'the independent branch keeps the run running');
SELECT is(tests.done(:'run2', 'r', tests.result()), true, 'r succeeds');
SELECT ok(tests.task_status(:'run2', 's') IN ('ready', 'queued'), 'its dependant becomes ready (or is dispatched at once)');
SELECT is(tests.take(), 1::bigint, 's is dispatched and claimed');
SELECT is(tests.done(:'run2', 's', tests.result()), true, 's succeeds');
SELECT is(tests.run_status(:'run2'), 'failed', 'the branch finished; the run failed because p failed');

-- ================================================================ all succeed
SELECT tests.make_run('wf3', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c', '{a,b}'))) AS run3 \gset
SELECT is(tests.take(), 2::bigint, 'setup: a and b leased');
SELECT is(tests.done(:'run3', 'a', tests.result()), true, 'a succeeds');
SELECT is(tests.task_status(:'run3', 'c'), 'waiting_dependencies', 'c still waits for b');
SELECT is((SELECT pending_deps FROM awp.tasks WHERE run_id = :'run3' AND task_key = 'c'), 1, 'one dependency left');
SELECT is(tests.done(:'run3', 'b', tests.result()), true, 'b succeeds');
SELECT ok(tests.task_status(:'run3', 'c') IN ('ready', 'queued'), 'c is ready (or dispatched at once) once all its dependencies succeeded');
SELECT is(tests.take(), 1::bigint, 'c leased');
SELECT is(tests.done(:'run3', 'c', tests.result()), true, 'c succeeds');
SELECT results_eq(format($$SELECT status, finished_at IS NOT NULL FROM awp.runs WHERE run_id = %L$$, :'run3'),
                  $$VALUES ('succeeded'::text, true)$$, 'every task succeeded: the run succeeded');

-- ================================================================ lost leases
SELECT tests.make_run('wf4', jsonb_build_array(tests.task('slow'), tests.task('quick', '{}', '{"timeout_ms": 5000}'), tests.task('held'))) AS run4 \gset
SELECT is(tests.take(), 3::bigint, 'setup: three leases');
SELECT tests.end_tx();
SELECT tests.rev(:'run4') AS rev4 \gset
SELECT tests.advance('6 s');
SELECT throws_ok(tests.done_sql(:'run4', 'quick', tests.result()), 'AWLST', NULL, 'past the attempt deadline is AWLST');
SELECT tests.advance('10 s');
SELECT throws_ok(tests.done_sql(:'run4', 'slow', tests.result()), 'AWLST', NULL, 'an expired lease (not yet reaped) is AWLST');
SELECT is(tests.rev(:'run4'), :'rev4'::bigint, 'lost leases do not move the revision');
SELECT is(tests.task_status(:'run4', 'slow'), 'running', '... nor the task');

SELECT tests.make_run('wf5') AS run5 \gset
SELECT is(tests.take(), 1::bigint, 'setup: a fresh lease');
SELECT is((SELECT status FROM awp.request_cancel(:'run5')), 'running', 'setup: cancel requested');
SELECT tests.end_tx();
SELECT tests.rev(:'run5') AS rev5 \gset
SELECT throws_ok(tests.done_sql(:'run5', 'a', tests.result()), 'AWLST', NULL, 'completing after a cancel request is AWLST');
SELECT is(tests.rev(:'run5'), :'rev5'::bigint, '... and does not move the revision');
SELECT tests.dispatch_all();
SELECT throws_ok(tests.done_sql(:'run5', 'a', tests.result()), 'AWLST', NULL, 'completing after the cancel converged is AWLST');
SELECT is((SELECT status FROM awp.attempts WHERE run_id = :'run5'), 'canceled', 'the attempt stays canceled');

SELECT * FROM finish();
ROLLBACK;
