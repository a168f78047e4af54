-- 0004_schedules: schedules that start runs of a workflow (docs/schedules.md). Written and read only
-- through db/functions/schedules.sql; the active coordinator fires them (awp.fire_schedules).
--   cron / interval_ms  exactly one: a cron expression (5 fields, or 6 with seconds first), evaluated in
--                       `timezone`; or a period in ms (>= 1000) anchored at created_at.
--   input               the input of every run the schedule starts (a JSON object, <= 64 KiB).
--   next_fire_at        the next fire time not started yet; due when <= awp._now().
--   last_fired_at       the fire time of the latest run started (a scheduled time, not the wall clock
--                       of the coordinator pass); last_run_id that run.
-- No foreign key to awp.workflows: a schedule whose workflow is gone is skipped at fire time.

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.schedules (
  schedule_id   text PRIMARY KEY,
  workflow_id   text NOT NULL,
  cron          text,
  interval_ms   integer,
  input         jsonb NOT NULL DEFAULT '{}',
  timezone      text NOT NULL DEFAULT 'UTC',
  next_fire_at  timestamptz NOT NULL,
  last_fired_at timestamptz,
  last_run_id   text,
  created_at    timestamptz NOT NULL,
  CONSTRAINT schedule_id_is_valid CHECK (schedule_id ~ '^[A-Za-z0-9._-]{1,128}$'),
  CONSTRAINT schedule_has_one_trigger CHECK ((cron IS NULL) <> (interval_ms IS NULL)),
  CONSTRAINT schedule_interval_in_range CHECK (interval_ms >= 1000),
  CONSTRAINT schedule_cron_length CHECK (length(cron) BETWEEN 1 AND 256),
  CONSTRAINT schedule_input_is_object CHECK (jsonb_typeof(input) = 'object'),
  CONSTRAINT schedule_input_size CHECK (octet_length(input::text) <= 65536),
  CONSTRAINT schedule_fired_with_run CHECK ((last_fired_at IS NULL) = (last_run_id IS NULL))
);
CREATE INDEX schedules_due_idx ON awp.schedules (next_fire_at);

RESET ROLE;
