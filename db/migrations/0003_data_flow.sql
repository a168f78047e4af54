-- 0003_data_flow: data flows through a run (docs/data-flow.md).
--   runs.input        the run's input, a JSON object (<= 64 KiB); '{}' when the run was started without one.
--   runs.output       set once, when the run succeeds: {task_key: output} of every task with no dependants
--                     (at most 1 MiB: past that, the remaining tasks map to null and output_truncated is true).
--   runs.schedule_id  the schedule that started the run (NULL for runs started by hand). No foreign key:
--                     a schedule may be deleted while its runs are kept.
-- Existing runs get input '{}' and no output.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.runs
  ADD COLUMN input       jsonb NOT NULL DEFAULT '{}',
  ADD COLUMN output      jsonb,
  ADD COLUMN output_truncated boolean NOT NULL DEFAULT false,
  ADD COLUMN schedule_id text,
  ADD CONSTRAINT run_input_is_object CHECK (jsonb_typeof(input) = 'object'),
  ADD CONSTRAINT run_output_only_when_succeeded CHECK (output IS NULL OR status = 'succeeded');

RESET ROLE;
