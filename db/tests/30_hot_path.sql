-- The hot path of claim on complete (awp._complete_and_refill, docs/protocol.md): a success whose lease is
-- current, in a run that goes on, is settled in one flat pass, with the checks folded into its writes. It must
-- write what the general path writes (awp._complete_task, then awp._lease_refill): the same rows, the same
-- events in the same order, one revision per transaction, and refuse what that path refuses.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(55);

SELECT tests.freeze('2026-01-01 00:00:00+00');
-- a and b first; c and d depend on a; e is independent. Concurrency 2.
SELECT tests.make_run('h', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c', '{a}'),
                                             tests.task('d', '{a}'), tests.task('e')), 2) AS run \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 1) \gset w2_
-- held: the leases claimed below, with their worker (which worker gets which task is up to the claim order).
CREATE TEMP TABLE held (worker_id text, token text, dispatch_id text, lease_token text, task_key text, run_id text,
                        lease_expires_at timestamptz);
CREATE FUNCTION pg_temp.claim(p_worker_id text, p_token text) RETURNS void LANGUAGE sql AS $$
  INSERT INTO held SELECT p_worker_id, p_token, c.dispatch_id, c.lease_token, c.task_key, c.run_id, c.lease_expires_at
    FROM tests.claim_one(p_worker_id, p_token) c
$$;
SELECT pg_temp.claim(:'w1_worker_id', :'w1_token');
SELECT pg_temp.claim(:'w2_worker_id', :'w2_token');
SELECT * FROM held WHERE task_key = 'a' \gset a_
SELECT * FROM held WHERE task_key = 'b' \gset b_
SELECT is(ARRAY(SELECT x FROM unnest(ARRAY[:'a_worker_id', :'b_worker_id']) x ORDER BY 1),
          ARRAY(SELECT x FROM unnest(ARRAY[:'w1_worker_id', :'w2_worker_id']) x ORDER BY 1), 'each worker holds one of a and b');
SELECT tests.end_tx();

-- 1. A success that unlocks dependants: the completion, the dependants made ready, then the refill leased.
SELECT tests.rev(:'run') AS rev1 \gset
SELECT tests.event_count(:'run') AS ev1 \gset
SELECT dispatch_id AS c_dispatch, lease_token AS c_lease, task_key AS c_key, upstream AS c_upstream,
       lease_expires_at AS c_expires
  FROM awp.complete_and_claim(:'a_worker_id', :'a_token', :'a_dispatch_id', :'a_lease_token',
                              tests.result('success', '{"x": 1}'), 1) \gset
SELECT is(:'c_key'::text, 'c', 'the refill leases the first ready task in definition order (c, just made ready)');
SELECT is(:'c_upstream'::jsonb, '{"a": {"x": 1}}'::jsonb, 'its lease carries the output of its dependency');
SELECT is((SELECT array_agg(entity_type || ':' || entity_key || ':' || coalesce(from_status, '-') || '>' || to_status
                            || ':' || reason ORDER BY sequence)
             FROM awp.events WHERE run_id = :'run' AND sequence > :ev1),
          ARRAY['dispatch:' || :'a_dispatch_id' || ':leased>completed:completed by ' || :'a_worker_id',
                'attempt:a#1:running>succeeded:success', 'task:a:running>succeeded:success',
                'task:c:waiting_dependencies>ready:dependencies succeeded',
                'task:d:waiting_dependencies>ready:dependencies succeeded',
                'task:c:ready>queued:dispatch created', 'dispatch:' || :'c_dispatch' || ':->pending:dispatch created',
                'dispatch:' || :'c_dispatch' || ':pending>leased:claimed by ' || :'a_worker_id',
                'task:c:queued>running:attempt 1 started', 'attempt:c#1:->running:claimed by ' || :'a_worker_id'],
          'the events of the general path, in its order, with its reasons');
SELECT is((SELECT count(DISTINCT revision) || '/' || min(revision) FROM awp.events WHERE run_id = :'run' AND sequence > :ev1),
          '1/' || (:rev1::bigint + 1), 'all of them carry the one new revision');
SELECT is(tests.rev(:'run'), :rev1::bigint + 1, 'the run''s revision moved once');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences stay contiguous');
SELECT is(tests.task_statuses(:'run'), '{a=succeeded,b=running,c=running,d=ready,e=ready}'::text[], 'the task states');
SELECT is((SELECT row(status, output, counted, finished_at = tests.now())::text FROM awp.attempts
            WHERE run_id = :'run' AND task_key = 'a'),
          row('succeeded', '{"x": 1}'::jsonb, true, true)::text, 'a''s attempt: succeeded, its output, counted');
SELECT is((SELECT row(status, finished_at IS NULL, ready_at IS NULL, pending_deps)::text FROM awp.tasks
            WHERE run_id = :'run' AND task_key = 'c'),
          row('running', true, true, 0)::text, 'c runs (not finished, no ready_at)');
SELECT is((SELECT unfinished_tasks FROM awp.runs WHERE run_id = :'run'), 4, 'four tasks left unfinished');
SELECT ok(awp.complete_task(:'a_worker_id', :'a_token', :'a_dispatch_id', :'a_lease_token',
                            tests.result('success', '{"x": 1}')),
          'the same result again is accepted (the result hash is the general path''s)');
SELECT throws_ok(format($$SELECT awp.complete_task(%L, %L, %L, %L, tests.result('success', '{"x": 2}'))$$,
                        :'a_worker_id', :'a_token', :'a_dispatch_id', :'a_lease_token'),
                 'AWCNF', NULL, 'another result for it is a result_conflict');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');
SELECT tests.end_tx();

-- 2. Run concurrency: with the run's limit lowered to 1 while two of its tasks run, a completion frees no room.
UPDATE awp.runs SET concurrency = 1 WHERE run_id = :'run';
SELECT is((SELECT count(*) FROM awp.complete_and_claim(:'b_worker_id', :'b_token', :'b_dispatch_id', :'b_lease_token',
                                                        tests.result(), 1)), 0::bigint,
          'c still runs and the limit is 1: b''s completion is refilled with nothing');
SELECT is(tests.task_statuses(:'run'), '{a=succeeded,b=succeeded,c=running,d=ready,e=ready}'::text[],
          'b succeeded; d and e wait');
SELECT is((SELECT count(*) FROM awp.dispatches WHERE run_id = :'run' AND status IN ('pending', 'leased')), 1::bigint,
          'one live dispatch: c''s');
UPDATE awp.runs SET concurrency = 2 WHERE run_id = :'run';
SELECT tests.end_tx();

-- 3. The lease's end is exclusive: a completion 1 ms before lease_expires_at is applied; at the instant, lease_lost.
SELECT tests.freeze(:'c_expires'::timestamptz - interval '1 millisecond');
SELECT dispatch_id AS d_dispatch, lease_token AS d_lease, task_key AS d_key, lease_expires_at AS d_expires
  FROM awp.complete_and_claim(:'a_worker_id', :'a_token', :'c_dispatch', :'c_lease', tests.result(), 1) \gset
SELECT is(tests.dispatch_status(:'c_dispatch'), 'completed', 'c completed 1 ms before its lease expires');
SELECT is(:'d_key'::text, 'd', 'and d leased in its place');
SELECT tests.end_tx();
SELECT tests.freeze(:'d_expires'::timestamptz);
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1)$$,
                        :'a_worker_id', :'a_token', :'d_dispatch', :'d_lease'),
                 'AWLST', NULL, 'at exactly lease_expires_at the completion is lease_lost');
SELECT is(tests.error_detail(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1)$$,
                                    :'a_worker_id', :'a_token', :'d_dispatch', :'d_lease')),
          'the lease has expired', 'with the general path''s detail');
SELECT is(ARRAY[tests.dispatch_status(:'d_dispatch'), tests.task_status(:'run', 'd')], '{leased,running}'::text[],
          'the refused completion changed nothing');

-- 4. Refusals come from the general path: a wrong token, another worker, a canceled run.
SELECT tests.freeze(:'d_expires'::timestamptz - interval '2 seconds');
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, 'wrong', tests.result(), 1)$$,
                        :'a_worker_id', :'a_token', :'d_dispatch'),
                 'AWLST', NULL, 'a wrong lease token is lease_lost');
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1)$$,
                        :'b_worker_id', :'b_token', :'d_dispatch', :'d_lease'),
                 'AWLST', NULL, 'another worker''s completion is lease_lost');
SELECT awp.request_cancel(:'run');
SELECT is(tests.error_detail(format($$SELECT * FROM awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1)$$,
                                    :'a_worker_id', :'a_token', :'d_dispatch', :'d_lease')),
          'the run is running (cancel requested)', 'a run whose cancellation was requested: lease_lost');
SELECT is(tests.dispatch_status(:'d_dispatch'), 'leased', 'nothing was written');
SELECT tests.dispatch_all();   -- the coordinator converges the cancellation
SELECT is(tests.run_status(:'run'), 'canceled', 'the run is canceled');
SELECT tests.end_tx();

-- 5. The refill goes to the first run in fairness order: a pending run that never had a dispatch.
SELECT tests.make_run('p', jsonb_build_array(tests.task('p1'), tests.task('p2'), tests.task('p3')), 1) AS prun \gset
SELECT tests.make_run('q', jsonb_build_array(tests.task('q1'), tests.task('q2')), 1) AS qrun \gset
SELECT pg_temp.claim(:'w1_worker_id', :'w1_token');
SELECT pg_temp.claim(:'w2_worker_id', :'w2_token');
SELECT * FROM held WHERE task_key = 'p1' \gset p_
SELECT tests.make_run('r', jsonb_build_array(tests.task('r1')), 1) AS rrun \gset
SELECT is(ARRAY[tests.run_status(:'prun'), tests.run_status(:'qrun'), tests.run_status(:'rrun')],
          '{running,running,pending}'::text[], 'p and q run; r waits, pending, for a free slot');
SELECT tests.end_tx();
SELECT tests.rev(:'prun') AS prev \gset
SELECT tests.rev(:'rrun') AS rrev \gset
SELECT tests.event_count(:'prun') AS pev \gset
SELECT task_key AS r_key, run_id AS r_run
  FROM awp.complete_and_claim(:'p_worker_id', :'p_token', :'p_dispatch_id', :'p_lease_token', tests.result(), 1) \gset
SELECT is(:'r_run'::text, :'rrun', 'the freed slot goes to r, first in fairness order');
SELECT is((SELECT array_agg(entity_type || ':' || coalesce(from_status, '-') || '>' || to_status || ':' || reason
                            ORDER BY sequence) FROM awp.events WHERE run_id = :'rrun'),
          ARRAY['run:->pending:run started', 'task:->ready:task created', 'run:pending>running:first dispatch',
                'task:ready>queued:dispatch created', 'dispatch:->pending:dispatch created',
                'dispatch:pending>leased:claimed by ' || :'p_worker_id', 'task:queued>running:attempt 1 started',
                'attempt:->running:claimed by ' || :'p_worker_id'],
          'r''s events: its first dispatch, leased at once');
SELECT is((SELECT array_agg(entity_type || ':' || coalesce(from_status, '-') || '>' || to_status ORDER BY sequence)
             FROM awp.events WHERE run_id = :'prun' AND sequence > :pev),
          '{dispatch:leased>completed,attempt:running>succeeded,task:running>succeeded}'::text[],
          'p''s events: the completion alone');
SELECT is(ARRAY[tests.rev(:'prun') - :prev::bigint, tests.rev(:'rrun') - :rrev::bigint], '{1,1}'::bigint[],
          'each run''s revision moved once');
SELECT ok(tests.sequences_contiguous(:'prun') AND tests.sequences_contiguous(:'rrun'), 'both runs'' sequences are contiguous');
SELECT is((SELECT row(status, started_at = tests.now(), last_dispatch_seq IS NOT NULL)::text FROM awp.runs WHERE run_id = :'rrun'),
          row('running', true, true)::text, 'r runs, started now, with its place in the fairness order');
SELECT tests.end_tx();

-- 6. complete_and_claim_many: an item of the general path (a failure: awp.log_state holds its run's state), then
--    one of the hot path, same run, one transaction: one revision, contiguous sequences.
SELECT awp.request_cancel(x) FROM unnest(ARRAY[:'prun', :'qrun', :'rrun']) x;
SELECT tests.dispatch_all();
SELECT tests.end_tx();
SELECT tests.make_run('s', jsonb_build_array(tests.task('s1'), tests.task('s2'), tests.task('s3')), 2) AS srun \gset
SELECT * FROM tests.register_worker('w3', '{mock}', 2) \gset w3_
SELECT tests.dispatch_all();
INSERT INTO held SELECT :'w3_worker_id', :'w3_token', c.dispatch_id, c.lease_token, c.task_key, c.run_id, c.lease_expires_at
  FROM awp.claim_tasks(:'w3_worker_id', :'w3_token', 2) c;
SELECT * FROM held WHERE task_key = 's1' \gset s1_
SELECT * FROM held WHERE task_key = 's2' \gset s2_
SELECT tests.end_tx();
SELECT tests.rev(:'srun') AS srev \gset
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok') || ':' || coalesce((m.lease).task_key, '-') ORDER BY m.item)
             FROM awp.complete_and_claim_many(jsonb_build_array(
               jsonb_build_object('worker_id', :'s1_worker_id', 'session_token', :'s1_token', 'dispatch_id', :'s1_dispatch_id',
                                  'lease_token', :'s1_lease_token', 'result', tests.result('temporary_failure', NULL),
                                  'slots', 0, 'claim_seq', null),
               jsonb_build_object('worker_id', :'s2_worker_id', 'session_token', :'s2_token', 'dispatch_id', :'s2_dispatch_id',
                                  'lease_token', :'s2_lease_token', 'result', tests.result(), 'slots', 1, 'claim_seq', null))) m),
          '{ok:-,ok:s3}'::text[], 'both items (one worker''s, settled in their order) applied; s3 leased');
SELECT is(tests.task_statuses(:'srun'), '{s1=failed,s2=succeeded,s3=running}'::text[], 'the task states (s1 had one attempt)');
SELECT is(tests.rev(:'srun'), :srev::bigint + 1, 'one revision for the transaction');
SELECT ok(tests.sequences_contiguous(:'srun'), 'sequences stay contiguous');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

-- 7. A refill over the lease payload limit: the hot path completes, then the fan-in it would lease fails at once
--    (lease_payload_too_large), as awp._lease_refill does on the general path; the run settles, failed.
SELECT tests.make_run('wide', (SELECT jsonb_agg(tests.task('p' || i)) FROM generate_series(1, 18) i)
                              || jsonb_build_array(tests.task('join', (SELECT array_agg('p' || i) FROM generate_series(1, 18) i))),
                      50) AS wrun \gset
SELECT * FROM tests.register_worker('w4', '{mock}', 18) \gset w4_
SELECT tests.dispatch_all();
INSERT INTO held SELECT :'w4_worker_id', :'w4_token', c.dispatch_id, c.lease_token, c.task_key, c.run_id, c.lease_expires_at
  FROM awp.claim_tasks(:'w4_worker_id', :'w4_token', 18) c;
SELECT is((SELECT count(*) FROM held WHERE run_id = :'wrun'), 18::bigint, 'setup: the 18 fan-out tasks are leased');
SELECT ok(bool_and(awp.complete_task(h.worker_id, h.token, h.dispatch_id, h.lease_token,
                                     jsonb_build_object('kind', 'success', 'output', jsonb_build_object('blob', repeat('y', 60000))))),
          'setup: 17 of them complete with 60 kB each')
  FROM held h WHERE h.run_id = :'wrun' AND h.task_key <> 'p18';
SELECT * FROM held WHERE run_id = :'wrun' AND task_key = 'p18' \gset p18_
SELECT tests.end_tx();
SELECT tests.rev(:'wrun') AS wrev \gset
SELECT is((SELECT count(*) FROM awp.complete_and_claim(:'p18_worker_id', :'p18_token', :'p18_dispatch_id', :'p18_lease_token',
                                                        jsonb_build_object('kind', 'success', 'output', jsonb_build_object('blob', repeat('y', 60000))), 1)),
          0::bigint, 'the last fan-out task completes; the fan-in is not handed out');
SELECT results_eq(format($$SELECT status, error_code FROM awp.task_attempts(%L, 'join')$$, :'wrun'),
                  $$VALUES ('failed'::text, 'lease_payload_too_large'::text)$$, 'its attempt failed with lease_payload_too_large');
SELECT is(ARRAY[tests.run_status(:'wrun'), tests.task_status(:'wrun', 'p18')], '{failed,succeeded}'::text[],
          'p18 succeeded and the run failed');
SELECT is(tests.rev(:'wrun'), :wrev::bigint + 1, 'one revision for the call');
SELECT ok(tests.sequences_contiguous(:'wrun'), 'sequences stay contiguous');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

-- 8. The last task of a run (a run of one task): the hot path completes it, the run settles as on the general
--    path (its event last, its output and task counts stored), and the refill comes from the next run.
SET LOCAL track_functions = 'all';
SELECT * FROM tests.register_worker('w5', '{python}', 1) \gset w5_
SELECT tests.make_workflow('one', jsonb_build_array(tests.task('x', '{}', '{"executor": "python"}')));
SELECT awp.start_run('one') AS o1 \gset
SELECT awp.start_run('one') AS o2 \gset
SELECT dispatch_id AS o1_dispatch, lease_token AS o1_lease, run_id AS o1_run FROM awp.claim_tasks(:'w5_worker_id', :'w5_token', 1) \gset
SELECT is(:'o1_run'::text, :'o1', 'setup: the older run''s task is leased');
SELECT tests.end_tx();
SELECT tests.rev(:'o1') AS orev \gset
SELECT tests.event_count(:'o1') AS oev \gset
SELECT coalesce(sum(calls), 0) AS general0 FROM pg_stat_xact_user_functions
 WHERE schemaname = 'awp' AND funcname = '_complete_task' \gset
SELECT run_id AS o_next FROM awp.complete_and_claim(:'w5_worker_id', :'w5_token', :'o1_dispatch', :'o1_lease',
                                                    tests.result('success', '{"v": 1}'), 1) \gset
SELECT is(:'o_next'::text, :'o2', 'the refill leases the next run''s task');
SELECT is((SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
            WHERE schemaname = 'awp' AND funcname = '_complete_task'), :general0::bigint,
          'the hot path took it (no call of the general path)');
SELECT is((SELECT array_agg(entity_type || ':' || coalesce(from_status, '-') || '>' || to_status || ':' || reason ORDER BY sequence)
             FROM awp.events WHERE run_id = :'o1' AND sequence > :oev),
          ARRAY['dispatch:leased>completed:completed by ' || :'w5_worker_id', 'attempt:running>succeeded:success',
                'task:running>succeeded:success', 'run:running>succeeded:all tasks succeeded'],
          'the events of the general path, the run''s last');
SELECT is((SELECT row(status, output, final_task_counts, finished_at = tests.now())::text FROM awp.runs WHERE run_id = :'o1'),
          row('succeeded', '{"x": {"v": 1}}'::jsonb, '{"succeeded": 1}'::jsonb, true)::text,
          'the run succeeded with its output and task counts');
SELECT is(tests.rev(:'o1'), :orev::bigint + 1, 'one revision for the call');
SELECT ok(tests.sequences_contiguous(:'o1'), 'sequences stay contiguous');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');

SELECT * FROM finish();
ROLLBACK;
