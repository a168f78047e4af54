-- 0011_final_task_counts: a finished run keeps its task counts (runs.final_task_counts).
-- A run's task_counts ({status: count} of its tasks, in awp.list_runs and awp.get_run) were counted from its
-- tasks on every read: 7-9 ms per 10,000-task run on this project's machine in a slow phase, so a dashboard runs
-- page of 25 such runs, refreshed every 2 seconds, kept PostgreSQL counting 250,000 rows each time. A finished
-- run's tasks never change again (every task is terminal: awp.check_invariants, run_tasks_terminal), so its
-- counts are stored once, when it finishes (awp._settle_run, awp._converge_cancel), and read from there; a
-- live run's are still counted (they change with every transition).
--   runs.final_task_counts   {status: count} of the run's tasks, set when the run finished; NULL while it is
--                            pending or running. awp.check_invariants (final_task_counts) compares it with the
--                            tasks.
-- Existing rows: every finished run's counts are stored here.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.runs ADD COLUMN final_task_counts jsonb;
COMMENT ON COLUMN awp.runs.final_task_counts IS
  'The run''s task counts by status, stored when it finished (NULL while pending or running).';

UPDATE awp.runs r
   SET final_task_counts = (SELECT coalesce(jsonb_object_agg(c.status, c.n), '{}')
                              FROM (SELECT t.status, count(*) AS n FROM awp.tasks t
                                     WHERE t.run_id = r.run_id GROUP BY 1) c)
 WHERE r.status IN ('succeeded', 'failed', 'canceled');

RESET ROLE;
