-- 0025_table_rules: the CHECK rules of six tables every task writes, each table's in one PL/pgSQL function
-- (docs/architecture.md, Table rules; docs/performance.md, The CHECK rules in one function per table).
-- PostgreSQL keeps a CHECK constraint as node text and reads it again in every statement that writes the table (a
-- cached plan does not keep it): the tasks' 20 constraints were 23,700 characters read per statement, 12-18% of a
-- completion's instructions. runs, tasks, dispatches, task_progress, task_output and workers now have one
-- constraint each, <table>_rules, calling awp._<table>_rules with the columns its rules read; the function holds
-- the same rules, with the same names and the same text, one `WHEN NOT (<rule>) THEN '<name>'` each, in name order
-- (the order PostgreSQL checked them in). A row that breaks one gets the error it got before: SQLSTATE 23514
-- (check_violation), the rule's name as the constraint, the message 'new row for relation "<table>" violates
-- check constraint "<name>"' (the table, not its partition). PL/pgSQL keeps the function's expressions for the
-- session, so a statement reads one function call, and a row pays one call (with its SET search_path). awp.events
-- keeps its two short constraints: its statements write many rows (a completion's events, one statement per run),
-- and there the calls cost more than the reading (measured: docs/performance.md). awp.check_rules lists every
-- named rule of the schema, inside these functions or not.
-- Changing a rule of these tables: CREATE OR REPLACE the function in a new migration (new columns: a new function
-- and constraint), then check the rows, as ALTER TABLE ADD CONSTRAINT did here.
SET LOCAL ROLE awp_owner;

-- 12 rules over 12 columns.
CREATE FUNCTION awp._runs_rules(
  concurrency integer, depth integer, finished_at timestamp with time zone, idempotency_key text, input jsonb,
  output jsonb, parent_run_id text, parent_task_key text, priority smallint, started_at timestamp with time zone,
  status text, unfinished_tasks integer
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT ((concurrency >= 1) AND (concurrency <= 10000)) THEN 'run_concurrency_in_range'
    WHEN NOT ((depth >= 0) AND (depth <= 10)) THEN 'run_depth_in_range'
    WHEN NOT ((status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text])) = (finished_at IS NOT
      NULL)) THEN 'run_finished_iff_terminal'
    WHEN NOT ((length(idempotency_key) >= 1) AND (length(idempotency_key) <= 255)) THEN 'run_idempotency_key_length'
    WHEN NOT (jsonb_typeof(input) = 'object'::text) THEN 'run_input_is_object'
    WHEN NOT ((output IS NULL) OR (status = 'succeeded'::text)) THEN 'run_output_only_when_succeeded'
    WHEN NOT (((parent_run_id IS NULL) = (parent_task_key IS NULL)) AND ((parent_run_id IS NULL) = (depth = 0)))
      THEN 'run_parent_fields'
    WHEN NOT ((status <> 'pending'::text) OR (started_at IS NULL)) THEN 'run_pending_not_started'
    WHEN NOT ((priority >= 0) AND (priority <= 9)) THEN 'run_priority_in_range'
    WHEN NOT ((status = ANY (ARRAY['pending'::text, 'canceled'::text])) OR (started_at IS NOT NULL)) THEN
      'run_started_unless_pending'
    WHEN NOT (status = ANY (ARRAY['pending'::text, 'running'::text, 'succeeded'::text, 'failed'::text,
      'canceled'::text])) THEN 'run_status_is_valid'
    WHEN NOT (unfinished_tasks >= 0) THEN 'run_unfinished_tasks_non_negative'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'runs', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._runs_rules IS
  'The CHECK rules of awp.runs (constraint runs_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.runs
  DROP CONSTRAINT run_concurrency_in_range,
  DROP CONSTRAINT run_depth_in_range,
  DROP CONSTRAINT run_finished_iff_terminal,
  DROP CONSTRAINT run_idempotency_key_length,
  DROP CONSTRAINT run_input_is_object,
  DROP CONSTRAINT run_output_only_when_succeeded,
  DROP CONSTRAINT run_parent_fields,
  DROP CONSTRAINT run_pending_not_started,
  DROP CONSTRAINT run_priority_in_range,
  DROP CONSTRAINT run_started_unless_pending,
  DROP CONSTRAINT run_status_is_valid,
  DROP CONSTRAINT run_unfinished_tasks_non_negative,
  ADD CONSTRAINT runs_rules CHECK (awp._runs_rules(concurrency, depth, finished_at, idempotency_key, input, output,
    parent_run_id, parent_task_key, priority, started_at, status, unfinished_tasks));

-- 20 rules over 25 columns.
CREATE FUNCTION awp._tasks_rules(
  attempts integer, backoff numeric, child_run_id text, error_code text, error_message text, executor text,
  finished_at timestamp with time zone, for_each text, interval_ms integer, item_count integer, item_index integer,
  jitter numeric, limit_buckets text[], mapped_task text, max_attempts integer, max_interval_ms integer,
  max_items integer, output jsonb, pending_deps integer, priority smallint, ready_at timestamp with time zone,
  skip_reason text, status text, timeout_ms integer, uncounted_attempts integer
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT (((attempts - uncounted_attempts) >= 0) AND ((attempts - uncounted_attempts) <= max_attempts)) THEN
      'task_attempts_in_range'
    WHEN NOT (((backoff >= (1)::numeric) AND (backoff <= (10)::numeric)) AND ((jitter >= (0)::numeric) AND (jitter
      <= (1)::numeric)) AND ((max_interval_ms IS NULL) OR ((max_interval_ms >= 0) AND (max_interval_ms <=
      86400000)))) THEN 'task_backoff_in_range'
    WHEN NOT ((child_run_id IS NULL) OR (executor = 'workflow'::text)) THEN 'task_child_run_only_for_workflow'
    WHEN NOT ((status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'canceled'::text, 'skipped'::text])) =
      (finished_at IS NOT NULL)) THEN 'task_finished_iff_terminal'
    WHEN NOT (((for_each IS NULL) = (max_items IS NULL)) AND ((max_items IS NULL) OR ((max_items >= 1) AND
      (max_items <= 10000)))) THEN 'task_for_each_has_max_items'
    WHEN NOT (((mapped_task IS NULL) = (item_index IS NULL)) AND ((item_index IS NULL) OR (item_index >= 0))) THEN
      'task_instance_fields'
    WHEN NOT ((interval_ms >= 0) AND (interval_ms <= 86400000)) THEN 'task_interval_in_range'
    WHEN NOT ((item_count IS NULL) OR ((for_each IS NOT NULL) AND ((item_count >= 0) AND (item_count <=
      max_items)))) THEN 'task_item_count_in_range'
    WHEN NOT (cardinality(limit_buckets) > 0) THEN 'task_limit_buckets_not_empty'
    WHEN NOT ((max_attempts >= 1) AND (max_attempts <= 100)) THEN 'task_max_attempts_in_range'
    WHEN NOT (pending_deps >= 0) THEN 'task_pending_deps_non_negative'
    WHEN NOT ((priority >= 0) AND (priority <= 9)) THEN 'task_priority_in_range'
    WHEN NOT ((status = ANY (ARRAY['waiting_dependencies'::text, 'skipped'::text, 'canceled'::text])) OR
      (pending_deps = 0)) THEN 'task_ready_has_no_pending_deps'
    WHEN NOT ((status <> 'running'::text) OR (attempts >= 1)) THEN 'task_running_has_attempt'
    WHEN NOT (((output IS NULL) AND (error_code IS NULL) AND (error_message IS NULL)) OR (attempts = 0) OR (executor
      = ANY (ARRAY['workflow'::text, 'signal'::text, 'sleep'::text]))) THEN
      'task_settled_output_only_without_worker'
    WHEN NOT ((skip_reason IS NULL) OR ((status = 'skipped'::text) AND (skip_reason = ANY
      (ARRAY['condition_false'::text, 'dependency_failed'::text])))) THEN 'task_skip_reason_only_when_skipped'
    WHEN NOT (status = ANY (ARRAY['waiting_dependencies'::text, 'ready'::text, 'queued'::text, 'running'::text,
      'waiting_retry'::text, 'succeeded'::text, 'failed'::text, 'canceled'::text, 'skipped'::text])) THEN
      'task_status_is_valid'
    WHEN NOT ((timeout_ms >= 1) AND (timeout_ms <= 86400000)) THEN 'task_timeout_in_range'
    WHEN NOT ((uncounted_attempts >= 0) AND (uncounted_attempts <= attempts)) THEN
      'task_uncounted_attempts_in_range'
    WHEN NOT ((status = 'waiting_retry'::text) = (ready_at IS NOT NULL)) THEN 'task_waiting_retry_has_ready_at'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "tasks" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'tasks', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._tasks_rules IS
  'The CHECK rules of awp.tasks (constraint tasks_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.tasks
  DROP CONSTRAINT task_attempts_in_range,
  DROP CONSTRAINT task_backoff_in_range,
  DROP CONSTRAINT task_child_run_only_for_workflow,
  DROP CONSTRAINT task_finished_iff_terminal,
  DROP CONSTRAINT task_for_each_has_max_items,
  DROP CONSTRAINT task_instance_fields,
  DROP CONSTRAINT task_interval_in_range,
  DROP CONSTRAINT task_item_count_in_range,
  DROP CONSTRAINT task_limit_buckets_not_empty,
  DROP CONSTRAINT task_max_attempts_in_range,
  DROP CONSTRAINT task_pending_deps_non_negative,
  DROP CONSTRAINT task_priority_in_range,
  DROP CONSTRAINT task_ready_has_no_pending_deps,
  DROP CONSTRAINT task_running_has_attempt,
  DROP CONSTRAINT task_settled_output_only_without_worker,
  DROP CONSTRAINT task_skip_reason_only_when_skipped,
  DROP CONSTRAINT task_status_is_valid,
  DROP CONSTRAINT task_timeout_in_range,
  DROP CONSTRAINT task_uncounted_attempts_in_range,
  DROP CONSTRAINT task_waiting_retry_has_ready_at,
  ADD CONSTRAINT tasks_rules CHECK (awp._tasks_rules(attempts, backoff, child_run_id, error_code, error_message,
    executor, finished_at, for_each, interval_ms, item_count, item_index, jitter, limit_buckets, mapped_task,
    max_attempts, max_interval_ms, max_items, output, pending_deps, priority, ready_at, skip_reason, status,
    timeout_ms, uncounted_attempts));

-- 19 rules over 21 columns.
CREATE FUNCTION awp._dispatches_rules(
  attempt integer, attempt_deadline timestamp with time zone, attempt_finished_at timestamp with time zone,
  attempt_status text, claim_seq bigint, counted boolean, dispatch_id text, error_code text, error_detail text,
  error_message text, fencing_token bigint, finished_at timestamp with time zone,
  lease_expires_at timestamp with time zone, lease_token_hash bytea, leased_at timestamp with time zone,
  output jsonb, result_hash bytea, run_id text, status text, uncounted text, worker_id text
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT ((attempt_status IS NOT NULL) OR ((attempt_finished_at IS NULL) AND (output IS NULL) AND (error_code IS
      NULL) AND (error_message IS NULL) AND (error_detail IS NULL))) THEN 'attempt_columns_only_with_attempt'
    WHEN NOT (length(error_code) <= 128) THEN 'attempt_error_code_length'
    WHEN NOT (octet_length(error_detail) <= 8192) THEN 'attempt_error_detail_length'
    WHEN NOT (octet_length(error_message) <= 8192) THEN 'attempt_error_message_length'
    WHEN NOT ((attempt_status = 'running'::text) = (attempt_finished_at IS NULL)) THEN
      'attempt_finished_iff_settled'
    WHEN NOT ((attempt IS NULL) = (attempt_status IS NULL)) THEN 'attempt_iff_leased'
    WHEN NOT (attempt >= 1) THEN 'attempt_number_positive'
    WHEN NOT (attempt_status = ANY (ARRAY['running'::text, 'succeeded'::text, 'failed'::text, 'timed_out'::text,
      'interrupted'::text, 'canceled'::text, 'not_received'::text])) THEN 'attempt_status_is_valid'
    WHEN NOT (counted OR (attempt_status = ANY (ARRAY['not_received'::text, 'interrupted'::text,
      'timed_out'::text]))) THEN 'attempt_uncounted_only_when_lost'
    WHEN NOT (claim_seq >= 1) THEN 'dispatch_claim_seq_positive'
    WHEN NOT ((status = 'completed'::text) = (result_hash IS NOT NULL)) THEN 'dispatch_completed_has_result'
    WHEN NOT ((status = ANY (ARRAY['completed'::text, 'expired'::text, 'canceled'::text])) = (finished_at IS NOT
      NULL)) THEN 'dispatch_finished_iff_final'
    WHEN NOT (CASE WHEN ("left"(run_id, 5) = 'run_t'::text) THEN ("left"(dispatch_id, 17) = ('dsp_'::text ||
      substr(run_id, 5, 13))) ELSE (dispatch_id < 'dsp_t'::text) END) THEN 'dispatch_in_run_range'
    WHEN NOT (lease_expires_at <= attempt_deadline) THEN 'dispatch_lease_within_deadline'
    WHEN NOT ((status <> ALL (ARRAY['leased'::text, 'completed'::text, 'expired'::text])) OR ((worker_id IS NOT
      NULL) AND (lease_token_hash IS NOT NULL) AND (attempt IS NOT NULL) AND (fencing_token IS NOT NULL) AND
      (leased_at IS NOT NULL) AND (lease_expires_at IS NOT NULL) AND (attempt_deadline IS NOT NULL))) THEN
      'dispatch_leased_has_lease'
    WHEN NOT ((status <> 'pending'::text) OR ((worker_id IS NULL) AND (lease_token_hash IS NULL) AND (attempt IS
      NULL) AND (fencing_token IS NULL) AND (leased_at IS NULL) AND (lease_expires_at IS NULL) AND (attempt_deadline
      IS NULL))) THEN 'dispatch_pending_has_no_lease'
    WHEN NOT (status = ANY (ARRAY['pending'::text, 'leased'::text, 'completed'::text, 'expired'::text,
      'canceled'::text])) THEN 'dispatch_status_is_valid'
    WHEN NOT (length(lease_token_hash) = 32) THEN 'dispatch_token_hash_is_sha256'
    WHEN NOT (uncounted = ANY (ARRAY['not_received'::text, 'outage'::text])) THEN 'dispatch_uncounted_is_valid'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "dispatches" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'dispatches', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._dispatches_rules IS
  'The CHECK rules of awp.dispatches (constraint dispatches_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.dispatches
  DROP CONSTRAINT attempt_columns_only_with_attempt,
  DROP CONSTRAINT attempt_error_code_length,
  DROP CONSTRAINT attempt_error_detail_length,
  DROP CONSTRAINT attempt_error_message_length,
  DROP CONSTRAINT attempt_finished_iff_settled,
  DROP CONSTRAINT attempt_iff_leased,
  DROP CONSTRAINT attempt_number_positive,
  DROP CONSTRAINT attempt_status_is_valid,
  DROP CONSTRAINT attempt_uncounted_only_when_lost,
  DROP CONSTRAINT dispatch_claim_seq_positive,
  DROP CONSTRAINT dispatch_completed_has_result,
  DROP CONSTRAINT dispatch_finished_iff_final,
  DROP CONSTRAINT dispatch_in_run_range,
  DROP CONSTRAINT dispatch_lease_within_deadline,
  DROP CONSTRAINT dispatch_leased_has_lease,
  DROP CONSTRAINT dispatch_pending_has_no_lease,
  DROP CONSTRAINT dispatch_status_is_valid,
  DROP CONSTRAINT dispatch_token_hash_is_sha256,
  DROP CONSTRAINT dispatch_uncounted_is_valid,
  ADD CONSTRAINT dispatches_rules CHECK (awp._dispatches_rules(attempt, attempt_deadline, attempt_finished_at,
    attempt_status, claim_seq, counted, dispatch_id, error_code, error_detail, error_message, fencing_token,
    finished_at, lease_expires_at, lease_token_hash, leased_at, output, result_hash, run_id, status, uncounted,
    worker_id));


-- 3 rules over 8 columns.
CREATE FUNCTION awp._task_progress_rules(
  chunk_bytes bigint, chunks_dropped bigint, dispatch_id text, entries bigint, log_bytes bigint,
  logs_dropped bigint, progress jsonb, run_id text
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT ((log_bytes >= 0) AND (chunk_bytes >= 0) AND (logs_dropped >= 0) AND (chunks_dropped >= 0) AND (entries
      >= 0)) THEN 'task_progress_counts'
    WHEN NOT (CASE WHEN ("left"(run_id, 5) = 'run_t'::text) THEN ("left"(dispatch_id, 17) = ('dsp_'::text ||
      substr(run_id, 5, 13))) ELSE (dispatch_id < 'dsp_t'::text) END) THEN 'task_progress_in_run_range'
    WHEN NOT (octet_length((progress)::text) <= 16384) THEN 'task_progress_value_size'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "task_progress" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'task_progress', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._task_progress_rules IS
  'The CHECK rules of awp.task_progress (constraint task_progress_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.task_progress
  DROP CONSTRAINT task_progress_counts,
  DROP CONSTRAINT task_progress_in_run_range,
  DROP CONSTRAINT task_progress_value_size,
  ADD CONSTRAINT task_progress_rules CHECK (awp._task_progress_rules(chunk_bytes, chunks_dropped, dispatch_id,
    entries, log_bytes, logs_dropped, progress, run_id));

-- 2 rules over 4 columns.
CREATE FUNCTION awp._task_output_rules(
  entries text[], first_seq bigint, kind text, seq bigint
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT (kind = ANY (ARRAY['log'::text, 'chunk'::text])) THEN 'task_output_kind_is_valid'
    WHEN NOT ((first_seq >= 1) AND (((seq - first_seq) + 1) = cardinality(entries))) THEN 'task_output_numbered'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "task_output" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'task_output', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._task_output_rules IS
  'The CHECK rules of awp.task_output (constraint task_output_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.task_output
  DROP CONSTRAINT task_output_kind_is_valid,
  DROP CONSTRAINT task_output_numbered,
  ADD CONSTRAINT task_output_rules CHECK (awp._task_output_rules(entries, first_seq, kind, seq));

-- 9 rules over 9 columns.
CREATE FUNCTION awp._workers_rules(
  actions jsonb, display_name text, draining_at timestamp with time zone, executor_kinds text[],
  max_concurrency integer, offline_at timestamp with time zone, session_token_hash bytea, status text,
  stopped_at timestamp with time zone
) RETURNS boolean
  LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_broken text := CASE
    WHEN NOT ((actions IS NULL) OR (jsonb_typeof(actions) = 'object'::text)) THEN 'worker_actions_is_object'
    WHEN NOT ((length(display_name) >= 1) AND (length(display_name) <= 128)) THEN 'worker_display_name_length'
    WHEN NOT ((status <> 'draining'::text) OR (draining_at IS NOT NULL)) THEN 'worker_draining_has_draining_at'
    WHEN NOT (cardinality(executor_kinds) >= 1) THEN 'worker_has_executor_kinds'
    WHEN NOT ((max_concurrency >= 1) AND (max_concurrency <= 1000)) THEN 'worker_max_concurrency_in_range'
    WHEN NOT ((status = 'offline'::text) = (offline_at IS NOT NULL)) THEN 'worker_offline_has_offline_at'
    WHEN NOT (status = ANY (ARRAY['active'::text, 'draining'::text, 'stopped'::text, 'offline'::text])) THEN
      'worker_status_is_valid'
    WHEN NOT ((status = 'stopped'::text) = (stopped_at IS NOT NULL)) THEN 'worker_stopped_has_stopped_at'
    WHEN NOT (length(session_token_hash) = 32) THEN 'worker_token_hash_is_sha256'
  END;
BEGIN
  IF v_broken IS NULL THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'new row for relation "workers" violates check constraint "%"', v_broken
    USING ERRCODE = 'check_violation', SCHEMA = 'awp', TABLE = 'workers', CONSTRAINT = v_broken;
END $$;
COMMENT ON FUNCTION awp._workers_rules IS
  'The CHECK rules of awp.workers (constraint workers_rules): true, or 23514 naming the first rule broken.';

ALTER TABLE awp.workers
  DROP CONSTRAINT worker_actions_is_object,
  DROP CONSTRAINT worker_display_name_length,
  DROP CONSTRAINT worker_draining_has_draining_at,
  DROP CONSTRAINT worker_has_executor_kinds,
  DROP CONSTRAINT worker_max_concurrency_in_range,
  DROP CONSTRAINT worker_offline_has_offline_at,
  DROP CONSTRAINT worker_status_is_valid,
  DROP CONSTRAINT worker_stopped_has_stopped_at,
  DROP CONSTRAINT worker_token_hash_is_sha256,
  ADD CONSTRAINT workers_rules CHECK (awp._workers_rules(actions, display_name, draining_at, executor_kinds,
    max_concurrency, offline_at, session_token_hash, status, stopped_at));

-- Every named rule of the schema's tables: a CHECK constraint's own, or each rule of a table's rules function,
-- as pg_get_constraintdef printed it (CHECK (...)). Partitions' inherited copies are left out.
CREATE VIEW awp.check_rules AS
  SELECT c.conrelid::regclass AS table_name, c.conname::text AS rule, pg_get_constraintdef(c.oid) AS definition
    FROM pg_constraint c
   WHERE c.connamespace = 'awp'::regnamespace AND c.contype = 'c' AND c.coninhcount = 0
     AND NOT EXISTS (SELECT 1 FROM pg_depend d
                      WHERE d.classid = 'pg_constraint'::regclass AND d.objid = c.oid
                        AND d.refclassid = 'pg_proc'::regclass)
  UNION ALL
  SELECT c.conrelid::regclass, m[2], 'CHECK (' || regexp_replace(m[1], '\s+', ' ', 'g') || ')'
    FROM pg_constraint c
    JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_proc'::regclass
    JOIN pg_proc p ON p.oid = d.refobjid
    CROSS JOIN LATERAL regexp_split_to_table(p.prosrc, '\s+WHEN NOT ') WITH ORDINALITY AS r(part, n)
    CROSS JOIN LATERAL regexp_match(r.part, '^(\(.*\))\s+THEN\s+''([a-z0-9_]+)''') AS m
   WHERE c.connamespace = 'awp'::regnamespace AND c.contype = 'c' AND c.coninhcount = 0 AND r.n > 1;
COMMENT ON VIEW awp.check_rules IS
  'Every named CHECK rule of the awp tables (table_name, rule, definition), inside a table''s rules function or not.';

RESET ROLE;
