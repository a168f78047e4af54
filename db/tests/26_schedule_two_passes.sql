-- Exactly once per fire time under two concurrent coordinator passes, with two real sessions (dblink):
-- pass A fires a due schedule and keeps its transaction open; pass B, at the same moment, skips the
-- locked schedule row (no second run, no wait); after A commits, B finds the fire time done. The rows
-- are committed by the dblink sessions (on the real clock), so the file removes them at its end.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(9);

CREATE EXTENSION IF NOT EXISTS dblink;
SELECT format('host=%s port=%s dbname=%s user=%s', split_part(current_setting('unix_socket_directories'), ',', 1),
              current_setting('port'), current_database(), current_user) AS cs \gset
SELECT 'two-pass-' || substr(md5(random()::text), 1, 8) AS wf \gset
SELECT dblink_connect('setup', :'cs'), dblink_connect('a', :'cs'), dblink_connect('b', :'cs');

-- A workflow and a 1-second interval schedule, committed; then wait until its first fire time is due.
SELECT * FROM dblink('setup', format($$SELECT 1 FROM awp.create_workflow_version('{"id": "%s", "tasks": [{"key": "t", "executor": "mock"}]}')$$, :'wf')) AS x(one integer);
SELECT * FROM dblink('setup', format($$SELECT 1 FROM awp.create_schedule(%L, %L, interval_ms => 1000, input => '{"n": 1}')$$, :'wf', :'wf')) AS x(one integer);
SELECT pg_sleep(greatest(0, extract(epoch FROM (SELECT next_fire_at FROM awp.schedules WHERE schedule_id = :'wf') - clock_timestamp())) + 0.05);

SELECT is(dblink_exec('a', 'BEGIN'), 'BEGIN', 'pass A opens a transaction');
SELECT is((SELECT n FROM dblink('a', 'SELECT awp.fire_schedules()') AS x(n integer)), 1, 'pass A fires the due schedule (not yet committed)');
SELECT is((SELECT n FROM dblink('b', 'SELECT awp.fire_schedules()') AS x(n integer)), 0,
          'pass B at the same moment skips the row A holds: no second run, no wait');
SELECT is((SELECT count(*) FROM dblink('b', format('SELECT 1 FROM awp.runs WHERE schedule_id = %L', :'wf')) AS x(one integer)), 0::bigint,
          'B sees no run yet (A has not committed)');
SELECT is(dblink_exec('a', 'COMMIT'), 'COMMIT', 'pass A commits');
SELECT is((SELECT n FROM dblink('b', 'SELECT awp.fire_schedules()') AS x(n integer)), 0,
          'after A committed, B finds the fire time done (next_fire_at moved on under the lock)');
SELECT is((SELECT count(*) FROM awp.runs WHERE schedule_id = :'wf'), 1::bigint, 'exactly one run for that fire time');
SELECT is((SELECT input FROM awp.runs WHERE schedule_id = :'wf'), '{"n": 1}'::jsonb, 'with the schedule''s input');
SELECT ok((SELECT next_fire_at > last_fired_at FROM awp.schedules WHERE schedule_id = :'wf'), 'the next fire time is after the one fired');

-- Clean up what the sessions committed.
SELECT dblink_exec('setup', format($$DELETE FROM awp.events WHERE run_id IN (SELECT run_id FROM awp.runs WHERE workflow_id = %L)$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.dispatches WHERE run_id IN (SELECT run_id FROM awp.runs WHERE workflow_id = %L)$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.tasks WHERE run_id IN (SELECT run_id FROM awp.runs WHERE workflow_id = %L)$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.ready_queue WHERE run_id IN (SELECT run_id FROM awp.runs WHERE workflow_id = %L)$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.runs WHERE workflow_id = %L$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.schedules WHERE schedule_id = %L$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.workflow_versions WHERE workflow_id = %L$$, :'wf'));
SELECT dblink_exec('setup', format($$DELETE FROM awp.workflows WHERE workflow_id = %L$$, :'wf'));
SELECT dblink_disconnect('setup'), dblink_disconnect('a'), dblink_disconnect('b');

SELECT * FROM finish();
ROLLBACK;
