-- Lease recovery (docs/protocol.md, Lease recovery): a lease whose claim answer never reached its worker goes
-- back to the queue at the worker's next heartbeat, without counting against max_attempts, and a lease
-- granted after the heartbeat's marker (or to a request still waiting for its answer) is never released by it;
-- leases live through an outage (no coordinator pass) are renewed by their holders' heartbeats and resumed by
-- the first pass after it, and if they are lost anyway their attempts do not count either.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(73);

-- Leases are named by the test (a, b, ...: which task a claim gets is not fixed, the tasks are all alike).
CREATE TEMP TABLE l (name text, worker_id text, claim_seq bigint, dispatch_id text, lease_token text, run_id text,
                     task_key text);
-- tests.grab(worker, token, claim_seq, name): claim_tasks for one lease with that claim number, remembered in l
-- under that name; returns the name when a lease was granted.
CREATE FUNCTION tests.grab(p_worker text, p_token text, p_seq bigint, p_name text) RETURNS text LANGUAGE sql AS $$
  INSERT INTO l SELECT p_name, p_worker, p_seq, c.dispatch_id, c.lease_token, c.run_id, c.task_key
                  FROM awp.claim_tasks(p_worker, p_token, 1, p_seq) c
  RETURNING name
$$;
CREATE FUNCTION tests.ref(p_name text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('dispatch_id', dispatch_id, 'lease_token', lease_token) FROM l WHERE name = p_name
$$;
CREATE FUNCTION tests.refs(VARIADIC p_names text[]) RETURNS jsonb LANGUAGE sql AS $$
  SELECT coalesce(jsonb_agg(tests.ref(k) ORDER BY o), '[]') FROM unnest(p_names) WITH ORDINALITY AS u(k, o)
$$;
CREATE FUNCTION tests.key(p_name text) RETURNS text LANGUAGE sql AS $$ SELECT task_key FROM l WHERE name = p_name $$;
CREATE FUNCTION tests.dsp(p_name text) RETURNS awp.dispatches LANGUAGE sql AS $$
  SELECT d.* FROM awp.dispatches d JOIN l USING (dispatch_id) WHERE l.name = p_name
$$;
-- tests.att(name, attempt): that attempt of the named lease's task.
CREATE FUNCTION tests.att(p_name text, p_attempt integer DEFAULT 1) RETURNS awp.attempts LANGUAGE sql AS $$
  SELECT a.* FROM awp.attempts a JOIN l ON a.run_id = l.run_id AND a.task_key = l.task_key
   WHERE l.name = p_name AND a.attempt = p_attempt
$$;
CREATE FUNCTION tests.tsk(p_name text) RETURNS awp.tasks LANGUAGE sql AS $$
  SELECT t.* FROM awp.tasks t JOIN l ON t.run_id = l.run_id AND t.task_key = l.task_key WHERE l.name = p_name
$$;
-- tests.hb(worker, token, leases, claimed_through, pending, dropped): 'name=status' of each answered lease.
CREATE FUNCTION tests.hb(p_worker text, p_token text, p_leases jsonb, p_through bigint, p_pending bigint[] DEFAULT '{}',
                         p_dropped jsonb DEFAULT '[]') RETURNS text[] LANGUAGE sql AS $$
  SELECT coalesce(array_agg(coalesce(l.name, h.dispatch_id) || '=' || h.status ORDER BY h.ordinality), '{}')
    FROM awp.heartbeat(p_worker, p_token, p_leases, p_through, p_pending, p_dropped) WITH ORDINALITY h
    LEFT JOIN l ON l.dispatch_id = h.dispatch_id
$$;

-- ================================================================ a lost claim answer
SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 8) \gset w1_
SELECT tests.make_run('lost', jsonb_build_array(tests.task('t1'), tests.task('t2'), tests.task('t3'), tests.task('t4'),
                                                tests.task('t5'))) AS run \gset
SELECT tests.dispatch_all();
SELECT is(tests.grab(:'w1_worker_id', :'w1_token', 1, 'a'), 'a', 'setup: claim #1 leases a (its answer arrives)');
SELECT is(tests.grab(:'w1_worker_id', :'w1_token', 2, 'b'), 'b', 'setup: claim #2 leases b (its answer is lost)');
SELECT is(tests.grab(:'w1_worker_id', :'w1_token', 3, 'c'), 'c', 'setup: claim #3 leases c (still waiting for its answer)');
SELECT is(tests.grab(:'w1_worker_id', :'w1_token', 4, 'd'), 'd', 'setup: claim #4 leases d after the heartbeat below was composed');
INSERT INTO l SELECT 'e', :'w1_worker_id', NULL, c.dispatch_id, c.lease_token, c.run_id, c.task_key
                FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) c;
SELECT is((tests.dsp('b')).claim_seq, 2::bigint, 'a lease records the claim number of its request');
SELECT is((tests.dsp('e')).claim_seq, NULL, 'a claim without a number (an older worker) records none');
SELECT throws_ok(format($$SELECT * FROM awp.claim_tasks(%L, %L, 1, 0)$$, :'w1_worker_id', :'w1_token'), 'AWREQ',
                 'invalid claim_seq', 'claim_seq 0 is AWREQ');

SELECT tests.end_tx();
SELECT tests.advance('1 s') AS t1 \gset
-- The worker holds a, has claims #1-#3 behind it except #3 (pending): claimed_through 3, pending {3}.
SELECT is(tests.hb(:'w1_worker_id', :'w1_token', tests.refs('a'), 3, '{3}'), ARRAY['a=renewed'],
          'heartbeat with claimed_through 3 and claim #3 pending: a renewed');
SELECT is((tests.dsp('b')).uncounted || ' ' || ((tests.dsp('b')).lease_expires_at = :'t1'::timestamptz)::text,
          'not_received true', 'b (claim #2, not listed) is released: uncounted not_received, its lease ends now');
SELECT is((tests.dsp('b')).status, 'leased', '... and waits for the reaper (the heartbeat only ends the lease)');
SELECT is((tests.dsp('c')).uncounted, NULL, 'c (claim #3, still pending) is not released');
SELECT is((tests.dsp('d')).uncounted || (tests.dsp('d')).lease_expires_at::text, NULL,
          'the race: d (claim #4, granted after the marker 3 was composed) is not released nor shortened');
SELECT is((tests.dsp('e')).uncounted, NULL, 'e (no claim number: an older worker''s) is not released');
SELECT is((tests.dsp('a')).lease_expires_at, :'t1'::timestamptz + interval '15 s', 'a is renewed as usual');
SELECT is(tests.hb(:'w1_worker_id', :'w1_token', tests.refs('a', 'b'), 3, '{3}'), ARRAY['a=renewed', 'b=revoked'],
          'a late claim answer for b is of no use: a heartbeat listing it answers revoked');

-- Old workers (no claimed_through) keep today's behaviour: nothing unlisted is touched.
SELECT tests.advance('1 s');
SELECT is((SELECT array_agg(status) FROM awp.heartbeat(:'w1_worker_id', :'w1_token', tests.refs('a'))), ARRAY['renewed'],
          'a heartbeat without claimed_through renews what it lists');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND uncounted IS NOT NULL), 1::bigint,
          '... and releases nothing (only b, from before, is marked)');

-- The next pass ends b's attempt as not_received, not counted: the task is queued again at once.
SELECT tests.end_tx();
SELECT ok((tests.dispatch_all()->>'reaped')::integer >= 1, 'the next coordinator pass reaps b');
SELECT is((tests.att('b', 1)).status || ' counted=' || (tests.att('b', 1)).counted::text,
          'not_received counted=false', 'attempt b#1 is not_received and not counted');
SELECT is((tests.att('b', 1)).error_code, 'not_received', '... with error_code not_received');
SELECT is((SELECT t.status || ' ' || t.attempts || '/' || t.uncounted_attempts || ' of ' || t.max_attempts FROM tests.tsk('b') t),
          'queued 1/1 of 1',
          'task b (max_attempts 1) is queued again: 1 attempt made, 1 not counted');
SELECT is((tests.dsp('b')).status, 'expired', 'b''s dispatch expired');
SELECT results_eq(format($$SELECT entity_type, from_status, to_status, reason FROM awp.run_events(%L)
                            WHERE entity_key IN (%L, %L) AND to_status IN ('expired', 'not_received') ORDER BY sequence$$,
                         :'run', (tests.dsp('b')).dispatch_id, tests.key('b') || '#1'),
                  $$VALUES ('dispatch'::text, 'leased'::text, 'expired'::text, 'not received by its worker'::text),
                           ('attempt', 'running', 'not_received', 'not received by its worker')$$,
                  'the events say why: not received by its worker');
SELECT is((SELECT h->>'status' || ' ' || (h->>'counted') FROM awp.get_task(:'run', tests.key('b')) g, jsonb_array_elements(g.attempt_history) h
            WHERE (h->>'attempt')::integer = 1), 'not_received false', 'get_task''s attempt history shows it, not counted');
SELECT is((SELECT counted FROM awp.task_attempts(:'run', tests.key('b')) WHERE attempt = 1), false, 'so does task_attempts');

-- b runs again (attempt 2, the only counted one) and succeeds although max_attempts is 1.
SELECT tests.end_tx();
SELECT is(tests.grab(:'w1_worker_id', :'w1_token', 5, 'b2'), 'b2', 'claim #5 gets a lease');
SELECT is(tests.key('b2'), tests.key('b'), '... for b''s task again (attempt 2)');
SELECT tests.end_tx();
SELECT ok(tests.complete(:'w1_worker_id', :'w1_token', (tests.dsp('b2')).dispatch_id, (SELECT lease_token FROM l WHERE name = 'b2')),
          'its second attempt completes');
SELECT is((SELECT t.status || ' ' || t.attempts || '/' || t.uncounted_attempts FROM tests.tsk('b') t),
          'succeeded 2/1', 'task b succeeded: two attempts, one not counted');

-- dropped: a lease the worker gave up (local safety deadline) is marked, never released as not received,
-- never renewed; it ends as before, at its expiry, and counts.
SELECT tests.end_tx();
SELECT tests.advance('1 s') AS t3 \gset
SELECT is(tests.hb(:'w1_worker_id', :'w1_token', tests.refs('a', 'd'), 5, '{}', tests.refs('c')),
          ARRAY['a=renewed', 'd=renewed'], 'heartbeat with c dropped (claim #3 answered meanwhile)');
SELECT is((tests.dsp('c')).dropped_at, :'t3'::timestamptz, 'c is marked dropped');
SELECT is((tests.dsp('c')).uncounted, NULL, '... and not released (it was received)');
SELECT tests.advance('1 s');
SELECT is(tests.hb(:'w1_worker_id', :'w1_token', tests.refs('a', 'd'), 5), ARRAY['a=renewed', 'd=renewed'],
          'a later heartbeat no longer lists c');
SELECT is((tests.dsp('c')).uncounted, NULL, '... and c is still not released');
SELECT is((tests.dsp('c')).lease_expires_at, :'t0'::timestamptz + interval '15 s', '... nor renewed');
SELECT tests.end_tx();
SELECT tests.freeze(:'t0'::timestamptz + interval '15 s');
SELECT tests.dispatch_all();
SELECT is((tests.att('c', 1)).status || ' counted=' || (tests.att('c', 1)).counted::text,
          'interrupted counted=true', 'at its expiry c is reaped as before: interrupted, counted');
SELECT is((tests.tsk('c')).status, 'failed', '... so task c (max_attempts 1) failed');

-- Malformed lease recovery fields are AWREQ.
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]', -1)$$, :'w1_worker_id', :'w1_token'), 'AWREQ',
                 'invalid claims', 'claimed_through -1 is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]', 1, '{1,NULL}')$$, :'w1_worker_id', :'w1_token'),
                 'AWREQ', 'invalid claims', 'a null pending claim number is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]', 1, '{}', '[{"dispatch_id": 1}]')$$,
                        :'w1_worker_id', :'w1_token'), 'AWREQ', 'invalid dropped', 'a malformed dropped entry is AWREQ');
SELECT throws_ok(format($$SELECT * FROM awp.heartbeat(%L, %L, '[]', 1, '{}', '{}')$$, :'w1_worker_id', :'w1_token'),
                 'AWREQ', 'invalid dropped', 'dropped must be an array');
SELECT is_empty(format($$SELECT * FROM awp.check_invariants(ARRAY[%L])$$, :'run'), 'no invariant is violated');

-- ================================================================ an outage longer than a lease
SELECT tests.freeze('2030-01-01 01:00:00+00') AS u0 \gset
SELECT * FROM tests.register_worker('w2', '{mock}', 8) \gset w2_
SELECT * FROM tests.register_worker('w3', '{mock}', 8) \gset w3_
SELECT tests.make_run('outage', jsonb_build_array(tests.task('t1'), tests.task('t2'), tests.task('t3'), tests.task('t4'),
                                                  tests.task('t5'))) AS orun \gset
SELECT tests.end_tx();
SELECT tests.dispatch_all();   -- the last pass before the outage
SELECT is(tests.grab(:'w2_worker_id', :'w2_token', 1, 'p'), 'p', 'setup: w2 holds p (still running through the outage)');
SELECT is(tests.grab(:'w2_worker_id', :'w2_token', 2, 'q'), 'q', 'setup: w2 holds q (cut by its local safety deadline)');
SELECT is(tests.grab(:'w2_worker_id', :'w2_token', 3, 'r'), 'r', 'setup: w2 holds r (finished; its result is held)');
SELECT is(tests.grab(:'w3_worker_id', :'w3_token', 1, 's'), 's', 'setup: w3 holds s (and is gone during the outage)');
SELECT is(tests.grab(:'w3_worker_id', :'w3_token', 2, 't'), 't', 'setup: w3 holds t');

-- No coordinator pass for 20 s (lease 15 s): every lease ran out while nobody could renew it.
SELECT tests.end_tx();
SELECT tests.freeze(:'u0'::timestamptz + interval '20 s') AS u20 \gset
SELECT is((SELECT array_agg(status ORDER BY dispatch_id) FROM awp.heartbeat(:'w3_worker_id', :'w3_token', tests.refs('t'))),
          ARRAY['revoked'], 'an older worker''s heartbeat (no claimed_through) after the outage: its expired lease is revoked, as before');
SELECT is(tests.hb(:'w2_worker_id', :'w2_token', tests.refs('p', 'r'), 3, '{}', tests.refs('q')),
          ARRAY['p=renewed', 'r=renewed'], 'the first heartbeat after the outage renews the suspended leases it lists');
SELECT is((tests.dsp('p')).lease_expires_at, :'u20'::timestamptz + interval '15 s', '... for a full lease from now');
SELECT is((tests.dsp('q')).dropped_at, :'u20'::timestamptz, 'q (dropped) is marked, not renewed');
SELECT tests.end_tx();
SELECT ok(awp.complete_task(:'w2_worker_id', :'w2_token', (tests.dsp('r')).dispatch_id, (SELECT lease_token FROM l WHERE name = 'r'),
                            tests.result()), 'the result held through the outage (r) is accepted');

-- The first coordinator pass after the outage (a takeover after a gap) resumes every lease live before it.
SELECT tests.end_tx();
SELECT tests.advance('500 ms') AS u20b \gset
SELECT is((SELECT (x->>'resumed')::integer FROM awp.coordinator_tick(true) x), 4, 'the first pass after the outage resumes p, q, s and t');
SELECT is((tests.att('q', 1)).status || ' counted=' || (tests.att('q', 1)).counted::text,
          'interrupted counted=false', 'q (dropped during the outage) ends at once: interrupted, not counted');
SELECT is((tests.tsk('q')).status, 'queued', '... and task q (max_attempts 1) is queued again');
SELECT is((tests.dsp('s')).uncounted || ' ' || (tests.dsp('s')).lease_expires_at::text,
          'outage ' || (:'u20b'::timestamptz + interval '15 s')::text, 's (its holder gone) has one full lease from this pass');
SELECT is((tests.dsp('p')).uncounted, 'outage', 'p is marked too (its attempt would not count if lost)');
SELECT tests.end_tx();
SELECT ok(awp.complete_task(:'w2_worker_id', :'w2_token', (tests.dsp('p')).dispatch_id, (SELECT lease_token FROM l WHERE name = 'p'),
                            tests.result()), 'p, still running through the outage, completes');
SELECT is((tests.att('p', 1)).counted, true, '... a result counts as usual');

-- Nobody renews s and t: the pass after their grace reaps them, not counted (the run does not fail for it).
SELECT tests.end_tx();
SELECT tests.freeze(:'u20b'::timestamptz + interval '15 s');
SELECT ok((tests.dispatch_all()->>'reaped')::integer >= 2, 'one lease duration after the outage, s and t are reaped');
SELECT is((tests.att('s', 1)).status || ' counted=' || (tests.att('s', 1)).counted::text || ' '
          || (tests.att('s', 1)).error_message,
          'interrupted counted=false the lease expired before the attempt completed',
          's: interrupted, not counted');
SELECT is((SELECT array_agg(l.name || '=' || t.status ORDER BY l.name) FROM l JOIN awp.tasks t USING (run_id, task_key)
            WHERE l.run_id = :'orun'), ARRAY['p=succeeded', 'q=queued', 'r=succeeded', 's=queued', 't=queued'],
          'no task failed for the outage');
SELECT is((SELECT reason FROM awp.run_events(:'orun') WHERE entity_key = tests.key('s') || '#1' AND to_status = 'interrupted'),
          'lease expired after an outage', 'the event says after an outage');
SELECT is_empty(format($$SELECT * FROM awp.check_invariants(ARRAY[%L])$$, :'orun'), 'no invariant is violated');

-- ================================================================ not an outage
-- A takeover soon after the previous pass (less than a heartbeat interval) resumes nothing.
SELECT tests.freeze('2030-01-01 02:00:00+00') AS v0 \gset
SELECT tests.end_tx();
SELECT awp.request_cancel(:'orun');   -- its queued tasks would be claimed first
SELECT * FROM tests.register_worker('w4', '{mock}', 8) \gset w4_
SELECT tests.make_run('quick', jsonb_build_array(tests.task('t1'))) AS krun \gset
SELECT tests.end_tx();
SELECT tests.dispatch_all();
SELECT is(tests.grab(:'w4_worker_id', :'w4_token', 1, 'k'), 'k', 'setup: w4 holds k');
SELECT tests.end_tx();
SELECT tests.advance('4 s');
SELECT is((SELECT (x->>'resumed')::integer FROM awp.coordinator_tick(true) x), 0,
          'a takeover 4 s after the previous pass (heartbeat interval 5 s) resumes nothing');
SELECT is((tests.dsp('k')).uncounted, NULL, '... k is not marked');
-- A pass after a long gap without a takeover (the same coordinator, e.g. a DBA's pass) is not an outage either.
SELECT tests.end_tx();
SELECT tests.advance('20 s');
SELECT is((SELECT (x->>'resumed')::integer FROM awp.coordinator_tick() x), 0, 'a pass without takeover after 20 s resumes nothing');
SELECT is((tests.att('k', 1)).status || ' counted=' || (tests.att('k', 1)).counted::text,
          'interrupted counted=true', '... and reaps k as before: interrupted, counted');

-- At most 100 attempts of a task go uncounted: past that a lost lease counts, so no task retries without end.
SELECT tests.end_tx();
SELECT tests.make_run('cap', jsonb_build_array(tests.task('t1'))) AS crun \gset
UPDATE awp.tasks SET attempts = 100, uncounted_attempts = 100 WHERE run_id = :'crun';   -- as if 100 were lost
SELECT tests.end_tx();
SELECT is(tests.grab(:'w4_worker_id', :'w4_token', 2, 'cap'), 'cap', 'setup: w4 holds attempt 101 of a task with 100 uncounted');
SELECT tests.end_tx();
SELECT tests.advance('1 s');
SELECT is(tests.hb(:'w4_worker_id', :'w4_token', '[]', 2), '{}', 'its heartbeat shows it never received it');
SELECT tests.end_tx();
SELECT tests.dispatch_all();
SELECT is((tests.att('cap', 101)).status || ' counted=' || (tests.att('cap', 101)).counted::text || ' task '
          || (tests.tsk('cap')).status, 'not_received counted=true task failed',
          'the 101st lost attempt counts: the task (max_attempts 1) failed');

-- The checker sees an uncounted attempt that tasks.uncounted_attempts does not.
UPDATE awp.tasks SET uncounted_attempts = 0 WHERE run_id = :'orun' AND task_key = tests.key('s');
SELECT is(ARRAY(SELECT invariant FROM awp.check_invariants(ARRAY[:'orun'])), ARRAY['attempts_within_max'],
          'a wrong uncounted_attempts is an attempts_within_max violation');

SELECT * FROM finish();
ROLLBACK;
