-- The limits of the SQL API, each defined once, here (AWP issue 17). Every function that enforces a limit
-- calls its constant; the table CHECKs that enforce the same limit again (a second line of defence), the
-- Python constants that mirror one (python/awp/protocol/results.py, python/awp/protocol/limits.py) and the documentation are held to
-- these values by python/tests/integration/test_limits.py, which also finds any literal copy left in db/functions.
-- The constants are IMMUTABLE functions of no argument: the planner folds each call into a constant of the
-- caller's cached plan (it evaluates an immutable call with constant arguments when planning, SET clause or
-- not), so using one costs nothing on the hot path.
-- Locks: none.

-- awp._limit_input_bytes(): a task's, a run's or a schedule's input, in bytes of its jsonb text (64 KiB).
CREATE OR REPLACE FUNCTION awp._limit_input_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 65536 $$;
COMMENT ON FUNCTION awp._limit_input_bytes() IS 'Limit: an input (task, run, schedule), in bytes of its jsonb text.';

-- awp._limit_output_bytes(): a result's output, in bytes of its jsonb text (64 KiB).
CREATE OR REPLACE FUNCTION awp._limit_output_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 65536 $$;
COMMENT ON FUNCTION awp._limit_output_bytes() IS 'Limit: a result''s output, in bytes of its jsonb text.';

-- awp._limit_error_code_chars(): a result's error_code, in characters.
CREATE OR REPLACE FUNCTION awp._limit_error_code_chars() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 128 $$;
COMMENT ON FUNCTION awp._limit_error_code_chars() IS 'Limit: a result''s error_code, in characters.';

-- awp._limit_error_message_bytes(): a result's error_message, in UTF-8 bytes (8 KiB).
CREATE OR REPLACE FUNCTION awp._limit_error_message_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 8192 $$;
COMMENT ON FUNCTION awp._limit_error_message_bytes() IS 'Limit: a result''s error_message, in UTF-8 bytes.';

-- awp._limit_lease_payload_bytes(): a lease's upstream (the outputs of the task's dependencies), in bytes of
-- its jsonb text (1 MiB); docs/data-flow.md.
CREATE OR REPLACE FUNCTION awp._limit_lease_payload_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1048576 $$;
COMMENT ON FUNCTION awp._limit_lease_payload_bytes() IS 'Limit: a lease''s upstream, in bytes of its jsonb text.';

-- awp._limit_run_output_bytes(): a run's output (the outputs of its tasks without dependants), in bytes of
-- jsonb text (1 MiB); the tasks past it map to null (docs/data-flow.md).
CREATE OR REPLACE FUNCTION awp._limit_run_output_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1048576 $$;
COMMENT ON FUNCTION awp._limit_run_output_bytes() IS 'Limit: a run''s output, in bytes of its jsonb text.';

-- awp._limit_page_rows(): the largest page of a list function (limit 1 to this).
CREATE OR REPLACE FUNCTION awp._limit_page_rows() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION awp._limit_page_rows() IS 'Limit: the rows of one page of a list function.';

-- awp._limit_batch_results(): the results of one awp.complete_tasks call.
CREATE OR REPLACE FUNCTION awp._limit_batch_results() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 256 $$;
COMMENT ON FUNCTION awp._limit_batch_results() IS 'Limit: the results of one complete_tasks call.';

-- awp._limit_batch_runs(): the runs one awp.start_runs / awp.start_runs_idempotent call starts.
CREATE OR REPLACE FUNCTION awp._limit_batch_runs() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION awp._limit_batch_runs() IS 'Limit: the runs one start_runs call starts.';

-- awp._limit_heartbeat_list(): each list of one heartbeat (leases, dropped, claims_pending).
CREATE OR REPLACE FUNCTION awp._limit_heartbeat_list() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1024 $$;
COMMENT ON FUNCTION awp._limit_heartbeat_list() IS 'Limit: the items of each list of one heartbeat.';

-- awp._limit_definition_edges(): the depends_on entries of one definition, all tasks together (20,000). A
-- run's start and every claim of a task walk its edges: a dense graph within the task limit (2,000 tasks each
-- depending on every earlier one: 2 million edges) took 11 s to store and 9 s to start (AWP issue 44).
CREATE OR REPLACE FUNCTION awp._limit_definition_edges() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 20000 $$;
COMMENT ON FUNCTION awp._limit_definition_edges() IS 'Limit: the depends_on entries of one definition, all tasks together.';

-- awp._limit_progress_bytes(): a task's progress value (ctx.progress), in bytes of its jsonb text (16 KiB);
-- docs/progress.md.
CREATE OR REPLACE FUNCTION awp._limit_progress_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 16384 $$;
COMMENT ON FUNCTION awp._limit_progress_bytes() IS 'Limit: a progress value, in bytes of its jsonb text.';

-- awp._limit_progress_entry_bytes(): one log line or output chunk, in UTF-8 bytes (64 KiB); docs/progress.md.
CREATE OR REPLACE FUNCTION awp._limit_progress_entry_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 65536 $$;
COMMENT ON FUNCTION awp._limit_progress_entry_bytes() IS 'Limit: one log line or output chunk, in UTF-8 bytes.';

-- awp._limit_progress_entries(): the log lines and chunks of one progress write, together.
CREATE OR REPLACE FUNCTION awp._limit_progress_entries() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 4096 $$;
COMMENT ON FUNCTION awp._limit_progress_entries() IS 'Limit: the log lines and chunks of one progress write.';

-- awp._setting_ranges(): the allowed range of each setting (awp.configure; the CHECKs of awp.settings are the
-- same ranges, python/tests/integration/test_limits.py compares them), with a note for the message.
CREATE OR REPLACE FUNCTION awp._setting_ranges()
RETURNS TABLE (setting text, lo bigint, hi bigint, note text)
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  VALUES ('lease_duration_ms', 100::bigint, 86400000::bigint, ''),
         ('heartbeat_interval_ms', 10, 3600000, ''),
         ('offline_after_heartbeats', 1, 1000, ''),
         ('dispatch_limit', 1, 1000000, ''),
         ('retention_ms', 0, 3153600000000, ' (0: keep forever; at most 100 years)'),
         ('leader_lease_ms', 500, 3600000, ''),
         ('progress_log_bytes', 1024, 67108864, ' (bytes of log lines one attempt keeps)'),
         ('progress_chunk_bytes', 1024, 67108864, ' (bytes of output chunks one attempt keeps)'),
         ('history_partition_ms', 0, 2592000000, ' (the time range of each history partition: 0 for half the retention, else 1 s to 30 days)')
$$;
COMMENT ON FUNCTION awp._setting_ranges() IS 'The allowed range of each setting (awp.configure).';

-- awp._limit_worker_actions(): the actions a worker registers for one executor kind (routing by action).
CREATE OR REPLACE FUNCTION awp._limit_worker_actions() RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT 1000 $$;
COMMENT ON FUNCTION awp._limit_worker_actions() IS 'Limit: the actions a worker registers for one executor kind.';
