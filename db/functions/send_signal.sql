-- Waiting without a worker (docs/waits.md): tasks of executor `signal` (a signal from outside: a person's approval,
-- a webhook) and `sleep` (the database clock). Both are run by the database (awp._database_kinds): when ready and
-- within their run's concurrency, awp._start_database_tasks starts attempt N (task running, wait reason
-- waiting_signal or sleeping) through awp._start_wait; awp.send_signal ends a signal wait (the task succeeds with the
-- payload as its output); the coordinator's pass (awp._settle_waits) ends the sleeps whose time has come (succeeded)
-- and the signal waits whose timeout passed (attempt failed, error signal_timeout; the task's retry policy applies:
-- a retry waits again). Nothing holds a worker slot; everything is in rows, so a wait survives restarts of every
-- process. Cancel: as any running task (awp._converge_cancel). Locks: the run first (its advisory lock, then its
-- row), then its task rows.

-- awp._wait_input_error(executor, input): what is wrong with the input of a signal or sleep task, or NULL:
-- signal: {"timeout_ms": 1-2147483647} (optional: no timeout); sleep: exactly one of {"sleep_ms": 0-2147483647}
-- and {"until": "<RFC 3339 timestamp with offset>"}. Locks: none.
CREATE OR REPLACE FUNCTION awp._wait_input_error(p_executor text, p jsonb) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p IS NOT NULL AND jsonb_typeof(p) <> 'object' THEN
    RETURN format('the input of a %s task must be a JSON object', p_executor);
  END IF;
  IF p_executor = 'signal' THEN
    RETURN CASE
      WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(coalesce(p, '{}')) k WHERE k <> 'timeout_ms')
        THEN 'input of a signal task has unknown fields (allowed: timeout_ms)'
      WHEN p ? 'timeout_ms' AND NOT awp._int_ok(p->'timeout_ms', 1, 2147483647)
        THEN 'input.timeout_ms of a signal task must be an integer from 1 to 2147483647'
    END;
  END IF;
  RETURN CASE
    WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(coalesce(p, '{}')) k WHERE k NOT IN ('sleep_ms', 'until'))
      THEN 'input of a sleep task has unknown fields (allowed: sleep_ms, until)'
    WHEN (p ? 'sleep_ms') = (p ? 'until') OR p IS NULL
      THEN 'a sleep task needs exactly one of input.sleep_ms and input.until'
    WHEN p ? 'sleep_ms' AND NOT awp._int_ok(p->'sleep_ms', 0, 2147483647)
      THEN 'input.sleep_ms of a sleep task must be an integer from 0 to 2147483647'
    WHEN p ? 'until' AND awp._timestamp_of(p->'until') IS NULL
      THEN 'input.until of a sleep task must be an RFC 3339 timestamp with an offset, e.g. "2030-01-01T09:00:00Z"'
  END;
END $$;
COMMENT ON FUNCTION awp._wait_input_error(text, jsonb) IS 'What is wrong with the input of a signal or sleep task, or NULL.';

-- awp._timestamp_of(value): an RFC 3339 timestamp with an offset (a JSON string such as "2030-01-01T09:00:00Z" or
-- "...+02:00") as a timestamptz; NULL for anything else. Locks: none.
CREATE OR REPLACE FUNCTION awp._timestamp_of(p jsonb) RETURNS timestamptz
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF jsonb_typeof(p) IS DISTINCT FROM 'string'
     OR (p #>> '{}') !~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$' THEN
    RETURN NULL;
  END IF;
  RETURN (p #>> '{}')::timestamptz;
EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
  RETURN NULL;
END $$;
COMMENT ON FUNCTION awp._timestamp_of(jsonb) IS 'An RFC 3339 timestamp (JSON string with an offset) as timestamptz, else NULL.';

-- awp._start_wait(run, task, executor, input, attempt, first, now): a ready signal or sleep task starts attempt
-- `attempt` (see the top of this file); `first`: the run's first start (pending -> running, as a first dispatch).
-- Locks: the caller holds the run and the task row.
CREATE OR REPLACE FUNCTION awp._start_wait(p_run_id text, p_task_key text, p_executor text, p_input jsonb,
                                           p_attempt integer, p_first boolean, p_now timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_until timestamptz;
  v_why   text;
BEGIN
  IF p_executor = 'signal' THEN
    v_until := p_now + make_interval(secs => (p_input->>'timeout_ms')::numeric / 1000.0);   -- NULL: no timeout
    v_why := 'waiting for a signal' || coalesce(' until ' || awp._wait_ts(v_until), '');
  ELSE
    v_until := coalesce(awp._timestamp_of(p_input->'until'),
                        p_now + make_interval(secs => (p_input->>'sleep_ms')::numeric / 1000.0));
    v_why := 'sleeping until ' || awp._wait_ts(v_until);
  END IF;
  UPDATE awp.tasks y SET status = 'running', attempts = p_attempt, wait_until = v_until, updated_at = p_now,
                         output = NULL, error_code = NULL, error_message = NULL
   WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
  IF p_first THEN   -- as a first dispatch (awp._dispatch_one)
    UPDATE awp.runs x SET status = 'running', started_at = coalesce(x.started_at, p_now) WHERE x.run_id = p_run_id;
    PERFORM awp._append_event(p_run_id, 'run', p_run_id, 'pending', 'running', 'first wait started');
  END IF;
  PERFORM awp._append_events(p_run_id, '{task,attempt}', ARRAY[p_task_key, p_task_key || '#' || p_attempt],
                             ARRAY['ready', NULL], '{running,running}', ARRAY[v_why, v_why]);
END $$;
COMMENT ON FUNCTION awp._start_wait(text, text, text, jsonb, integer, boolean, timestamptz) IS 'Starts an attempt of a signal or sleep task (running, with its wait_until).';

-- awp.send_signal(run_id, task_key, payload, idempotency_key): the signal a waiting task of executor signal waits
-- for (a person's approval, a webhook): the task succeeds with `payload` (a JSON object of at most 64 KiB) as its
-- output, and its dependants go on. The same idempotency key with the same payload is answered as the first time
-- (also once the task has moved on); with another payload: AWIDM. A task that is not waiting for a signal (not a
-- signal task, not running, its run canceling or ended): AWSIG (409 signal_not_waiting). An unknown run or task:
-- AWNTF; a bad payload or key: AWREQ. Returns the task's status now, the attempt the signal ended and when it was
-- received. Locks: the run (its advisory lock, then its row), then the task row (docs/architecture.md, Lock order).
CREATE OR REPLACE FUNCTION awp.send_signal(p_run_id text, p_task_key text, p_payload jsonb,
                                           p_idempotency_key text DEFAULT NULL)
RETURNS TABLE (run_id text, task_key text, status text, attempt integer, received_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_hash bytea;
  r      record;
  t      record;
  s      record;
  v_now  timestamptz;
BEGIN
  PERFORM awp._check_input(p_payload, 'signal payload');
  IF p_idempotency_key IS NOT NULL AND length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
    PERFORM awp._raise_invalid_request('invalid idempotency key', 'idempotency key must have 1-255 characters');
  END IF;
  v_hash := awp._hash(p_payload::text);   -- jsonb text: the same for the same JSON, in any key order
  PERFORM pg_advisory_xact_lock(hashtextextended(p_run_id, 0));
  SELECT x.status, x.cancel_requested_at INTO r FROM awp.runs x WHERE x.run_id = p_run_id FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
  SELECT y.status, y.executor, y.attempts INTO t FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.task_key = p_task_key FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('task not found', format('run %s has no task %s', p_run_id, p_task_key));
  END IF;
  IF p_idempotency_key IS NOT NULL THEN
    SELECT g.attempt, g.payload_hash, g.received_at INTO s FROM awp.signals g
     WHERE g.run_id = p_run_id AND g.task_key = p_task_key AND g.idempotency_key = p_idempotency_key;
    IF FOUND THEN
      IF s.payload_hash <> v_hash THEN
        PERFORM awp._raise_idempotency_conflict('idempotency key reused with another payload',
          format('idempotency key %s was used for another signal to task %s', p_idempotency_key, p_task_key));
      END IF;
      RETURN QUERY SELECT p_run_id, p_task_key, t.status, s.attempt, s.received_at;
      RETURN;
    END IF;
  END IF;
  IF t.executor <> 'signal' OR t.status <> 'running' OR r.status NOT IN ('pending', 'running')
     OR r.cancel_requested_at IS NOT NULL THEN
    PERFORM awp._raise_signal_not_waiting(format('task %s of run %s is not waiting for a signal: %s', p_task_key, p_run_id,
      CASE WHEN t.executor <> 'signal' THEN format('its executor is %s', t.executor)
           WHEN r.cancel_requested_at IS NOT NULL OR r.status NOT IN ('pending', 'running') THEN format('the run is %s',
             CASE WHEN r.status IN ('pending', 'running') THEN 'being canceled' ELSE r.status END)
           ELSE format('it is %s', replace(t.status, '_', ' ')) END));
  END IF;
  v_now := awp._now();
  INSERT INTO awp.signals (run_id, task_key, attempt, idempotency_key, payload, payload_hash, received_at)
  VALUES (p_run_id, p_task_key, t.attempts, p_idempotency_key, p_payload, v_hash, v_now);
  UPDATE awp.tasks y SET output = p_payload WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
  PERFORM awp._end_attempt(p_run_id, p_task_key, t.attempts, 'succeeded', false, NULL, NULL, NULL, 'signal received',
                           true, 'completed', NULL);
  PERFORM awp._log_flush();
  PERFORM awp._wake('awp_coordinator', 'signal');   -- its dependants may be ready
  RETURN QUERY SELECT p_run_id, p_task_key, y.status, t.attempts, v_now FROM awp.tasks y
                WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
END $$;
COMMENT ON FUNCTION awp.send_signal(text, text, jsonb, text) IS 'Ends a signal task''s wait: it succeeds with the payload as output (idempotent by key); AWSIG when it does not wait, AWNTF when unknown.';

-- awp._settle_waits(isolate): the coordinator's step for waits: every running signal or sleep task whose wait_until
-- has come, its run taken without waiting (awp._try_run: a busy one is left to the next pass) and re-checked under
-- its lock: a sleep succeeds (output {"slept_until": ...}); a signal wait fails its attempt (error signal_timeout,
-- retried as the task's retry says). With isolate, each run in a subtransaction of its own (awp._pass_skip). Returns
-- how many were settled. Locks: each run, then as awp._end_attempt.
CREATE OR REPLACE FUNCTION awp._settle_waits(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := awp._now();
  x     record;
  v_n   integer := 0;
BEGIN
  FOR x IN
    SELECT t.run_id, t.task_key FROM awp.tasks t
     WHERE t.status = 'running' AND t.wait_until IS NOT NULL AND t.wait_until <= v_now   -- tasks_wait_until_idx
     ORDER BY t.run_id, t.task_key
  LOOP
    CONTINUE WHEN NOT awp._try_run(x.run_id);
    IF NOT p_isolate THEN
      v_n := v_n + awp._settle_wait(x.run_id, x.task_key, v_now)::integer;
    ELSE
      BEGIN
        v_n := v_n + awp._settle_wait(x.run_id, x.task_key, v_now)::integer;
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        PERFORM awp._pass_skip('wait settle', x.run_id, SQLSTATE, SQLERRM);
      END;
    END IF;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._settle_waits(boolean) IS 'Coordinator step: sleeps whose time came succeed, signal waits past their timeout fail (signal_timeout); returns the count.';

-- awp._settle_wait(run, task, now): one due wait (see awp._settle_waits); false when it is no longer due (a signal
-- arrived, a cancel). Locks: the caller holds the run; the task row, then as awp._end_attempt.
CREATE OR REPLACE FUNCTION awp._settle_wait(p_run_id text, p_task_key text, p_now timestamptz) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t   record;
  v_msg text;
BEGIN
  SELECT y.executor, y.attempts, y.wait_until, y.input INTO t FROM awp.tasks y
   WHERE y.run_id = p_run_id AND y.task_key = p_task_key AND y.status = 'running' AND y.wait_until <= p_now
     FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  IF t.executor = 'sleep' THEN
    UPDATE awp.tasks y SET output = jsonb_build_object('slept_until', t.wait_until)
     WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
    PERFORM awp._end_attempt(p_run_id, p_task_key, t.attempts, 'succeeded', false, NULL, NULL, NULL, 'sleep ended', true,
                             'completed', NULL);
  ELSE
    v_msg := format('no signal within %s ms', t.input->>'timeout_ms');
    UPDATE awp.tasks y SET error_code = 'signal_timeout', error_message = v_msg
     WHERE y.run_id = p_run_id AND y.task_key = p_task_key;
    PERFORM awp._end_attempt(p_run_id, p_task_key, t.attempts, 'timed_out', true, NULL, 'signal_timeout', v_msg,
                             'signal_timeout', true, 'completed', NULL);
  END IF;
  PERFORM awp._wake('awp_coordinator', 'wait_ended');
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._settle_wait(text, text, timestamptz) IS 'Ends one due sleep (succeeded) or signal wait (signal_timeout), under its run''s lock.';
