-- Re-running a failed or canceled run (db/functions/retry_run.sql, AWP issue 41): what runs again, what is kept,
-- fresh attempts, the run running again, events, errors, idempotency, invariants.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(27);

SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT set_config('tests.w', :'w1_worker_id', true), set_config('tests.t', :'w1_token', true);
-- tests.finish(run, key, kind): a pass, w1 claims what it has room for (kept in l), then completes the task's lease.
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) WITH NO DATA;
CREATE FUNCTION tests.finish(p_run text, p_key text, p_kind text DEFAULT 'success') RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  x record;
  v_free integer;
BEGIN
  PERFORM awp.coordinator_tick();
  SELECT 10 - count(*) INTO v_free FROM awp.dispatches d WHERE d.worker_id = current_setting('tests.w') AND d.status = 'leased';
  IF v_free > 0 THEN
    INSERT INTO l SELECT * FROM awp.claim_tasks(current_setting('tests.w'), current_setting('tests.t'), v_free);
  END IF;
  SELECT * INTO x FROM l WHERE l.run_id = p_run AND l.task_key = p_key ORDER BY l.attempt DESC LIMIT 1;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'tests.finish: % not leased', p_key;
  END IF;
  RETURN awp.complete_task(current_setting('tests.w'), current_setting('tests.t'), x.dispatch_id, x.lease_token,
                           tests.result(p_kind, '{"ok": true}', CASE WHEN p_kind <> 'success' THEN 'boom' END));
END $$;

SELECT tests.make_workflow('rerun', jsonb_build_array(
         tests.task('a'), tests.task('b', '{a}'), tests.task('c', '{b}'), tests.task('side')));
SELECT awp.start_run('rerun') AS run \gset
SELECT ok(tests.finish(:'run', 'a'), 'a succeeds');
SELECT ok(tests.finish(:'run', 'side'), 'side succeeds');
SELECT ok(tests.finish(:'run', 'b', 'permanent_failure'), 'b fails for good');
SELECT is(tests.run_status(:'run'), 'failed', 'the run failed');
SELECT tests.end_tx();
SELECT throws_ok($$SELECT * FROM awp.retry_run('run_nope')$$, 'AWNTF', NULL, 'unknown run: AWNTF');
SELECT throws_ok($$SELECT * FROM awp.retry_run('$$ || :'run' || $$', '{nope}')$$, 'AWREQ', NULL, 'unknown task: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.retry_run('$$ || :'run' || $$', '{}')$$, 'AWREQ', NULL, 'an empty list: AWREQ');
SELECT results_eq($$SELECT status, task_keys FROM awp.retry_run('$$ || :'run' || $$')$$,
                  $$VALUES ('running', '{b,c}'::text[])$$, 're-run: the failed task and the one it skipped');
SELECT is(tests.task_statuses(:'run'), '{a=succeeded,b=ready,c=waiting_dependencies,side=succeeded}',
          'b ready again, c waits for it, the succeeded ones kept');
SELECT results_eq($$SELECT attempts, max_attempts FROM awp.tasks WHERE run_id = '$$ || :'run' || $$' AND task_key = 'b'$$,
                  $$VALUES (1, 2)$$, 'fresh attempts: one more than it made');
SELECT is((SELECT array_agg(from_status || '->' || to_status || ' (' || reason || ')' ORDER BY sequence) FROM awp.events
            WHERE run_id = :'run' AND reason = 'retry requested'),
          '{failed->ready (retry requested),skipped->waiting_dependencies (retry requested),failed->running (retry requested)}',
          'its events');
SELECT ok(tests.ok_run(:'run'), 'invariants hold after the reset');
SELECT throws_ok($$SELECT * FROM awp.retry_run('$$ || :'run' || $$')$$, 'AWREQ', NULL, 'a running run: AWREQ');
SELECT ok(tests.finish(:'run', 'b'), 'b succeeds as attempt 2');
SELECT ok(tests.finish(:'run', 'c'), 'c runs');
SELECT is(tests.run_status(:'run'), 'succeeded', 'the re-run succeeds');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status IN ('pending', 'leased')), 0::bigint, 'nothing left');
SELECT ok(tests.ok_run(:'run'), 'invariants hold (re-run to success)');

-- A canceled run, re-run from a named task: that task and its descendants.
SELECT awp.start_run('rerun') AS crun \gset
SELECT ok(tests.finish(:'crun', 'a'), 'a succeeds');
SELECT awp.request_cancel(:'crun');
SELECT awp.coordinator_tick();   -- converges it (side's lease is canceled)
SELECT is(tests.run_status(:'crun'), 'canceled', 'the run is canceled');
SELECT tests.end_tx();
SELECT results_eq($$SELECT status, task_keys FROM awp.retry_run('$$ || :'crun' || $$', '{a}')$$,
                  $$VALUES ('running', '{a,b,c}'::text[])$$, 'named a: a and everything that depends on it run again');
SELECT is(tests.task_status(:'crun', 'side'), 'canceled', 'side, not named and not a dependant, stays canceled');
SELECT ok(tests.ok_run(:'crun'), 'invariants hold (canceled run re-run)');
-- Idempotent per key (POST /runs/{id}/retry).
SELECT awp.start_run('rerun') AS irun \gset
SELECT ok(tests.finish(:'irun', 'a', 'permanent_failure') AND tests.finish(:'irun', 'side'), 'a fails, side succeeds');
SELECT tests.end_tx();
SELECT results_eq($$SELECT status, task_keys, replayed FROM awp.retry_run_idempotent('k1', 'h1', '$$ || :'irun' || $$')$$,
                  $$VALUES ('running', '{a,b,c}'::text[], false)$$, 'the first request re-runs');
SELECT results_eq($$SELECT status, task_keys, replayed FROM awp.retry_run_idempotent('k1', 'h1', '$$ || :'irun' || $$')$$,
                  $$VALUES ('running', '{a,b,c}'::text[], true)$$, 'the same key: the first answer, nothing done again');
SELECT throws_ok($$SELECT * FROM awp.retry_run_idempotent('k1', 'h2', '$$ || :'irun' || $$')$$, 'AWIDM', NULL,
                 'the same key for another request: AWIDM');

SELECT * FROM finish();
ROLLBACK;
