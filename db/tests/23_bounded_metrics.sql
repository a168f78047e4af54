-- /metrics stays bounded: awp.metrics_snapshot() reads no row of awp.runs and no ended worker, and only
-- live rows of tasks and dispatches, whatever the number of finished runs (20,000 planted here); its run
-- and worker counts come from awp.status_counts (triggers + compaction) and equal the tables.
-- Rows read are this transaction's own table statistics (pg_stat_xact_user_tables): exact, no timing.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(12);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT tests.make_workflow('wf');
SELECT tests.make_workflow('wfpy', jsonb_build_array(tests.task('a', '{}', '{"executor": "python"}')));

-- 20,000 finished runs with a task and a dispatch each, and 2,000 ended worker sessions.
INSERT INTO awp.runs (run_id, workflow_id, workflow_version, status, concurrency, created_at, started_at, finished_at)
SELECT 'run_old' || g, 'wf', 1, 'succeeded', 1, :'t0'::timestamptz - interval '1 day', :'t0'::timestamptz - interval '1 day',
       :'t0'::timestamptz - interval '1 day' FROM generate_series(1, 20000) g;
INSERT INTO awp.tasks (run_id, task_key, ordinal, executor, action, input, depends_on, dependants, pending_deps,
                       max_attempts, interval_ms, timeout_ms, status, updated_at, finished_at)
SELECT 'run_old' || g, 'a', 0, 'mock', 'noop', '{}', '{}', '{}', 0, 1, 0, 1000, 'canceled', :'t0', :'t0'
  FROM generate_series(1, 20000) g;
INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, status, created_at, finished_at)
SELECT 'dsp_old' || g, 'run_old' || g, 'a', 'mock', 'canceled', :'t0', :'t0' FROM generate_series(1, 20000) g;
INSERT INTO awp.workers (worker_id, display_name, executor_kinds, max_concurrency, protocol_version, session_token_hash,
                         status, registered_at, last_heartbeat_at, stopped_at)
SELECT 'wkr_old' || g, 'old', '{mock}', 1, 1, sha256('x'), 'stopped', :'t0', :'t0', :'t0' FROM generate_series(1, 2000) g;

-- Live rows: a leased task, ready tasks nobody can take, a pending dispatch, two active workers.
SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 1) \gset w2_
SELECT tests.make_run('wf') AS r1 \gset
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT tests.make_run('wf') AS r2 \gset
SELECT tests.make_run('wfpy') FROM generate_series(1, 3);
SELECT awp.create_dispatches();
ANALYZE awp.runs, awp.tasks, awp.dispatches, awp.workers, awp.status_counts;
SELECT cmp_ok(awp._compact_status_counts(), '>=', 22000, 'the deltas of the planted rows are folded');

CREATE TEMP TABLE before AS
SELECT relname, seq_scan, seq_tup_read, coalesce(idx_tup_fetch, 0) AS idx_tup_fetch
  FROM pg_stat_xact_user_tables WHERE schemaname = 'awp';
SELECT awp.metrics_snapshot() AS m \gset
CREATE TEMP TABLE read_rows AS
SELECT s.relname, s.seq_scan - coalesce(b.seq_scan, 0) AS seq_scans,
       (s.seq_tup_read - coalesce(b.seq_tup_read, 0)) + (coalesce(s.idx_tup_fetch, 0) - coalesce(b.idx_tup_fetch, 0)) AS tuples
  FROM pg_stat_xact_user_tables s LEFT JOIN before b USING (relname) WHERE s.schemaname = 'awp';

SELECT is(:'m'::jsonb->'runs', (SELECT jsonb_object_agg(status, n) FROM (SELECT status, count(*) AS n FROM awp.runs GROUP BY 1) x),
          'runs by status are right');
SELECT is(:'m'::jsonb->'workers', jsonb_build_object('stopped', 2000, 'active', 2), 'workers by status are right');
SELECT is(:'m'::jsonb->'dispatches', jsonb_build_object('leased', 1, 'pending', 1), 'live dispatches are right');
SELECT is(:'m'::jsonb->'ready_without_worker', jsonb_build_object('python', 3), 'ready tasks without a worker are right');
SELECT is((SELECT tuples FROM read_rows WHERE relname = 'runs'), 0::bigint, 'the snapshot reads no row of awp.runs');
SELECT cmp_ok((SELECT tuples FROM read_rows WHERE relname = 'workers'), '<=', 10::bigint,
              'the snapshot reads only live worker rows (not the 2,000 ended ones)');
SELECT cmp_ok((SELECT tuples FROM read_rows WHERE relname = 'tasks'), '<=', 10::bigint,
              'the snapshot reads only ready tasks (not the 20,000 finished ones)');
SELECT cmp_ok((SELECT tuples FROM read_rows WHERE relname = 'dispatches'), '<=', 10::bigint,
              'the snapshot reads only live dispatches (not the 20,000 finished ones)');


-- The counts follow every way rows go: DELETE (statement trigger) and TRUNCATE.
DELETE FROM awp.runs WHERE run_id IN (SELECT run_id FROM awp.runs WHERE run_id LIKE 'run_old%' LIMIT 500);
SELECT is(awp.metrics_snapshot()->'runs'->>'succeeded', '19500', 'a DELETE of runs is counted');
SET CONSTRAINTS ALL IMMEDIATE;  -- the deferred events trigger fires now: TRUNCATE needs none pending
TRUNCATE awp.events, awp.dispatches, awp.tasks, awp.runs, awp.workers CASCADE;
SELECT is(awp.metrics_snapshot()->'runs', '{}'::jsonb, 'TRUNCATE empties the run counts');
SELECT is(awp.metrics_snapshot()->'workers', '{}'::jsonb, 'TRUNCATE empties the worker counts');

SELECT * FROM finish();
ROLLBACK;
