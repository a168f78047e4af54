-- awp.coordinator_tick and its steps: reaping, offline marking (with the takeover grace window),
-- retry promotion, orphan withdrawal, dispatch creation under backpressure, fairness.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(51);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
-- tests.reset(): cancel every live run and stop every live worker, so scenarios do not mix.
CREATE FUNCTION tests.reset() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM awp.request_cancel(run_id) FROM awp.runs WHERE status IN ('pending', 'running');
  PERFORM awp.coordinator_tick();
  UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE status IN ('active', 'draining');
END $$;
CREATE FUNCTION tests.tick(p_key text) RETURNS integer LANGUAGE sql AS $$ SELECT (awp.coordinator_tick()->>p_key)::integer $$;

SELECT ok(awp.coordinator_tick() ?& ARRAY['canceled', 'reaped', 'offline', 'promoted', 'dispatched'],
          'coordinator_tick() (no argument) returns the documented counts');

-- ================================================================ a run started before any worker exists
SELECT tests.make_run('early', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'))) AS early \gset
SELECT is(tests.tick('dispatched'), 0, 'no worker: no dispatch');
SELECT is(tests.run_status(:'early'), 'pending', 'the run stays pending');
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT is(tests.tick('dispatched'), 3, 'once a worker registers, all ready tasks are dispatched in one pass (rounds repeat)');
SELECT results_eq(format($$SELECT status, started_at FROM awp.runs WHERE run_id = %L$$, :'early'),
                  format($$VALUES ('running'::text, %L::timestamptz)$$, :'t0'), 'the first dispatch makes the run running');
SELECT is(tests.task_statuses(:'early'), ARRAY['a=queued', 'b=queued', 'c=queued'], 'dispatched tasks are queued');
SELECT is(tests.tick('dispatched'), 0, 'a task with a live dispatch is not dispatched twice');

-- ================================================================ reaper
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 3);
SELECT tests.reset();
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT tests.make_run('reap', jsonb_build_array(
         tests.task('expire', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'),
         tests.task('deadline', '{}', '{"timeout_ms": 5000, "retry": {"max_attempts": 2, "interval_ms": 60000}}'),
         tests.task('renewed'), tests.task('once'))) AS reap \gset
SELECT tests.dispatch_all();
DELETE FROM l;
INSERT INTO l SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 4);
SELECT is((SELECT count(*) FROM l), 4::bigint, 'setup: four leases');
SELECT tests.advance('10 s');
SELECT is((SELECT status FROM awp.heartbeat(:'w1_worker_id', :'w1_token',
                 (SELECT jsonb_agg(jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token)) FROM l WHERE task_key = 'renewed'))),
          'renewed', 'setup: one lease renewed at +10 s');
SELECT tests.advance('6 s') AS t16 \gset
SELECT is(tests.tick('reaped'), 3, 'at +16 s three leases are invalid and reaped');
SELECT results_eq(format($$SELECT task_key, status, error_code FROM awp.attempts WHERE run_id = %L ORDER BY task_key$$, :'reap'),
                  $$VALUES ('deadline'::text, 'timed_out'::text, 'attempt_timeout'::text), ('expire', 'interrupted', 'lease_expired'),
                           ('once', 'interrupted', 'lease_expired'), ('renewed', 'running', NULL)$$,
                  'deadline passed (lease too): timed_out; lease expired: interrupted; the renewed lease is left alone');
SELECT is((SELECT array_agg(d.status ORDER BY l.task_key) FROM l JOIN awp.dispatches d USING (dispatch_id)),
          ARRAY['expired', 'expired', 'expired', 'leased'], 'reaped dispatches are expired');
SELECT results_eq(format($$SELECT task_key, status, ready_at FROM awp.tasks WHERE run_id = %L ORDER BY task_key$$, :'reap'),
                  format($$VALUES ('deadline'::text, 'waiting_retry'::text, %L::timestamptz + interval '60 s'),
                                  ('expire', 'queued', NULL), ('once', 'failed', NULL), ('renewed', 'running', NULL)$$, :'t16'),
                  'reaped attempts follow the retry rule: waiting_retry (interval 0: promoted and re-dispatched in the same pass), or failed when exhausted');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'reap' AND status = 'pending'), 1::bigint,
          'the promoted task was dispatched again in the same pass');
SELECT is(tests.run_status(:'reap'), 'running', 'the run goes on (other tasks can still run)');
SELECT is((SELECT active_leases FROM awp.get_worker(:'w1_worker_id')), 1, 'reaped leases free the worker''s slots');
SELECT is(tests.tick('reaped'), 0, 'a reaped lease is not reaped twice');

-- ================================================================ offline marking and the takeover grace window
SELECT tests.reset();
SELECT awp.configure(lease_duration_ms => 2000, heartbeat_interval_ms => 1000, offline_after_heartbeats => 3);
SELECT * FROM tests.register_worker('silent', '{mock}', 1) \gset s_
SELECT * FROM tests.register_worker('chatty', '{mock}', 1) \gset c_
SELECT tests.advance('10 s');
SELECT is(tests.tick('offline'), 0, 'no tick for a full window: this pass is a takeover and marks nobody');
SELECT results_eq($$SELECT coordinator_since, last_tick_at FROM awp.settings$$, 'SELECT awp._now(), awp._now()',
                  'a takeover restarts the offline clock');
SELECT tests.advance('2 s');
SELECT is(tests.tick('offline'), 0, 'within the window after a takeover, nobody is marked (12 s of silence)');
SELECT is(tests.worker_status(:'s_worker_id'), 'active', 'the silent worker is still active');
SELECT is((SELECT count(*) FROM awp.heartbeat(:'c_worker_id', :'c_token', '[]')), 0::bigint, 'setup: chatty heartbeats at +2 s');
SELECT tests.advance('1.5 s');
SELECT is(tests.tick('offline'), 1, 'a full window after the takeover, the silent worker is marked');
SELECT results_eq(format($$SELECT status, offline_at FROM awp.workers WHERE worker_id = %L$$, :'s_worker_id'),
                  $$SELECT 'offline'::text, awp._now()$$, 'offline with offline_at');
SELECT is(tests.worker_status(:'c_worker_id'), 'active', 'a worker heard within the window stays active');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]')$$, :'s_worker_id', :'s_token'), 'AWSES', NULL,
                 'an offline worker cannot come back');
SELECT tests.advance('0.5 s');
SELECT is(awp.coordinator_tick(true)->>'offline', '0', 'coordinator_tick(true) is a takeover: it marks nobody');
SELECT tests.advance('2.9 s');
SELECT is(tests.tick('offline'), 0, '2.9 s after a takeover (window 3 s) nobody is marked, though chatty is silent for 3.9 s');
SELECT tests.advance('0.2 s');
SELECT is(tests.tick('offline'), 1, 'after the window it is');

-- An offline worker's leases are reaped (interrupted) in the same pass.
SELECT awp.configure(lease_duration_ms => 60000);
SELECT * FROM tests.register_worker('dies', '{mock}', 1) \gset d_
SELECT tests.make_run('orphaned', jsonb_build_array(tests.task('a', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 5000}}'))) AS orph \gset
SELECT tests.dispatch_all();
SELECT is((SELECT lease_expires_at FROM awp.claim_tasks(:'d_worker_id', :'d_token', 1)), awp._now() + interval '60 s',
          'setup: the worker holds a 60 s lease');
SELECT tests.advance('2 s');
SELECT is(tests.tick('offline'), 0, 'a regular pass 2 s later marks nobody');
SELECT tests.advance('1.5 s');
SELECT awp.coordinator_tick() AS tick \gset
SELECT is(:'tick'::jsonb->>'offline' || '/' || (:'tick'::jsonb->>'reaped'), '1/1', 'the silent worker is marked offline and its lease reaped in one pass');
SELECT results_eq(format($$SELECT status, error_code FROM awp.attempts WHERE run_id = %L$$, :'orph'),
                  $$VALUES ('interrupted'::text, 'lease_expired'::text)$$, 'its lease was reaped at once: attempt interrupted');
SELECT is(tests.task_status(:'orph', 'a'), 'waiting_retry', '... and the task waits for its retry');

-- ================================================================ retry promotion
SELECT tests.advance('4.9 s');
SELECT is(tests.tick('promoted'), 0, 'not promoted before ready_at');
SELECT tests.advance('0.1 s');
SELECT is(tests.tick('promoted'), 1, 'promoted at ready_at');
SELECT is(tests.task_status(:'orph', 'a'), 'ready', 'the task is ready again (no active worker to dispatch to)');

-- ================================================================ withdrawing orphan dispatches
SELECT tests.reset();
SELECT awp.configure(lease_duration_ms => 15000, heartbeat_interval_ms => 5000, offline_after_heartbeats => 3);
SELECT * FROM tests.register_worker('py', '{python}', 1) \gset p_
SELECT * FROM tests.register_worker('mock-only', '{mock}', 5) \gset m_
SELECT tests.make_run('pyrun', jsonb_build_array(tests.task('a', '{}', '{"executor": "python"}'))) AS pyrun \gset
SELECT tests.tick('dispatched');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'pyrun' AND status = 'pending'), 1::bigint,
          'setup: a python dispatch is pending');
SELECT is((SELECT status FROM awp.drain_worker(:'p_worker_id', :'p_token')), 'stopped', 'the only python worker stops');
SELECT is(tests.tick('withdrawn'), 1, 'the pending dispatch is withdrawn');
SELECT is((SELECT status FROM awp.dispatches WHERE run_id = :'pyrun'), 'canceled', 'its dispatch is canceled');
SELECT results_eq(format($$SELECT status, attempts FROM awp.tasks WHERE run_id = %L$$, :'pyrun'), $$VALUES ('ready'::text, 0)$$,
                  'the task is back to ready, no attempt spent');
SELECT is(tests.run_status(:'pyrun'), 'running', 'the run stays running');
SELECT * FROM tests.register_worker('py2', '{python}', 1) \gset p2_
SELECT is(tests.tick('dispatched'), 1, 'a new python worker gets a fresh dispatch');

-- ================================================================ backpressure
SELECT tests.reset();
SELECT * FROM tests.register_worker('big', '{mock}', 3) \gset b_
SELECT tests.make_run('conc', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 5) i), 2) AS conc \gset
SELECT tests.tick('dispatched');
SELECT is((SELECT count(*) FROM awp.tasks WHERE run_id = :'conc' AND status = 'queued'), 2::bigint,
          'run concurrency 2 bounds queued tasks');
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'b_worker_id', :'b_token', 2)), 2::bigint, 'setup: both claimed');
SELECT is(tests.tick('dispatched'), 0, 'run concurrency bounds queued + running');
SELECT tests.make_run('cap', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 5) i), 10) AS cap \gset
SELECT tests.tick('dispatched');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'cap' AND status = 'pending'), 1::bigint,
          'worker capacity 3 with 2 leases: one more dispatch');
SELECT is(tests.tick('dispatched'), 0, 'pending dispatches count against free capacity');
SELECT tests.reset();
SELECT * FROM tests.register_worker('huge', '{mock}', 100) \gset h_
SELECT awp.configure(dispatch_limit => 2);
SELECT tests.make_run('lim', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 5) i), 10) AS lim \gset
SELECT tests.tick('dispatched');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'lim' AND status = 'pending'), 2::bigint,
          'the global dispatch_limit bounds pending + leased');

-- ================================================================ fairness
SELECT tests.reset();
SELECT awp.configure(dispatch_limit => 1);
SELECT * FROM tests.register_worker('fair', '{mock}', 10) \gset f_
SELECT tests.make_run('r1', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 3) i)) AS r1 \gset
SELECT tests.advance('1 s');
SELECT tests.make_run('r2', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 3) i)) AS r2 \gset
CREATE FUNCTION tests.next_run() RETURNS text LANGUAGE plpgsql AS $$
DECLARE c record;
BEGIN
  PERFORM awp.coordinator_tick();
  SELECT * INTO c FROM awp.claim_tasks(current_setting('tests.fw'), current_setting('tests.ft'), 1);
  PERFORM awp.complete_task(current_setting('tests.fw'), current_setting('tests.ft'), c.dispatch_id, c.lease_token, '{"kind": "success"}');
  RETURN c.workflow_id;
END $$;
SELECT set_config('tests.fw', :'f_worker_id', true), set_config('tests.ft', :'f_token', true);
SELECT is(ARRAY[tests.next_run(), tests.next_run(), tests.next_run(), tests.next_run()], ARRAY['r1', 'r2', 'r1', 'r2'],
          'dispatch_limit 1: the oldest run first, then the run that never got one, then whose latest dispatch is oldest');

SELECT * FROM finish();
ROLLBACK;
