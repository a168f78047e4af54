-- 0016_dynamic_workflows: the columns of dynamic workflows (docs/dynamic.md): `when` conditions, `for_each` fan-out
-- over a list produced at run time and child runs (tasks of executor `workflow`), in db/functions/_dynamic.sql.
--   condition      the task's `when` ({"task", "path", "equals" | "not_equals"}), evaluated once its dependencies
--                  are done; NULL: none
--   for_each       the dependency whose output (a JSON array) the task maps over; NULL: not a mapped task
--   max_items      a mapped task's largest accepted array (1-10,000)
--   item_count     a mapped task's instances, once created (NULL before); pending_deps then counts the instances
--                  not yet succeeded
--   mapped_task, item, item_index   an instance: its mapped task, its element and its index ("<key>[<index>]")
--   output, error_code, error_message   a task settled by the database, not by a worker: a mapped task's array of
--                  outputs or a child-run task's output (its child's), or why it failed (for_each_invalid,
--                  instance_failed, for_each_output_too_large; a child-run task: child_run_failed, not_found,
--                  invalid_request)
--   skip_reason    why a task was skipped: condition_false, or dependency_failed
--   child_run_id   a task of executor `workflow`: the run its latest attempt started
-- awp.runs:
--   parent_run_id, parent_task_key   a child run: the run and the task that started it (no foreign key: either may
--                  be pruned first)
--   depth          0 for a run started by a caller or a schedule; a child's is its parent's + 1 (at most 10)

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.tasks
  ADD COLUMN condition jsonb,
  ADD COLUMN for_each text,
  ADD COLUMN max_items integer,
  ADD COLUMN item_count integer,
  ADD COLUMN mapped_task text,
  ADD COLUMN item jsonb,
  ADD COLUMN item_index integer,
  ADD COLUMN output jsonb,
  ADD COLUMN error_code text,
  ADD COLUMN error_message text,
  ADD COLUMN skip_reason text,
  ADD COLUMN child_run_id text,
  ADD CONSTRAINT task_for_each_has_max_items
    CHECK ((for_each IS NULL) = (max_items IS NULL) AND (max_items IS NULL OR max_items BETWEEN 1 AND 10000)),
  ADD CONSTRAINT task_item_count_in_range
    CHECK (item_count IS NULL OR (for_each IS NOT NULL AND item_count BETWEEN 0 AND max_items)),
  ADD CONSTRAINT task_instance_fields
    CHECK ((mapped_task IS NULL) = (item_index IS NULL) AND (item_index IS NULL OR item_index >= 0)),
  ADD CONSTRAINT task_skip_reason_only_when_skipped
    CHECK (skip_reason IS NULL OR (status = 'skipped' AND skip_reason IN ('condition_false', 'dependency_failed'))),
  ADD CONSTRAINT task_settled_output_only_without_worker
    CHECK ((output IS NULL AND error_code IS NULL AND error_message IS NULL) OR attempts = 0 OR executor = 'workflow'),
  ADD CONSTRAINT task_child_run_only_for_workflow CHECK (child_run_id IS NULL OR executor = 'workflow');

ALTER TABLE awp.runs
  ADD COLUMN parent_run_id text,
  ADD COLUMN parent_task_key text,
  ADD COLUMN depth integer NOT NULL DEFAULT 0,
  ADD CONSTRAINT run_parent_fields CHECK ((parent_run_id IS NULL) = (parent_task_key IS NULL)
                                         AND (parent_run_id IS NULL) = (depth = 0)),
  ADD CONSTRAINT run_depth_in_range CHECK (depth BETWEEN 0 AND 10);

-- A run's children (the dashboard's links, a parent's cancel).
CREATE INDEX runs_parent_idx ON awp.runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
-- The child-run tasks that wait for their child (the coordinator's pass settles those whose child ended).
CREATE INDEX tasks_child_running_idx ON awp.tasks (child_run_id) WHERE status = 'running' AND child_run_id IS NOT NULL;

-- A mapped task's instances in index order (its output, its progress count, paging them).
CREATE INDEX tasks_instances_idx ON awp.tasks (run_id, mapped_task, item_index) WHERE mapped_task IS NOT NULL;

RESET ROLE;
