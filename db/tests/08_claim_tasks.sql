-- awp.claim_tasks: session first, AWDRN/AWCAP/AWREQ, the lease (attempt, token, deadline, expiry,
-- fencing token), compatible executor kinds only, one revision per claim transaction.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(42);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 2) \gset w1_
SELECT * FROM tests.register_worker('wpy', '{python}', 1) \gset py_
SELECT tests.make_run('wf', jsonb_build_array(
         tests.task('short', '{}', '{"timeout_ms": 10000, "action": "act-s", "input": {"x": 1}}'),
         tests.task('long', '{}', '{"timeout_ms": 60000}'),
         tests.task('py', '{}', '{"executor": "python"}'),
         tests.task('later', '{short}'))) AS run \gset
SELECT tests.dispatch_all();
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status = 'pending'), 3::bigint,
          'setup: three dispatches pending');
SELECT is((SELECT count(*) FROM awp.attempts), 0::bigint, 'a pending dispatch has no attempt yet');

-- ---------------------------------------------------------------- errors, session first
SELECT throws_ok($$SELECT * FROM awp.claim_tasks('wkr_nope', 'x', 1)$$, 'AWSES', NULL, 'an unknown worker is AWSES');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, 'wrong', 1)$$, :'w1_worker_id'), 'AWSES', NULL, 'a wrong token is AWSES');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, NULL, 1)$$, :'w1_worker_id'), 'AWSES', NULL, 'a null token is AWSES');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'w1_worker_id', :'py_token'), 'AWSES', NULL,
                 'another worker''s token is AWSES');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, 'wrong', 0)$$, :'w1_worker_id'), 'AWSES', NULL,
                 'the session is checked before the slots');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 0)$$, :'w1_worker_id', :'w1_token'), 'AWREQ', NULL, 'slots 0 is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, NULL)$$, :'w1_worker_id', :'w1_token'), 'AWREQ', NULL, 'null slots is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 3)$$, :'w1_worker_id', :'w1_token'), 'AWCAP', NULL,
                 'three slots on a worker of capacity two is AWCAP');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE status = 'leased'), 0::bigint, 'a refused claim leased nothing');

SELECT * FROM tests.register_worker('gone', '{mock}', 1) \gset gone_
SELECT is((SELECT status FROM awp.drain_worker(:'gone_worker_id', :'gone_token')), 'stopped', 'setup: a stopped worker');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'gone_worker_id', :'gone_token'), 'AWSES', NULL,
                 'a stopped worker is AWSES');
SELECT * FROM tests.register_worker('lost', '{mock}', 1) \gset lost_
UPDATE awp.workers SET status = 'offline', offline_at = awp._now() WHERE worker_id = :'lost_worker_id';
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'lost_worker_id', :'lost_token'), 'AWSES', NULL,
                 'an offline worker is AWSES');

-- ---------------------------------------------------------------- a claim
SELECT tests.end_tx();
SELECT tests.rev(:'run') AS rev0 \gset
SELECT tests.event_count(:'run') AS ev0 \gset
SELECT nextval('awp.fencing_token_seq') AS fence0 \gset
CREATE TEMP TABLE c1 AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 2);

SELECT is((SELECT array_agg(task_key ORDER BY task_key) FROM c1), ARRAY['long', 'short'],
          'a mock worker gets the two mock tasks, never the python one');
SELECT results_eq($$SELECT workflow_id, workflow_version, executor_kind, action, input, attempt FROM c1 WHERE task_key = 'short'$$,
                  $$VALUES ('wf'::text, 1, 'mock'::text, 'act-s'::text, '{"x": 1}'::jsonb, 1)$$,
                  'the lease carries workflow, version, executor, action, input and attempt 1');
SELECT is((SELECT run_id FROM c1 LIMIT 1), :'run', 'the lease names its run');
SELECT results_eq($$SELECT attempt_deadline, lease_expires_at, lease_remaining_ms FROM c1 WHERE task_key = 'short'$$,
                  format($$VALUES (%L::timestamptz + interval '10 s', %L::timestamptz + interval '10 s', 10000::bigint)$$, :'t0', :'t0'),
                  'timeout 10 s < lease 15 s: the lease expires at the attempt deadline');
SELECT results_eq($$SELECT attempt_deadline, lease_expires_at, lease_remaining_ms FROM c1 WHERE task_key = 'long'$$,
                  format($$VALUES (%L::timestamptz + interval '60 s', %L::timestamptz + interval '15 s', 15000::bigint)$$, :'t0', :'t0'),
                  'timeout 60 s > lease 15 s: the lease expires after the lease duration');
SELECT ok((SELECT bool_and(lease_token ~ '^[A-Za-z0-9_-]{43}$') FROM c1), 'lease tokens are 43 characters of base64url');
SELECT isnt((SELECT min(lease_token) FROM c1), (SELECT max(lease_token) FROM c1), 'each lease has its own token');
SELECT ok((SELECT min(fencing_token) > :fence0 AND count(DISTINCT fencing_token) = 2 FROM c1),
          'fencing tokens are new and distinct');
SELECT results_eq($$SELECT d.status, d.worker_id, d.lease_token_hash = sha256(convert_to(c1.lease_token, 'UTF8')),
                           d.attempt, d.fencing_token = c1.fencing_token, d.leased_at, d.lease_expires_at = c1.lease_expires_at
                      FROM c1 JOIN awp.dispatches d USING (dispatch_id) WHERE c1.task_key = 'short'$$,
                  format($$VALUES ('leased'::text, %L::text, true, 1, true, %L::timestamptz, true)$$, :'w1_worker_id', :'t0'),
                  'the dispatch is leased to the worker with the token''s SHA-256, attempt and fencing token');
SELECT is((SELECT count(*) FROM awp.dispatches d, jsonb_each_text(to_jsonb(d)) e, c1
            WHERE d.run_id = :'run' AND strpos(e.value, c1.lease_token) > 0), 0::bigint,
          'no dispatch column holds a plaintext lease token');
SELECT results_eq($$SELECT a.attempt, a.status, a.worker_id, a.dispatch_id, a.fencing_token, a.started_at, a.deadline, a.finished_at
                      FROM c1 JOIN awp.attempts a USING (dispatch_id) WHERE c1.task_key = 'short'$$,
                  format($$SELECT 1, 'running'::text, %L::text, dispatch_id, fencing_token, %L::timestamptz, attempt_deadline, NULL::timestamptz
                             FROM c1 WHERE task_key = 'short'$$, :'w1_worker_id', :'t0'),
                  'attempt 1 is created running, with the lease''s deadline and fencing token');
SELECT is(tests.task_statuses(:'run'), ARRAY['short=running', 'long=running', 'py=queued', 'later=waiting_dependencies'],
          'claimed tasks are running; the python task is still queued');
SELECT is((SELECT attempts FROM awp.tasks WHERE run_id = :'run' AND task_key = 'short'), 1, 'the task counts one attempt');
SELECT is(tests.rev(:'run'), (:rev0 + 1)::bigint, 'one claim transaction of two leases bumps the revision by exactly one');
SELECT is(tests.event_count(:'run'), (:ev0 + 6)::bigint, 'three events per lease');
SELECT results_eq(format($$SELECT entity_type, coalesce(from_status, '-'), to_status, count(*)::integer FROM awp.events
                             WHERE run_id = %L AND sequence > %s GROUP BY 1, 2, 3 ORDER BY 1$$, :'run', :ev0),
                  $$VALUES ('attempt'::text, '-'::text, 'running'::text, 2), ('dispatch', 'pending', 'leased', 2), ('task', 'queued', 'running', 2)$$,
                  'events: dispatch pending->leased, task queued->running, attempt ->running');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences stay contiguous');

-- Capacity is computed in the database from the leases held.
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'w1_worker_id', :'w1_token'), 'AWCAP', NULL,
                 'a worker holding max_concurrency leases gets AWCAP for one more slot');
CREATE TEMP TABLE c2 AS SELECT * FROM awp.claim_tasks(:'py_worker_id', :'py_token', 1);
SELECT is((SELECT task_key || ':' || executor_kind FROM c2), 'py:python', 'the python worker gets the python task');
SELECT cmp_ok((SELECT fencing_token FROM c2), '>', (SELECT max(fencing_token) FROM c1), 'a later lease has a larger fencing token');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'py_worker_id', :'py_token'), 'AWCAP', NULL,
                 'at capacity it is AWCAP, not an empty answer');

-- Nothing to claim is an empty answer.
SELECT * FROM tests.register_worker('w4', '{mock,python}', 3) \gset w4_
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w4_worker_id', :'w4_token', 3)), 0::bigint, 'no pending dispatch: an empty answer');

-- A run whose cancellation was requested is not claimable.
SELECT tests.make_run('wf2') AS run2 \gset
SELECT tests.dispatch_all();
SELECT is((SELECT status FROM awp.dispatches WHERE run_id = :'run2'), 'pending', 'setup: a pending dispatch of run2');
UPDATE awp.runs SET cancel_requested_at = awp._now() WHERE run_id = :'run2';
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w4_worker_id', :'w4_token', 1)), 0::bigint,
          'a pending dispatch of a run with a cancel request is not handed out');
UPDATE awp.runs SET cancel_requested_at = NULL WHERE run_id = :'run2';
SELECT is((SELECT run_id FROM awp.claim_tasks(:'w4_worker_id', :'w4_token', 1)), :'run2', '... and is once the request is gone');

-- Draining.
SELECT is((SELECT status FROM awp.drain_worker(:'w1_worker_id', :'w1_token')), 'draining', 'setup: w1 drains while holding leases');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1)$$, :'w1_worker_id', :'w1_token'), 'AWDRN', NULL,
                 'a draining worker claiming is AWDRN');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, 'wrong', 1)$$, :'w1_worker_id'), 'AWSES', NULL,
                 'a draining worker with a wrong token is AWSES (session first)');

SELECT * FROM finish();
ROLLBACK;
