-- The batch path of awp.complete_tasks (AWP issue 11): one worker's batch of successes of one run, asking for
-- every freed slot back, is settled set-based by the group path (awp._complete_and_refill_group, one worker's
-- items) and must write what that worker's completions would write one by one in the order given, each with its
-- claim on complete (awp.complete_and_claim per result, slots 1): the same rows, the same events in the same order
-- with the same reasons, one revision. Any other batch is settled item by item, each result with its own answer,
-- and nothing of a rolled-back group remains.
BEGIN;
\ir _fixtures.sql.inc
\ir _group_fixtures.sql.inc
SELECT plan(22);

SELECT tests.freeze('2026-01-01 00:00:00+00');
-- Two runs of one shape, one per executor kind (neither is in the other's fairness order): run g is settled by
-- batches, run s by single calls. d depends on a and comes before c in definition order: which result is settled
-- first decides which refill gets d. One worker of two slots each.
SELECT tests.make_run('g', tests.group_tasks('mock'), 1) AS g_run \gset
SELECT tests.make_run('s', tests.group_tasks('python'), 1) AS s_run \gset
CREATE TEMP TABLE w (run text PRIMARY KEY, worker_id text, token text);
INSERT INTO w SELECT :'g_run', r.* FROM tests.register_worker('g1', '{mock}', 2) r;
INSERT INTO w SELECT :'s_run', r.* FROM tests.register_worker('s1', '{python}', 2) r;
-- held: each run's leases. The runs start with concurrency 1 and get 2 before the second claim, a millisecond later
-- (two pending dispatches created at one instant would be claimed in dispatch_id order, at random); both runs at
-- the same instants, so that their events compare with their times.
CREATE TEMP TABLE held (run text, dispatch_id text PRIMARY KEY, lease_token text, task_key text);
CREATE FUNCTION pg_temp.claim_all() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  x record;
BEGIN
  FOR rank IN 1 .. 2 LOOP
    PERFORM tests.advance('1 millisecond');
    UPDATE awp.runs SET concurrency = rank WHERE run_id IN (SELECT w.run FROM w);
    FOR x IN SELECT * FROM w ORDER BY w.run LOOP
      INSERT INTO held SELECT x.run, c.dispatch_id, c.lease_token, c.task_key FROM tests.claim_one(x.worker_id, x.token) c;
    END LOOP;
  END LOOP;
END $$;
SELECT pg_temp.claim_all();
-- A run's results for complete_tasks: its leases in descending task_key order (b before a), or those named.
CREATE FUNCTION pg_temp.results(p_run text, p_keys text[] DEFAULT NULL) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_agg(jsonb_build_object('dispatch_id', h.dispatch_id, 'lease_token', h.lease_token,
                                      'result', tests.result('success', jsonb_build_object('x', h.task_key)))
                   ORDER BY h.task_key DESC)
    FROM held h WHERE h.run = p_run AND (p_keys IS NULL OR h.task_key = ANY (p_keys))
$$;
-- complete_tasks for a run's worker; its answer's leases replace the results' in held.
CREATE FUNCTION pg_temp.batch(p_run text, p_results jsonb, p_slots integer, p_claim_seq bigint DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  v jsonb;
BEGIN
  SELECT awp.complete_tasks(w.worker_id, w.token, p_results, p_slots, p_claim_seq) INTO v FROM w WHERE w.run = p_run;
  DELETE FROM held h WHERE h.dispatch_id IN (SELECT r->>'dispatch_id' FROM jsonb_array_elements(v->'results') r
                                             WHERE (r->>'applied')::boolean);
  INSERT INTO held SELECT p_run, l->>'dispatch_id', l->>'lease_token', l->>'task_key' FROM jsonb_array_elements(v->'leases') l;
  RETURN v;
END $$;
-- The single calls for run s: one awp.complete_and_claim per lease, in the order of pg_temp.results.
CREATE FUNCTION pg_temp.singles(p_run text, p_claim_seq bigint DEFAULT NULL) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  x record;
  c record;
BEGIN
  FOR x IN SELECT h.* FROM held h WHERE h.run = p_run ORDER BY h.task_key DESC LOOP
    SELECT l.* INTO c
      FROM w, awp.complete_and_claim(w.worker_id, w.token, x.dispatch_id, x.lease_token,
                                     tests.result('success', jsonb_build_object('x', x.task_key)), 1, p_claim_seq) l
     WHERE w.run = p_run;
    DELETE FROM held h WHERE h.dispatch_id = x.dispatch_id;
    INSERT INTO held SELECT p_run, c.dispatch_id, c.lease_token, c.task_key WHERE c.dispatch_id IS NOT NULL;
  END LOOP;
END $$;
-- A run's events made comparable (its one worker as W1).
CREATE FUNCTION pg_temp.events(p_run text) RETURNS text[] LANGUAGE sql AS $$
  SELECT tests.comparable_events(p_run, ARRAY(SELECT w.worker_id FROM w WHERE w.run = p_run))
$$;
SELECT tests.end_tx();

-- 1. A batch of both leases (b, then a), asking for both slots back: the batch path, one revision.
SELECT tests.rev(:'g_run') AS g_rev \gset
SELECT pg_temp.results(:'g_run') AS g_results \gset
SELECT pg_temp.batch(:'g_run', :'g_results', 2, 7) AS answer \gset
SELECT is((SELECT array_agg((r->>'dispatch_id') || '=' || (r->>'applied') ORDER BY o)
             FROM jsonb_array_elements(:'answer'::jsonb->'results') WITH ORDINALITY AS x(r, o)),
          (SELECT array_agg((e->>'dispatch_id') || '=true' ORDER BY o)
             FROM jsonb_array_elements(:'g_results'::jsonb) WITH ORDINALITY AS x(e, o)),
          'both results applied, answered in the order given');
SELECT is((SELECT array_agg(l->>'task_key' ORDER BY o) FROM jsonb_array_elements(:'answer'::jsonb->'leases') WITH ORDINALITY AS x(l, o)),
          '{c,d}'::text[], 'b''s freed slot gets c (d is not ready yet), a''s gets d, which a''s completion made ready');
SELECT is((SELECT (l->'upstream') FROM jsonb_array_elements(:'answer'::jsonb->'leases') l WHERE l->>'task_key' = 'd'),
          '{"a": {"x": "a"}}'::jsonb, 'd''s lease carries a''s output');
SELECT is((SELECT array_agg(d.worker_id || '/' || d.status || '/' || d.claim_seq || '/' || (d.lease_token_hash = awp._hash(l->>'lease_token'))
                            ORDER BY l->>'task_key')
             FROM jsonb_array_elements(:'answer'::jsonb->'leases') l JOIN awp.dispatches d ON d.dispatch_id = l->>'dispatch_id'),
          (SELECT array_fill(w.worker_id || '/leased/7/true', ARRAY[2]) FROM w WHERE w.run = :'g_run'),
          'each refill is leased to the worker with the token handed out and the request''s claim_seq');
SELECT is(tests.rev(:'g_run'), :g_rev::bigint + 1, 'one revision for the whole batch');
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run', 7);
SELECT tests.end_tx();
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'),
          'the same events as one complete_and_claim per result in the order given: order, reasons, times');
SELECT is(tests.task_rows(:'g_run'), tests.task_rows(:'s_run'), 'the same task and attempt rows');
SELECT ok(tests.sequences_contiguous(:'g_run') AND (SELECT count(*) FROM awp.check_invariants()) = 0,
          'sequences contiguous, invariants hold');

-- 2. Asking for more slots than it frees: the batch path still applies; the extra slot finds nothing to claim
--    (nothing waits: the batch path's own condition).
SELECT pg_temp.batch(:'g_run', pg_temp.results(:'g_run'), 3) AS answer \gset
SELECT is((SELECT array_agg(l->>'task_key' ORDER BY l->>'task_key') FROM jsonb_array_elements(:'answer'::jsonb->'leases') l),
          '{e,f}'::text[], 'two results, slots 3: e and f leased, nothing more');
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run');
SELECT tests.end_tx();
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'), 'still the same events as the single calls');

-- 3. The run's last tasks, one result per batch (f, then e: the single calls' order): no refill is left, so the
--    batch path steps aside (AWGRP inside, rolled back); the item loop settles them and the run succeeds.
SELECT pg_temp.batch(:'g_run', pg_temp.results(:'g_run', '{f}'), 1) -> 'leases' AS last_f \gset
SELECT pg_temp.batch(:'g_run', pg_temp.results(:'g_run', '{e}'), 1) -> 'leases' AS last_e \gset
SELECT is(:'last_f' || :'last_e' || '/' || tests.run_status(:'g_run'), '[][]/succeeded',
          'the last two results: no lease, run g succeeded');
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run');
SELECT tests.end_tx();
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'), 'the whole history equals the single calls''');
SELECT is(tests.task_rows(:'g_run'), tests.task_rows(:'s_run'), 'and so do the rows');

-- A new run h (three attempts per task), one worker of three slots holding a, b and c.
SELECT tests.make_run('h', (SELECT jsonb_agg(tests.task(k, '{}', '{"retry": {"max_attempts": 3, "interval_ms": 60000}}') ORDER BY k)
                             FROM unnest('{a,b,c,d,e,f,g,h,i}'::text[]) k), 3) AS h_run \gset
DELETE FROM w;
DELETE FROM held;
INSERT INTO w SELECT :'h_run', r.* FROM tests.register_worker('h1', '{mock}', 3) r;
SELECT awp.coordinator_tick();
INSERT INTO held SELECT :'h_run', c.dispatch_id, c.lease_token, c.task_key
  FROM w, awp.claim_tasks(w.worker_id, w.token, 3) c;
SELECT tests.end_tx();
-- 4. The group path's test in batch mode: one worker's items, >= 1 of them (a group of complete_and_claim_many
--    needs >= 2 distinct workers of one slot).
SELECT is(awp._group_path_kinds(
            (SELECT jsonb_agg(jsonb_build_object('worker_id', w.worker_id, 'session_token', w.token, 'dispatch_id', h.dispatch_id,
                                                 'lease_token', h.lease_token, 'result', tests.result(), 'slots', 1,
                                                 'claim_seq', NULL))
               FROM held h JOIN w USING (run) WHERE h.task_key = 'a'), true), '{mock}'::text[],
          'one worker''s single success: the batch path''s kinds');
SELECT is(awp._group_path_kinds(
            (SELECT jsonb_agg(jsonb_build_object('worker_id', w.worker_id, 'session_token', w.token, 'dispatch_id', h.dispatch_id,
                                                 'lease_token', h.lease_token, 'result', tests.result(), 'slots', 1,
                                                 'claim_seq', NULL))
               FROM held h JOIN w USING (run))), NULL,
          'the same worker twice is no group of complete_and_claim_many (one slot each, distinct workers)');

-- 5. Batches the batch path leaves to the item loop, each result answered on its own.
-- 5a. A wrong lease token on one result: the group is rolled back, that result lease_lost, the others applied.
SELECT pg_temp.batch(:'h_run', jsonb_set(pg_temp.results(:'h_run', '{a,b}'), '{0,lease_token}', '"wrong"'), 2) AS answer \gset
SELECT is((SELECT array_agg(coalesce(r->'error'->>'sqlstate', 'applied') ORDER BY o)
             FROM jsonb_array_elements(:'answer'::jsonb->'results') WITH ORDINALITY AS x(r, o)),
          '{AWLST,applied}'::text[], 'b (wrong token): lease_lost; a: applied');
SELECT is(tests.task_statuses(:'h_run'), '{a=succeeded,b=running,c=running,d=running,e=ready,f=ready,g=ready,h=ready,i=ready}'::text[],
          'a succeeded and its slot was refilled (d); b still runs: nothing of the rolled-back group remains');
SELECT tests.end_tx();
-- 5b. A failure among the results: not the batch path's; the failure retries, the success is refilled.
SELECT pg_temp.batch(:'h_run', jsonb_set(pg_temp.results(:'h_run', '{b,c}'), '{0,result}', tests.result('temporary_failure', NULL, 'boom')), 2) AS answer \gset
SELECT is((SELECT array_agg(r->>'applied' ORDER BY o) FROM jsonb_array_elements(:'answer'::jsonb->'results') WITH ORDINALITY AS x(r, o)),
          '{true,true}'::text[], 'a failure and a success in one batch: both applied');
SELECT is(tests.task_status(:'h_run', 'c') || '/' || tests.task_status(:'h_run', 'b'), 'waiting_retry/succeeded',
          'c waits for its retry, b succeeded');
SELECT tests.end_tx();
-- 5c. Asking for fewer slots than it frees: the freed slot it does not take back is refilled for anyone (a pending
--     dispatch), as complete_task refills it.
SELECT count(*) AS pending0 FROM awp.dispatches WHERE run_id = :'h_run' AND status = 'pending' \gset
SELECT pg_temp.batch(:'h_run', pg_temp.results(:'h_run', (SELECT array_agg(k) FROM (SELECT h.task_key AS k FROM held h
                                                           ORDER BY h.task_key LIMIT 2) y)), 1) AS answer \gset
SELECT is(jsonb_array_length(:'answer'::jsonb->'leases'), 1, 'two results, slots 1: one lease');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'h_run' AND status = 'pending'), :pending0::bigint + 1,
          'and one pending dispatch for the slot it did not ask back');
SELECT ok(tests.sequences_contiguous(:'h_run') AND (SELECT count(*) FROM awp.check_invariants()) = 0,
          'run h: sequences contiguous, invariants hold');
SELECT tests.end_tx();

SELECT * FROM finish();
ROLLBACK;
