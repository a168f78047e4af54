-- The event log against docs/protocol.md, State machines: after a scenario with success, retry, failure, skip,
-- reaping, withdrawal and cancellation, every recorded transition is allowed, each entity's
-- history chains (from = previous to), sequences are contiguous and each state-changing call
-- is exactly one revision.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(15);

CREATE TABLE tests.allowed (entity_type text, from_status text, to_status text);
INSERT INTO tests.allowed VALUES
  ('run', NULL, 'pending'), ('run', 'pending', 'running'), ('run', 'pending', 'canceled'),
  ('run', 'running', 'succeeded'), ('run', 'running', 'failed'), ('run', 'running', 'canceled'),
  -- the durable cancel intent is logged on the run without a status change
  ('run', 'pending', 'pending'), ('run', 'running', 'running'),
  ('task', NULL, 'waiting_dependencies'), ('task', NULL, 'ready'),
  ('task', 'waiting_dependencies', 'ready'), ('task', 'waiting_dependencies', 'canceled'), ('task', 'waiting_dependencies', 'skipped'),
  ('task', 'ready', 'queued'), ('task', 'ready', 'canceled'), ('task', 'ready', 'skipped'),
  ('task', 'queued', 'running'), ('task', 'queued', 'ready'), ('task', 'queued', 'canceled'),
  ('task', 'running', 'succeeded'), ('task', 'running', 'waiting_retry'), ('task', 'running', 'failed'), ('task', 'running', 'canceled'),
  ('task', 'waiting_retry', 'ready'), ('task', 'waiting_retry', 'failed'), ('task', 'waiting_retry', 'canceled'),
  ('attempt', NULL, 'running'), ('attempt', 'running', 'succeeded'), ('attempt', 'running', 'failed'),
  ('attempt', 'running', 'timed_out'), ('attempt', 'running', 'interrupted'), ('attempt', 'running', 'canceled'),
  ('dispatch', NULL, 'pending'), ('dispatch', 'pending', 'leased'), ('dispatch', 'pending', 'canceled'),
  ('dispatch', 'leased', 'completed'), ('dispatch', 'leased', 'expired'), ('dispatch', 'leased', 'canceled');

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w', '{mock}', 20) \gset w_
SELECT set_config('tests.w', :'w_worker_id', true), set_config('tests.t', :'w_token', true);
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w_worker_id', :'w_token', 1) WITH NO DATA;
-- Each step is one "transaction": tests.end_tx() first, so each state-changing call must add exactly one revision.
-- tests.steps records, per step and run, how far revision and sequence moved.
CREATE TABLE tests.steps (step bigint, run_id text, d_rev bigint, d_seq bigint);
CREATE TABLE tests.snap AS SELECT run_id, revision, last_sequence FROM awp.runs WITH NO DATA;
CREATE FUNCTION tests.before() RETURNS void LANGUAGE sql AS $$
  DELETE FROM tests.snap; INSERT INTO tests.snap SELECT run_id, revision, last_sequence FROM awp.runs;
$$;
CREATE FUNCTION tests.after() RETURNS void LANGUAGE sql AS $$
  INSERT INTO tests.steps
  SELECT (SELECT coalesce(max(step), 0) + 1 FROM tests.steps), r.run_id,
         r.revision - coalesce(s.revision, 0), r.last_sequence - coalesce(s.last_sequence, 0)
    FROM awp.runs r LEFT JOIN tests.snap s USING (run_id);
$$;
CREATE FUNCTION tests.step_tick() RETURNS void LANGUAGE sql AS $$ SELECT tests.end_tx(); SELECT tests.before(); SELECT awp.coordinator_tick(); SELECT tests.after(); $$;
CREATE FUNCTION tests.step_claim() RETURNS void LANGUAGE sql AS $$
  SELECT tests.end_tx();
  SELECT tests.before();
  INSERT INTO l SELECT * FROM awp.claim_tasks(current_setting('tests.w'), current_setting('tests.t'),
    greatest(1, least(20 - (SELECT count(*) FROM awp.dispatches WHERE status = 'leased'), (SELECT count(*) FROM awp.dispatches WHERE status = 'pending')))::integer);
  SELECT tests.after();
$$;
CREATE FUNCTION tests.step_done(p_workflow text, p_key text, p_kind text) RETURNS void LANGUAGE sql AS $$
  SELECT tests.end_tx();
  SELECT tests.before();
  SELECT awp.complete_task(current_setting('tests.w'), current_setting('tests.t'), l.dispatch_id, l.lease_token, tests.result(p_kind))
    FROM l JOIN awp.dispatches d USING (dispatch_id) WHERE l.workflow_id = p_workflow AND l.task_key = p_key AND d.status = 'leased';
  SELECT tests.after();
$$;

-- Run "ok": a -> b, success with one retry on a.
SELECT tests.make_run('ok', jsonb_build_array(tests.task('a', '{}', '{"retry": {"max_attempts": 3, "interval_ms": 0}}'), tests.task('b', '{a}'))) AS ok \gset
-- Run "bad": p (permanent failure) -> q -> r skipped; s independent, succeeds.
SELECT tests.make_run('bad', jsonb_build_array(tests.task('p'), tests.task('q', '{p}'), tests.task('r', '{q}'), tests.task('s'))) AS bad \gset
-- Run "reap": x times out, y's lease expires (2 attempts), both fail in the end.
SELECT tests.make_run('reap', jsonb_build_array(tests.task('x', '{}', '{"timeout_ms": 1000}'),
                                                tests.task('y', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 0}}'))) AS reap \gset
-- Run "cxl": canceled with a lease, a pending dispatch, a waiting and a ready task.
SELECT tests.make_run('cxl', jsonb_build_array(tests.task('c1'), tests.task('c2', '{c1}'), tests.task('c3'))) AS cxl \gset
-- Run "early": canceled while pending.
SELECT tests.make_run('early', jsonb_build_array(tests.task('e1'), tests.task('e2', '{e1}'))) AS early \gset
SELECT tests.end_tx();
SELECT awp.request_cancel(:'early');

SELECT tests.step_tick();
SELECT tests.step_claim();
SELECT tests.step_done('ok', 'a', 'temporary_failure');
SELECT tests.step_done('bad', 'p', 'permanent_failure');
SELECT tests.step_done('bad', 's', 'success');
SELECT tests.step_done('cxl', 'c1', 'success');
SELECT tests.step_tick();
SELECT tests.step_claim();
SELECT tests.step_done('ok', 'a', 'success');
SELECT tests.end_tx();
SELECT awp.configure(dispatch_limit => 100);
SELECT tests.step_tick();
SELECT tests.end_tx();
SELECT awp.request_cancel(:'cxl');
SELECT tests.advance('16 s');
SELECT tests.step_tick();
SELECT tests.step_claim();
SELECT tests.step_done('ok', 'b', 'success');
SELECT tests.advance('16 s');
SELECT tests.step_tick();

-- A queued task goes back to ready when its only compatible worker leaves: a python task.
SELECT * FROM tests.register_worker('py', '{python}', 1) \gset p_
SELECT tests.make_run('py', jsonb_build_array(tests.task('z', '{}', '{"executor": "python"}'))) AS py \gset
SELECT tests.step_tick();
SELECT tests.end_tx();
SELECT awp.drain_worker(:'p_worker_id', :'p_token');
SELECT tests.step_tick();

SELECT results_eq(format($$SELECT workflow_id, status FROM awp.runs WHERE run_id IN (%L, %L, %L, %L, %L, %L) ORDER BY workflow_id$$,
                         :'ok', :'bad', :'reap', :'cxl', :'early', :'py'),
                  $$VALUES ('bad'::text, 'failed'::text), ('cxl', 'canceled'), ('early', 'canceled'), ('ok', 'succeeded'),
                           ('py', 'running'), ('reap', 'failed')$$,
                  'scenario: every kind of run outcome happened');
SELECT is(ARRAY(SELECT DISTINCT to_status FROM awp.events WHERE entity_type = 'attempt' ORDER BY 1),
          ARRAY['canceled', 'failed', 'interrupted', 'running', 'succeeded', 'timed_out'], 'scenario: every attempt outcome happened');
SELECT is(ARRAY(SELECT DISTINCT to_status FROM awp.events WHERE entity_type = 'task' ORDER BY 1),
          ARRAY['canceled', 'failed', 'queued', 'ready', 'running', 'skipped', 'succeeded', 'waiting_dependencies', 'waiting_retry'],
          'scenario: every task state was reached');
SELECT cmp_ok((SELECT count(DISTINCT (e.entity_type, e.from_status, e.to_status)) FROM awp.events e), '>=', 30::bigint,
              'scenario: at least 30 distinct transitions were exercised');

SELECT is(ARRAY(SELECT DISTINCT format('%s: %s -> %s', e.entity_type, coalesce(e.from_status, '∅'), e.to_status) FROM awp.events e
                 WHERE NOT EXISTS (SELECT 1 FROM tests.allowed a WHERE a.entity_type = e.entity_type
                                     AND a.from_status IS NOT DISTINCT FROM e.from_status AND a.to_status = e.to_status)),
          '{}'::text[], 'every recorded transition is allowed by docs/protocol.md, State machines');
SELECT is(ARRAY(SELECT format('%s %s %s #%s: from %s, previous %s', run_id, entity_type, entity_key, sequence, from_status, prev)
                  FROM (SELECT e.*, lag(e.to_status) OVER (PARTITION BY e.run_id, e.entity_type, e.entity_key ORDER BY e.sequence) AS prev,
                               row_number() OVER (PARTITION BY e.run_id, e.entity_type, e.entity_key ORDER BY e.sequence) AS n
                          FROM awp.events e) h
                 WHERE (n = 1 AND from_status IS NOT NULL) OR (n > 1 AND from_status IS DISTINCT FROM prev)),
          '{}'::text[], 'each entity''s history chains: it starts from nothing and every from is the previous to');
SELECT is(ARRAY(SELECT format('%s %s %s', e.entity_type, e.entity_key, e.to_status) FROM awp.events e
                  JOIN (SELECT run_id, entity_type, entity_key, max(sequence) AS s FROM awp.events GROUP BY 1, 2, 3) m
                    ON m.run_id = e.run_id AND m.entity_type = e.entity_type AND m.entity_key = e.entity_key AND m.s = e.sequence
                 WHERE NOT EXISTS (
                   SELECT 1 FROM awp.runs r WHERE e.entity_type = 'run' AND r.run_id = e.run_id AND r.status = e.to_status
                   UNION ALL SELECT 1 FROM awp.tasks t WHERE e.entity_type = 'task' AND t.run_id = e.run_id AND t.task_key = e.entity_key AND t.status = e.to_status
                   UNION ALL SELECT 1 FROM awp.dispatches d WHERE e.entity_type = 'dispatch' AND d.dispatch_id = e.entity_key AND d.status = e.to_status
                   UNION ALL SELECT 1 FROM awp.attempts a WHERE e.entity_type = 'attempt' AND a.run_id = e.run_id
                                AND a.task_key || '#' || a.attempt = e.entity_key AND a.status = e.to_status)),
          '{}'::text[], 'every entity''s last event is its current status');
SELECT is((SELECT count(*) FROM awp.dispatches d WHERE NOT EXISTS (SELECT 1 FROM awp.events e WHERE e.entity_type = 'dispatch' AND e.entity_key = d.dispatch_id))
          + (SELECT count(*) FROM awp.attempts a WHERE NOT EXISTS (SELECT 1 FROM awp.events e WHERE e.entity_type = 'attempt' AND e.run_id = a.run_id AND e.entity_key = a.task_key || '#' || a.attempt)),
          0::bigint, 'every dispatch and attempt has events');
SELECT is(ARRAY(SELECT r.workflow_id FROM awp.runs r WHERE NOT tests.sequences_contiguous(r.run_id)), '{}'::text[],
          'every run''s sequences are contiguous 1..n');
SELECT is(ARRAY(SELECT r.workflow_id FROM awp.runs r
                 WHERE r.revision <> (SELECT max(revision) FROM awp.events e WHERE e.run_id = r.run_id)
                    OR r.revision <> (SELECT count(DISTINCT revision) FROM awp.events e WHERE e.run_id = r.run_id)),
          '{}'::text[], 'revisions are 1..n with no gap, and the run''s revision is its last event''s');
SELECT is(ARRAY(SELECT e.run_id FROM awp.events e GROUP BY e.run_id, e.revision
                 HAVING max(e.sequence) - min(e.sequence) + 1 <> count(*)),
          '{}'::text[], 'the events of one revision are one contiguous block');
SELECT is(ARRAY(SELECT format('step %s run %s: revision +%s for %s events', step, run_id, d_rev, d_seq) FROM tests.steps
                 WHERE d_rev <> CASE WHEN d_seq > 0 THEN 1 ELSE 0 END),
          '{}'::text[], 'every step that wrote events moved each touched run''s revision by exactly one; the others by none');
SELECT cmp_ok((SELECT count(*) FROM tests.steps WHERE d_seq > 0), '>=', 12::bigint, '(at least 12 run-changing steps were observed)');
SELECT is((SELECT revision FROM awp.runs WHERE run_id = :'early'), 2::bigint, 'run early: created, then canceled in one call');

-- Illegal direct shapes are blocked (the CHECKs of 01_schema): a succeeded task must be finished.
SELECT throws_ok(format($$UPDATE awp.tasks SET status = 'succeeded' WHERE run_id = %L AND task_key = 'z'$$, :'py'), '23514', NULL,
                 'a task cannot jump to succeeded without finished_at');

SELECT * FROM finish();
ROLLBACK;
