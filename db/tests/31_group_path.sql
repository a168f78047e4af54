-- The group path of awp.complete_and_claim_many (awp._complete_and_refill_group, AWP issue 11): a group of
-- hot-path items is settled set-based, and must write what the item loop writes, items in its order (worker_id,
-- then position): the same rows, the same events in the same order with the same reasons, one revision. The
-- reference is the same run shape settled by one awp.complete_and_claim per worker in that order.
-- When the group path does not apply, nothing of it remains and every item gets its own answer.
BEGIN;
\ir _fixtures.sql.inc
\ir _group_fixtures.sql.inc
SELECT plan(30);

SELECT tests.freeze('2026-01-01 00:00:00+00');
-- Two runs of one shape, one per executor kind (so neither is in the other's fairness order): run g is settled
-- by the group path, run s by single calls. d depends on a and comes before c in definition order, so which
-- item is settled first decides who gets d (the order is what is tested). Concurrency 2, two workers each.
SELECT tests.make_run('g', tests.group_tasks('mock'), 1) AS g_run \gset
SELECT tests.make_run('s', tests.group_tasks('python'), 1) AS s_run \gset
CREATE TEMP TABLE w (run text, worker_id text, token text);
INSERT INTO w SELECT :'g_run', r.* FROM tests.register_worker('g1', '{mock}', 1) r;
INSERT INTO w SELECT :'g_run', r.* FROM tests.register_worker('g2', '{mock}', 1) r;
INSERT INTO w SELECT :'s_run', r.* FROM tests.register_worker('s1', '{python}', 1) r;
INSERT INTO w SELECT :'s_run', r.* FROM tests.register_worker('s2', '{python}', 1) r;
-- held: each worker's current lease. In each run the first worker (worker_id order) holds a and the second b:
-- the runs start with concurrency 1 and get 2 before the second claim, a millisecond later (two pending
-- dispatches created at one instant would be claimed in dispatch_id order, at random). Both runs at the same
-- instants, so that their events compare with their times.
CREATE TEMP TABLE held (worker_id text PRIMARY KEY, dispatch_id text, lease_token text, task_key text);
CREATE FUNCTION pg_temp.claim_all() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  x record;
BEGIN
  FOR rank IN 1 .. 2 LOOP
    PERFORM tests.advance('1 millisecond');
    UPDATE awp.runs SET concurrency = rank WHERE run_id IN (SELECT w.run FROM w);
    FOR x IN SELECT * FROM (SELECT w.*, row_number() OVER (PARTITION BY w.run ORDER BY w.worker_id) AS n FROM w) y
              WHERE y.n = rank ORDER BY y.run LOOP
      INSERT INTO held SELECT x.worker_id, c.dispatch_id, c.lease_token, c.task_key FROM tests.claim_one(x.worker_id, x.token) c;
    END LOOP;
  END LOOP;
END $$;
SELECT pg_temp.claim_all();
-- pg_temp.two_holders(run, prefix, kind): w and held start over with two new workers of one slot of that kind, the
-- first holding a, the second b (pg_temp.claim_all).
CREATE FUNCTION pg_temp.two_holders(p_run text, p_prefix text, p_kind text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM w;
  DELETE FROM held;
  INSERT INTO w SELECT p_run, r.* FROM tests.register_worker(p_prefix || '1', ARRAY[p_kind], 1) r;
  INSERT INTO w SELECT p_run, r.* FROM tests.register_worker(p_prefix || '2', ARRAY[p_kind], 1) r;
  PERFORM pg_temp.claim_all();
END $$;
-- The items of run g's workers (position 1 = the worker that holds b, so the loop's order differs from it).
CREATE FUNCTION pg_temp.items(p_run text, p_output jsonb DEFAULT '{"x": 1}') RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_agg(jsonb_build_object('worker_id', w.worker_id, 'session_token', w.token, 'dispatch_id', h.dispatch_id,
                                      'lease_token', h.lease_token, 'result', tests.result('success', p_output),
                                      'slots', 1, 'claim_seq', NULL) ORDER BY h.task_key DESC)
    FROM w JOIN held h USING (worker_id) WHERE w.run = p_run
$$;
-- The single calls for run s, in worker_id order; each worker's new lease is remembered.
CREATE FUNCTION pg_temp.singles(p_run text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  x record;
  c record;
BEGIN
  FOR x IN SELECT w.worker_id, w.token, h.dispatch_id, h.lease_token FROM w JOIN held h USING (worker_id)
            WHERE w.run = p_run ORDER BY w.worker_id LOOP
    SELECT * INTO c FROM awp.complete_and_claim(x.worker_id, x.token, x.dispatch_id, x.lease_token,
                                                tests.result('success', '{"x": 1}'), 1);
    UPDATE held SET dispatch_id = c.dispatch_id, lease_token = c.lease_token, task_key = c.task_key
     WHERE worker_id = x.worker_id;
  END LOOP;
END $$;
-- A run's events made comparable, its workers named by their rank (worker_id order).
CREATE FUNCTION pg_temp.events(p_run text) RETURNS text[] LANGUAGE sql AS $$
  SELECT tests.comparable_events(p_run, ARRAY(SELECT w.worker_id FROM w WHERE w.run = p_run ORDER BY w.worker_id))
$$;
SELECT tests.end_tx();

-- 1. The group path itself (called directly: it must apply, or this raises and the file fails).
SELECT tests.rev(:'g_run') AS g_rev \gset
SELECT pg_temp.items(:'g_run') AS g_items \gset
CREATE TEMP TABLE got AS SELECT g.item AS pos, (g.lease).* FROM awp._complete_and_refill_group(:'g_items') g;
SELECT is((SELECT count(*) FROM got), 2::bigint, 'the group path applies: a lease for each of the two items');
SELECT is((SELECT array_agg(task_key ORDER BY pos) FROM got), '{c,d}'::text[],
          'item 1 (b''s worker, settled second) gets c; item 2 (a''s worker, first) gets d, which a''s completion made ready');
SELECT is((SELECT array_agg(upstream ORDER BY pos) FROM got), ARRAY['{}', '{"a": {"x": 1}}']::jsonb[],
          'd''s lease carries a''s output');
UPDATE held h SET dispatch_id = g.dispatch_id, lease_token = g.lease_token, task_key = g.task_key
  FROM got g WHERE h.worker_id = (:'g_items'::jsonb)->(g.pos - 1)->>'worker_id';
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run');
SELECT tests.end_tx();
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'),
          'the same events as one call per worker in worker_id order: order, reasons, times');
SELECT is(tests.task_rows(:'g_run'), tests.task_rows(:'s_run'), 'the same task and attempt rows');
SELECT is(tests.rev(:'g_run'), :g_rev::bigint + 1, 'one revision for the whole group');
SELECT ok(tests.sequences_contiguous(:'g_run'), 'sequences stay contiguous');
SELECT is((SELECT array_agg(d.worker_id || '/' || d.status || '/' || (d.lease_token_hash = awp._hash(g.lease_token))
                            || '/' || d.fencing_token ORDER BY g.pos)
             FROM got g JOIN awp.dispatches d USING (dispatch_id)),
          (SELECT array_agg(((:'g_items'::jsonb)->(g.pos - 1)->>'worker_id') || '/leased/true/' || g.fencing_token
                            ORDER BY g.pos) FROM got g),
          'each new dispatch is leased to its item''s worker, with the token and fencing token handed out');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

-- 2. Through awp.complete_and_claim_many: the next two completions (refills e and f) as the single calls. Three
--    seconds later: more than half a heartbeat interval, so each worker's claim is noted as its sign of life.
SELECT tests.advance('3 seconds');
SELECT pg_temp.items(:'g_run') AS g_items \gset
CREATE TEMP TABLE got2 AS SELECT m.item AS pos, m.error, (m.lease).* FROM awp.complete_and_claim_many(:'g_items') m;
SELECT is((SELECT count(*) FROM got2 WHERE error IS NULL AND dispatch_id IS NOT NULL), 2::bigint,
          'complete_and_claim_many answers each item with its lease');
SELECT is((SELECT array_agg(x.last_heartbeat_at = awp._now()) FROM awp.workers x JOIN w USING (worker_id) WHERE w.run = :'g_run'),
          '{t,t}'::boolean[], 'each worker of the group is noted alive (last_heartbeat_at now)');
SELECT is((SELECT array_agg(task_key ORDER BY task_key) FROM got2), '{e,f}'::text[], 'e and f are leased');
UPDATE held h SET dispatch_id = g.dispatch_id, lease_token = g.lease_token, task_key = g.task_key
  FROM got2 g WHERE h.worker_id = (:'g_items'::jsonb)->(g.pos - 1)->>'worker_id';
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run');
SELECT tests.end_tx();
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'), 'still the same events as the single calls');

-- 3. A group whose refill is not possible for every item (two unfinished tasks left, both in the group: the run
--    ends) is not the group path's: the items are settled one by one, as the single calls.
SELECT throws_ok(format('SELECT * FROM awp._complete_and_refill_group(%L)', pg_temp.items(:'g_run')), 'AWGRP', NULL,
                 'the group path refuses the run''s last tasks (AWGRP, a private code)');
SELECT is((SELECT count(*) FROM awp.complete_and_claim_many(pg_temp.items(:'g_run')) m WHERE m.error IS NULL AND (m.lease).dispatch_id IS NULL),
          2::bigint, 'both items applied, no lease (nothing is left)');
SELECT tests.end_tx();
SELECT pg_temp.singles(:'s_run');
SELECT tests.end_tx();
SELECT is(tests.run_status(:'g_run'), 'succeeded', 'run g succeeded');
SELECT is(pg_temp.events(:'g_run'), pg_temp.events(:'s_run'), 'the whole history equals the single calls''');

-- 4. A refused item in a group: the group is rolled back, each item gets its own answer.
SELECT tests.make_run('h', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'), tests.task('d'),
                                             tests.task('e'), tests.task('f'), tests.task('g')), 1) AS h_run \gset
SELECT pg_temp.two_holders(:'h_run', 'h', 'mock');
SELECT tests.end_tx();
SELECT pg_temp.items(:'h_run') AS h_items \gset
CREATE TEMP TABLE got3 AS   -- item 2 (a's worker) with a wrong lease token
  SELECT m.item AS pos, m.error, (m.lease).* FROM awp.complete_and_claim_many(jsonb_set(:'h_items', '{1,lease_token}', '"wrong"')) m;
SELECT is((SELECT error->>'sqlstate' FROM got3 WHERE pos = 2), 'AWLST', 'the item with a wrong lease token: lease_lost');
SELECT is((SELECT task_key FROM got3 WHERE pos = 1), 'c', 'the other item is applied and refilled');
SELECT is(tests.task_statuses(:'h_run'), '{a=running,b=succeeded,c=running,d=ready,e=ready,f=ready,g=ready}'::text[],
          'nothing of the rolled-back group remains: a still runs');
SELECT ok(tests.sequences_contiguous(:'h_run') AND (SELECT count(*) FROM awp.check_invariants()) = 0,
          'sequences contiguous, invariants hold');
UPDATE held h SET dispatch_id = g.dispatch_id, lease_token = g.lease_token, task_key = g.task_key
  FROM got3 g WHERE g.pos = 1 AND h.worker_id = (:'h_items'::jsonb)->0->>'worker_id';
SELECT tests.end_tx();
-- An item with a wrong session token: the group path's session check raises AWSES inside; rolled back, that item
-- is answered AWSES as its own call, the other applied and refilled.
SELECT pg_temp.items(:'h_run') AS h_items \gset
CREATE TEMP TABLE got5 AS   -- item 2 (a's worker again) with a wrong session token
  SELECT m.item AS pos, m.error, (m.lease).* FROM awp.complete_and_claim_many(jsonb_set(:'h_items', '{1,session_token}', '"wrong"')) m;
SELECT is((SELECT error->>'sqlstate' FROM got5 WHERE pos = 2), 'AWSES', 'the item with a wrong session token: worker_session_invalid');
SELECT is((SELECT task_key FROM got5 WHERE pos = 1), 'd', 'the other item is applied and refilled');
UPDATE held h SET dispatch_id = g.dispatch_id, lease_token = g.lease_token, task_key = g.task_key
  FROM got5 g WHERE g.pos = 1 AND h.worker_id = (:'h_items'::jsonb)->0->>'worker_id';
SELECT tests.end_tx();

-- 5. Another run with ready work of the workers' kinds: the refills go there in fairness order (they take turns),
--    as the item loop's would; the group path settles such a group too (db/tests/34_group_path_runs.sql compares
--    random groups over several runs with the item loop).
SELECT tests.make_run('k', jsonb_build_array(tests.task('x'), tests.task('y')), 1) AS k_run \gset
-- x is claimed by a worker of its own (no pending dispatch is left to claim), then k gets room for y.
SELECT * FROM tests.register_worker('k1', '{mock}', 1) \gset k1_
SELECT task_key AS k1_task FROM tests.claim_one(:'k1_worker_id', :'k1_token') \gset
UPDATE awp.runs SET concurrency = 2 WHERE run_id = :'k_run';
SELECT is(:'k1_task' || '/' || (SELECT count(*) FROM awp._claim_candidates), 'x/0',
          'run k: x runs, y is ready, no dispatch waits to be claimed');
SELECT pg_temp.items(:'h_run') AS h_items \gset
CREATE TEMP TABLE got6 AS SELECT g.item AS pos, (g.lease).* FROM awp._complete_and_refill_group(:'h_items') g;
SELECT is((SELECT array_agg(run_id || '/' || task_key ORDER BY worker_id)
             FROM got6 JOIN (SELECT (:'h_items'::jsonb)->(o - 1)->>'worker_id' AS worker_id, o
                               FROM generate_series(1, 2) o) i ON i.o = got6.pos),
          ARRAY[:'h_run' || '/e', :'k_run' || '/y'],
          'the first item (worker_id order) is refilled from run h (its latest dispatch is older than k''s), the second from run k: they take turns');
SELECT ok(tests.sequences_contiguous(:'h_run') AND tests.sequences_contiguous(:'k_run')
          AND (SELECT count(*) FROM awp.check_invariants()) = 0,
          'both runs'' sequences contiguous, invariants hold');

-- 6. A lease that expired (the reaper has not settled it yet) in a group: the group path's single write of the
--    dispatches (a MERGE: the completions matched, the refills inserted) completes only current leases, and a
--    completion it did not write must undo the whole group, refills included. The items are then settled one by
--    one: that item lease_lost, the other applied and refilled. Own kind and run (runs h and k have ready work).
SELECT tests.make_run('m', (SELECT jsonb_agg(tests.task(k, '{}', '{"executor": "python"}') ORDER BY k)
                             FROM unnest('{a,b,c,d}'::text[]) k), 1) AS m_run \gset
SELECT pg_temp.two_holders(:'m_run', 'm', 'python');
SELECT tests.end_tx();
SELECT pg_temp.items(:'m_run') AS m_items \gset
UPDATE awp.dispatches SET lease_expires_at = awp._now()   -- item 2 (a's worker): its lease expires now
 WHERE dispatch_id = (SELECT dispatch_id FROM held WHERE task_key = 'a');
SELECT throws_ok(format('SELECT * FROM awp._complete_and_refill_group(%L)', :'m_items'), 'AWGRP', NULL,
                 'the group path refuses a group with an expired lease');
CREATE TEMP TABLE got4 AS SELECT m.item AS pos, m.error, (m.lease).* FROM awp.complete_and_claim_many(:'m_items') m;
SELECT is((SELECT error->>'sqlstate' || ' ' || (error->>'detail') FROM got4 WHERE pos = 2), 'AWLST the lease has expired',
          'the item with the expired lease: lease_lost, as its own call');
SELECT is((SELECT task_key FROM got4 WHERE pos = 1), 'c', 'the other item is applied and refilled');
SELECT ok(tests.task_statuses(:'m_run') = '{a=running,b=succeeded,c=running,d=ready}'::text[]
          AND (SELECT count(*) FROM awp.dispatches WHERE run_id = :'m_run') = 3
          AND tests.sequences_contiguous(:'m_run') AND (SELECT count(*) FROM awp.check_invariants()) = 0,
          'nothing of the refused group remains: a still runs, one refill; sequences contiguous, invariants hold');

SELECT * FROM finish();
ROLLBACK;
