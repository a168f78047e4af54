-- Rate limits, concurrency keys and priority (docs/limits.md; db/functions/_rate_limits.sql, _dispatching.sql):
-- awp.set_limit / list_limits / get_limit / delete_limit and their errors, the definition's `limits` and `priority`,
-- max_in_flight across runs and through every dispatch path (run start, refill on complete, claim on complete,
-- coordinator pass), a limit keyed by the run input, an undefined limit, per_window with the frozen clock (window
-- edges pinned exactly), fairness inside a limit, priority order, wait reasons, metrics and invariants.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(76);

SELECT tests.freeze('2030-01-01 00:00:00+00');

-- tests.limited(key, limits, extra): a mock task holding limits.
CREATE FUNCTION tests.limited(p_key text, p_limits jsonb, p_extra jsonb DEFAULT '{}') RETURNS jsonb
LANGUAGE sql AS $$ SELECT tests.task(p_key) || jsonb_build_object('limits', p_limits) || p_extra $$;
-- tests.in_flight(bucket): queued + running tasks holding a bucket.
CREATE FUNCTION tests.in_flight(p_bucket text) RETURNS bigint LANGUAGE sql AS $$
  SELECT count(*) FROM awp.tasks WHERE status IN ('queued', 'running') AND limit_buckets @> ARRAY[p_bucket]
$$;
-- tests.reason(run, key): a waiting task's wait reason and detail.
CREATE FUNCTION tests.reason(p_run text, p_key text) RETURNS text LANGUAGE sql AS $$
  SELECT w.reason || ': ' || w.detail FROM awp.run_waits(p_run) w WHERE w.task_key = p_key
$$;

SELECT is(awp.next_due_ms(), NULL, 'next_due_ms: nothing time-based to wait for');

-- ================================================================ set_limit, list_limits, get_limit, delete_limit
SELECT throws_ok($$SELECT * FROM awp.set_limit('bad name', 1)$$, 'AWREQ', NULL, 'a name with a space: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('', 1)$$, 'AWREQ', NULL, 'an empty name: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x', 0)$$, 'AWREQ', NULL, 'max_in_flight 0: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x', -3)$$, 'AWREQ', NULL, 'a negative max_in_flight: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x', NULL, 10, 0)$$, 'AWREQ', NULL, 'window_ms 0: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x', NULL, 10)$$, 'AWREQ', NULL, 'per_window without window_ms: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x', NULL, NULL, 1000)$$, 'AWREQ', NULL, 'window_ms alone: AWREQ');
SELECT throws_ok($$SELECT * FROM awp.set_limit('x')$$, 'AWREQ', NULL, 'no rule at all: AWREQ');
SELECT is(tests.error_detail($$SELECT * FROM awp.set_limit('x', NULL, 10)$$), 'per_window and window_ms go together',
          'the detail says what is wrong');
SELECT is((SELECT row(name, max_in_flight, per_window, window_ms, in_flight, held)::text FROM awp.set_limit('api', 2)),
          '(api,2,,,0,0)', 'set_limit returns the limit with its counts');
SELECT is((SELECT max_in_flight FROM awp.set_limit('api', 3)), 3, 'set_limit replaces a limit');
SELECT is((SELECT max_in_flight FROM awp.set_limit('api', 2)), 2, '... and again');
SELECT is((SELECT array_agg(name ORDER BY name) FROM awp.list_limits()), '{api}', 'list_limits lists it');
SELECT is((SELECT max_in_flight FROM awp.get_limit('api')), 2, 'get_limit reads one');
SELECT throws_ok($$SELECT * FROM awp.get_limit('nope')$$, 'AWNTF', NULL, 'get_limit of an unknown limit: AWNTF');
SELECT is((SELECT count(*) FROM awp.set_limit('tmp', NULL, 5, 1000)), 1::bigint, 'a window-only limit');
SELECT ok(awp.delete_limit('tmp'), 'delete_limit removes it');
SELECT ok(NOT awp.delete_limit('tmp'), 'deleting it again says false');

-- ================================================================ the definition's limits and priority
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(tests.limited('a', '"api"'))))$$),
          'tasks[0] (key a): limits must be an array of 1-8 limit names or {"name", "key_from"} objects', 'limits not an array');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(tests.limited('a', '["a b"]'))))$$),
          'tasks[0] (key a): limits[0]: a limit name has 1-64 characters among A-Z a-z 0-9 _ . : -', 'a bad limit name');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.limited('a', '[{"name": "t", "key": "x"}]'))))$$),
          'tasks[0] (key a): limits[0] has unknown fields (allowed: name, key_from)', 'an unknown field');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.limited('a', '[{"name": "t", "key_from": ["input", "x"]}]'))))$$),
          'tasks[0] (key a): limits[0].key_from must be ["run_input", field, ...] (a path in the run input)', 'key_from not from run_input');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            tests.limited('a', '["api", {"name": "api"}]'))))$$),
          'tasks[0] (key a): limits names api twice', 'a limit named twice');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(
            jsonb_build_object('key', 's', 'executor', 'sleep', 'input', '{"sleep_ms": 1}'::jsonb, 'limits', '["api"]'::jsonb))))$$),
          'tasks[0] (key s): limits apply to tasks run by workers, not to executor sleep', 'no limits on a sleep');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(tests.task('a', '{}', '{"priority": 10}'))))$$),
          'tasks[0] (key a): priority must be an integer from 0 to 9 (higher first; default 5)', 'priority 10');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(tests.task('a', '{}', '{"priority": -1}'))))$$),
          'tasks[0] (key a): priority must be an integer from 0 to 9 (higher first; default 5)', 'priority -1');
SELECT is(tests.error_detail($$SELECT awp.create_workflow_version(tests.def(jsonb_build_array(tests.task('a', '{}', '{"priorty": 1}'))))$$),
          'tasks[0] (key a): unknown fields: priorty (did you mean priority?)', 'a misspelt priority');

-- ================================================================ max_in_flight: run start, pass, claim, refill
SELECT * FROM tests.register_worker('w1', '{mock}', 10) \gset w1_
SELECT tests.make_workflow('five', jsonb_build_array(tests.limited('t1', '["api"]'), tests.limited('t2', '["api"]'),
                                                     tests.limited('t3', '["api"]'), tests.limited('t4', '["api"]'),
                                                     tests.limited('t5', '["api"]')));
SELECT awp.start_run('five') AS r1 \gset
SELECT is(tests.in_flight('api'), 2::bigint, 'the run start dispatches two of five: max_in_flight 2');
SELECT is((SELECT limit_buckets FROM awp.tasks WHERE run_id = :'r1' AND task_key = 't1'), '{api}', 'the task holds its bucket');
SELECT tests.dispatch_all();
SELECT is(tests.in_flight('api'), 2::bigint, 'a coordinator pass adds none');
SELECT is(tests.reason(:'r1', 't3'), 'rate_limited: limit api: 2 of max_in_flight 2 in flight', 'a held task says why');
SELECT is((awp.metrics_snapshot()->'rate_limits'->'api'), '{"held": 3, "in_flight": 2}'::jsonb, 'metrics: in flight and held per limit');
SELECT is((SELECT row(in_flight, held)::text FROM awp.get_limit('api')), '(2,3)', 'get_limit counts them too');
CREATE TEMP TABLE l1 ON COMMIT DROP AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 10);
SELECT is((SELECT count(*) FROM l1), 2::bigint, 'a claim of 10 slots gets the two');
SELECT dispatch_id AS d1, lease_token AS l1 FROM l1 WHERE task_key = 't1' \gset
-- The claim on complete (complete_and_claim) frees the bucket, then takes the next task holding it.
SELECT is((SELECT count(*) FROM awp.complete_and_claim(:'w1_worker_id', :'w1_token', :'d1', :'l1', tests.result(), 1)),
          1::bigint, 'complete_and_claim of a limited task leases the next one');
SELECT is(tests.in_flight('api'), 2::bigint, '... and the limit still holds exactly two');
SELECT is(tests.task_statuses(:'r1'), '{t1=succeeded,t2=running,t3=running,t4=ready,t5=ready}',
          'in definition order within the run');
-- A second run holding the same limit: held too, and first served when the bucket frees (fairness inside a limit:
-- a run never dispatched comes first, though it is the newer one: creation order alone would pick r1).
SELECT tests.advance('100 ms');
SELECT awp.start_run('five') AS r2 \gset
SELECT is(tests.in_flight('api'), 2::bigint, 'a second run''s start dispatches nothing: the limit is across runs');
SELECT is(tests.reason(:'r2', 't1'), 'rate_limited: limit api: 2 of max_in_flight 2 in flight', 'the second run waits for the limit');
SELECT dispatch_id AS d2, lease_token AS l2 FROM l1 WHERE task_key = 't2' \gset
SELECT ok(tests.complete(:'w1_worker_id', :'w1_token', :'d2', :'l2'), 'complete_task of a limited task');
SELECT is(tests.task_status(:'r2', 't1'), 'queued', 'its refill goes to the run never dispatched (fairness inside the limit)');
SELECT is(tests.in_flight('api'), 2::bigint, 'still two in flight');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'every invariant holds');

-- ================================================================ an undefined limit, then defined
SELECT tests.make_workflow('undef', jsonb_build_array(tests.limited('a', '["later"]')));
SELECT awp.start_run('undef') AS r3 \gset
SELECT tests.dispatch_all();
SELECT is(tests.task_status(:'r3', 'a'), 'ready', 'a task whose limit is not defined is held');
SELECT is(tests.reason(:'r3', 'a'), 'rate_limited: limit later is not defined (awp.set_limit or PUT /limits/later)',
          '... and says so, naming how to define it');
SELECT is((SELECT max_in_flight FROM awp.set_limit('later', 1)), 1, 'defined');
SELECT tests.dispatch_all();
SELECT is(tests.task_status(:'r3', 'a'), 'queued', 'the next pass dispatches it');

-- ================================================================ a limit keyed by the run input
SELECT awp.set_limit('tenant', 1);
SELECT tests.make_workflow('keyed', jsonb_build_array(
  tests.limited('a', '[{"name": "tenant", "key_from": ["run_input", "tenant_id"]}]'),
  tests.limited('b', '[{"name": "tenant", "key_from": ["run_input", "tenant_id"]}]')));
SELECT awp.start_run('keyed', NULL, NULL, '{"tenant_id": "acme"}') AS ka \gset
SELECT awp.start_run('keyed', NULL, NULL, '{"tenant_id": "globex"}') AS kg \gset
SELECT awp.start_run('keyed', NULL, NULL, '{}') AS kn \gset
SELECT is((SELECT limit_buckets FROM awp.tasks WHERE run_id = :'ka' AND task_key = 'a'), '{tenant=acme}', 'the bucket carries the key');
SELECT is((SELECT limit_buckets FROM awp.tasks WHERE run_id = :'kn' AND task_key = 'a'), '{tenant=}', 'a missing key is the empty key');
SELECT is(ARRAY[tests.in_flight('tenant=acme'), tests.in_flight('tenant=globex'), tests.in_flight('tenant=')],
          '{1,1,1}'::bigint[], 'one in flight per key');
SELECT is(tests.reason(:'ka', 'b'), 'rate_limited: limit tenant (key ''acme''): 1 of max_in_flight 1 in flight', 'the detail names the key');
SELECT throws_ok($$SELECT awp.start_run('keyed', NULL, NULL, jsonb_build_object('tenant_id', repeat('k', 201)))$$,
                 'AWREQ', NULL, 'a key over 200 characters: AWREQ');

-- ================================================================ per_window, with the frozen clock
SELECT awp.set_limit('win', NULL, 2, 1000);
SELECT * FROM tests.register_worker('w2', '{python}', 10) \gset w2_
SELECT tests.make_workflow('windowed', jsonb_build_array(
  tests.limited('a', '["win"]', '{"executor": "python"}'), tests.limited('b', '["win"]', '{"executor": "python"}'),
  tests.limited('c', '["win"]', '{"executor": "python"}'), tests.limited('d', '["win"]', '{"executor": "python"}'),
  tests.limited('e', '["win"]', '{"executor": "python"}')));
SELECT tests.freeze('2030-01-01 00:10:00+00');
SELECT awp.start_run('windowed') AS rw \gset
SELECT is(tests.in_flight('win'), 2::bigint, 'two dispatched: per_window 2 (a pending dispatch counts as a start)');
CREATE TEMP TABLE wl ON COMMIT DROP AS SELECT * FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 10);
SELECT is((SELECT count(*) FROM wl), 2::bigint, 'both claimed at 00:10:00');
SELECT is((SELECT count(*) FILTER (WHERE tests.complete(:'w2_worker_id', :'w2_token', dispatch_id, lease_token)) FROM wl),
          2::bigint, 'both completed at once');
SELECT tests.dispatch_all();
SELECT is(tests.in_flight('win'), 0::bigint, 'nothing more in the same window, though none is in flight');
SELECT is(tests.reason(:'rw', 'c'), 'rate_limited: limit win: 2 of per_window 2 started or about to start in the last 1.0 s',
          'the window holds it, and says so');
SELECT tests.freeze('2030-01-01 00:10:00.999+00');
SELECT tests.dispatch_all();
SELECT is(tests.in_flight('win'), 0::bigint, '999 ms later: still held');
SELECT tests.freeze('2030-01-01 00:10:01+00');
SELECT tests.dispatch_all();
SELECT is(tests.in_flight('win'), 2::bigint, 'exactly 1,000 ms later: the two starts no longer count, two more dispatched');
SELECT is((SELECT count(*) FROM awp.limit_starts WHERE bucket = 'win'), 0::bigint, 'the pass pruned the starts no window counts');
SELECT tests.dispatch_all();
SELECT is(tests.in_flight('win'), 2::bigint, 'a pending dispatch counts as a start: no third one');
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 10)), 2::bigint, 'claimed at 00:10:01');
SELECT is((SELECT count(*) FROM awp.limit_starts WHERE bucket = 'win' AND started_at = '2030-01-01 00:10:01+00'),
          2::bigint, 'each start recorded at the lease''s time');
SELECT is(awp.next_due_ms(), 1000::bigint, 'next_due_ms: the coordinator wakes when those starts leave the window');
SELECT tests.freeze('2030-01-01 00:10:01.250+00');
SELECT is(awp.next_due_ms(), 750::bigint, '... counted down by the clock');

-- ================================================================ priority
-- The python slots: w3's one alone (w2 drains, its two leases still held).
SELECT is((SELECT status FROM awp.drain_worker(:'w2_worker_id', :'w2_token')), 'draining', 'w2 drains');
SELECT * FROM tests.register_worker('w3', '{python}', 1) \gset w3_
SELECT tests.make_workflow('prio', jsonb_build_array(
  tests.task('lo', '{}', '{"executor": "python", "priority": 1}'), tests.task('mid', '{}', '{"executor": "python"}'),
  tests.task('hi', '{}', '{"executor": "python", "priority": 9}')));
SELECT awp.start_run('prio') AS rp \gset
SELECT is((SELECT string_agg(task_key || '=' || priority, ',' ORDER BY ordinal) FROM awp.tasks WHERE run_id = :'rp'),
          'lo=1,mid=5,hi=9', 'priorities from the definition (default 5)');
SELECT is((SELECT task_key FROM awp.tasks WHERE run_id = :'rp' AND status = 'queued'), 'hi', 'one slot: the highest priority first');
SELECT c.dispatch_id AS pd, c.lease_token AS pl FROM awp.claim_tasks(:'w3_worker_id', :'w3_token', 1) c \gset
SELECT c.task_key AS pk, c.dispatch_id AS md, c.lease_token AS ml
  FROM awp.complete_and_claim(:'w3_worker_id', :'w3_token', :'pd', :'pl', tests.result(), 1) c \gset
SELECT is(:'pk'::text, 'mid', 'then the default priority');
-- A run started with a priority overrides its tasks' own and goes before older runs.
SELECT tests.make_workflow('plain', jsonb_build_array(tests.task('x', '{}', '{"executor": "python"}')));
SELECT awp.start_run('plain') AS older \gset
SELECT tests.advance('100 ms');   -- the older run is older: only priority puts the urgent one first
SELECT awp.start_run('plain', NULL, NULL, NULL, 8) AS urgent \gset
SELECT is((SELECT priority FROM awp.tasks WHERE run_id = :'urgent'), 8::smallint, 'the run''s priority is its tasks''');
SELECT is((SELECT priority FROM awp.runs WHERE run_id = :'urgent'), 8::smallint, '... and is kept on the run');
SELECT ok(tests.complete(:'w3_worker_id', :'w3_token', :'md', :'ml'), 'mid ends, its slot is refilled');
SELECT is((SELECT run_id FROM awp.tasks WHERE status = 'queued' AND executor = 'python' AND run_id <> :'rw'), :'urgent',
          'by the urgent run, before the older run and the lower-priority task');
SELECT throws_ok($$SELECT awp.start_run('plain', NULL, NULL, NULL, 10)$$, 'AWREQ', NULL, 'a run priority of 10: AWREQ');

SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'every invariant holds at the end');

SELECT * FROM finish();
ROLLBACK;
