-- awp.ready_queue (migration 0015_ready_queue, db/functions/_ready_queue.sql): the runs with ready tasks per executor
-- kind, in fairness order, kept by triggers through every way a task enters or leaves ready; awp._fairness_order
-- reads it, so a backlog of a kind nobody serves is never walked (AWP issue 46); check_invariants checks it.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(29);

-- 'kind=n@seq' per queue row of a run, by kind.
CREATE FUNCTION pg_temp.queue(p_run_id text) RETURNS text[] LANGUAGE sql AS $$
  SELECT coalesce(array_agg(q.executor_kind || '=' || q.ready_tasks || '@' || coalesce(q.last_dispatch_seq::text, '-')
                            ORDER BY q.executor_kind), '{}')
    FROM awp.ready_queue q WHERE q.run_id = p_run_id
$$;
-- Every run id a fairness cursor for kinds yields, in order.
CREATE FUNCTION pg_temp.order_of(p_kinds text[]) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
  c     refcursor := awp._fairness_order(p_kinds);
  v_run text;
  v_all text[] := '{}';
BEGIN
  LOOP
    FETCH c INTO v_run;
    EXIT WHEN NOT FOUND;
    v_all := v_all || v_run;
  END LOOP;
  CLOSE c;
  RETURN v_all;
END $$;
CREATE FUNCTION pg_temp.violations() RETURNS text[] LANGUAGE sql AS $$
  SELECT coalesce(array_agg(DISTINCT c.invariant), '{}') FROM awp.check_invariants() c
$$;

-- A run of two ready mock tasks, one ready python task and a mock task waiting for the python one.
SELECT tests.make_workflow('mixed', jsonb_build_array(tests.task('a'), tests.task('b'),
         tests.task('p', '{}', '{"executor": "python"}'), tests.task('c', '{p}')), 10);
SELECT awp.start_run('mixed') AS r1 \gset
SELECT is(pg_temp.queue(:'r1'), '{mock=2@-,python=1@-}', 'a run start queues its ready tasks per kind, never dispatched');
SELECT is((SELECT created_at FROM awp.ready_queue WHERE run_id = :'r1' LIMIT 1),
          (SELECT created_at FROM awp.runs WHERE run_id = :'r1'), 'with the run''s created_at');
SELECT is(pg_temp.violations(), '{}', 'check_invariants agrees');

-- A dispatch takes a task out of ready and moves the run's place: both show.
SELECT * FROM tests.register_worker('wm', '{mock}', 1) \gset wm_
SELECT * FROM tests.claim_one(:'wm_worker_id', :'wm_token') \gset l1_
SELECT is(pg_temp.queue(:'r1'),
          ARRAY['mock=1@' || (SELECT last_dispatch_seq FROM awp.runs WHERE run_id = :'r1'),
                'python=1@' || (SELECT last_dispatch_seq FROM awp.runs WHERE run_id = :'r1')],
          'a dispatch counts one mock task out, and every row of the run follows its last_dispatch_seq');
SELECT tests.end_tx();

-- A python worker takes p; its success makes c ready (a new ready mock task).
SELECT * FROM tests.register_worker('wp', '{python}', 1) \gset wp_
SELECT * FROM tests.claim_one(:'wp_worker_id', :'wp_token') \gset lp_
SELECT is(:'lp_task_key'::text, 'p', 'setup: the python worker holds p');
SELECT ok(NOT ('python' = ANY (SELECT executor_kind FROM awp.ready_queue WHERE run_id = :'r1')),
          'the last ready task of a kind gone: its row is deleted');
SELECT tests.end_tx();
SELECT ok(tests.complete(:'wp_worker_id', :'wp_token', :'lp_dispatch_id', :'lp_lease_token'), 'p succeeds');
SELECT tests.end_tx();
SELECT is(tests.task_status(:'r1', 'c'), 'ready', 'setup: c is ready');
SELECT alike((pg_temp.queue(:'r1'))[1], 'mock=2@%', 'a dependency met queues the dependant');
SELECT is(pg_temp.violations(), '{}', 'check_invariants agrees');

-- A retry: a failed attempt with retries left waits, then its promotion queues the task again.
SELECT tests.make_workflow('retry', jsonb_build_array(tests.task('x', '{}', '{"retry": {"max_attempts": 2, "interval_ms": 1000}}')), 10);
SELECT tests.freeze(now());
SELECT * FROM tests.register_worker('wr', '{mock}', 5) \gset wr_
SELECT awp.start_run('retry') AS r2 \gset
SELECT tests.end_tx();
SELECT dispatch_id AS d2, lease_token AS t2 FROM awp.claim_tasks(:'wr_worker_id', :'wr_token', 5) WHERE run_id = :'r2' \gset
SELECT tests.end_tx();
SELECT ok(tests.complete(:'wr_worker_id', :'wr_token', :'d2', :'t2', 'temporary_failure'), 'x fails once');
SELECT is(pg_temp.queue(:'r2'), '{}', 'waiting for its retry, x is not queued');
SELECT tests.end_tx();
SELECT tests.advance('2 seconds');
SELECT awp.promote_retries();
SELECT alike((pg_temp.queue(:'r2'))[1], 'mock=1@%', 'its promotion queues it again');
SELECT is(pg_temp.violations(), '{}', 'check_invariants agrees');

-- Cancel: the run's ready tasks are canceled and leave the queue; a run whose cancellation was requested is
-- not offered meanwhile.
SELECT tests.end_tx();
SELECT awp.request_cancel(:'r2');
SELECT awp.converge_cancellations();
SELECT is(pg_temp.queue(:'r2'), '{}', 'a canceled run has no queue row');

-- The fairness order: a backlog of a kind nobody serves (older runs, never dispatched) is not in a mock
-- worker's order at all; with both kinds, every run once, in fairness order, as the definition over awp.runs.
SELECT tests.end_tx();
SELECT tests.make_workflow('py', jsonb_build_array(tests.task('q', '{}', '{"executor": "python"}'),
                                                   tests.task('q2', '{}', '{"executor": "python"}')), 10);
SELECT count(awp.start_run('py')) FROM generate_series(1, 30);
SELECT tests.make_workflow('mk', jsonb_build_array(tests.task('m'), tests.task('n'), tests.task('o')), 1);
SELECT awp.start_run('mk') AS r3 \gset
SELECT is(tests.task_statuses(:'r3'), '{m=queued,n=ready,o=ready}', 'setup: the mock run got one dispatch at its start');
SELECT is(pg_temp.order_of('{mock}'), ARRAY[:'r1', :'r3'],
          'a mock order skips the 30 python-only runs (never dispatched, older): by last dispatch');
CREATE TEMP TABLE expected AS
  SELECT array_agg(x.run_id ORDER BY x.last_dispatch_seq NULLS FIRST, x.created_at, x.run_id) AS runs
    FROM awp.runs x
   WHERE x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL
     AND EXISTS (SELECT 1 FROM awp.tasks y WHERE y.run_id = x.run_id AND y.status = 'ready'
                    AND y.executor IN ('mock', 'python'));
SELECT is(cardinality((SELECT runs FROM expected)), 32, 'setup: 32 runs have a ready task of one of the kinds');
SELECT is(pg_temp.order_of('{mock,python}'), (SELECT runs FROM expected), 'two kinds: the same order, each run once');
SELECT is(pg_temp.order_of('{python,mock,python}'), (SELECT runs FROM expected), 'whatever the kinds'' order');
SELECT is(pg_temp.order_of('{}'), '{}'::text[], 'no kind: no run');
-- A run whose cancellation was requested while a lease runs (converged later) keeps its ready tasks, unoffered.
UPDATE awp.runs SET cancel_requested_at = now() WHERE run_id = :'r1';
SELECT is(pg_temp.order_of('{mock}'), ARRAY[:'r3'], 'a run whose cancellation was requested is not offered');
SELECT ok(NOT (:'r1' = ANY (pg_temp.order_of('{python,mock}'))), 'nor to a worker of several kinds');
UPDATE awp.runs SET cancel_requested_at = NULL WHERE run_id = :'r1';

-- Rows that go: a deleted ready task, TRUNCATE.
DELETE FROM awp.tasks WHERE run_id = :'r3' AND task_key = 'n';
SELECT alike((pg_temp.queue(:'r3'))[1], 'mock=1@%', 'a deleted ready task is counted out');

-- A run with ready tasks of two priorities has a row per priority; a task leaving ready counts down its own.
SELECT tests.make_run('prio', jsonb_build_array(tests.task('top', '{}', '{"priority": 9}'),
                                                tests.task('hi', '{}', '{"priority": 9}'), tests.task('lo1'),
                                                tests.task('lo2')), 1) AS rp \gset
SELECT is((SELECT array_agg(q.priority || '=' || q.ready_tasks ORDER BY q.priority) FROM awp.ready_queue q
            WHERE q.run_id = :'rp'), '{5=2,9=1}'::text[], 'a row per priority of the run''s ready tasks (top dispatched at its start)');
DELETE FROM awp.tasks WHERE run_id = :'rp' AND task_key = 'hi';
SELECT is((SELECT array_agg(q.priority || '=' || q.ready_tasks ORDER BY q.priority) FROM awp.ready_queue q
            WHERE q.run_id = :'rp'), '{5=2}'::text[], 'its last task of priority 9 gone, that row goes, the other stays');

-- check_invariants sees a queue that disagrees with the tasks.
UPDATE awp.ready_queue SET ready_tasks = 5 WHERE run_id = :'r3';
INSERT INTO awp.ready_queue VALUES (:'r1', 'shell', 1, NULL, now());
SELECT is((SELECT array_agg(c.entity_key ORDER BY c.entity_key) FROM awp.check_invariants() c WHERE c.invariant = 'ready_queue'),
          '{mock,shell}', 'check_invariants: a wrong count and a row without ready tasks are both reported');
SELECT is((SELECT count(*) FROM awp.check_invariants(ARRAY[:'r3']) c WHERE c.invariant = 'ready_queue'), 1::bigint,
          'and the run filter applies to the queue''s rows');

SET CONSTRAINTS ALL IMMEDIATE;  -- the deferred events trigger fires now: TRUNCATE needs none pending
TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.workers CASCADE;
SELECT is((SELECT count(*) FROM awp.ready_queue), 0::bigint, 'TRUNCATE empties the queue');

SELECT * FROM finish();
ROLLBACK;
