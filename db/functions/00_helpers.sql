-- Private helpers shared by the public functions: time, ids, tokens, hashing, sessions, events, errors.
-- None of them is granted to awp_gateway; they run inside the SECURITY DEFINER callers.
-- Every function pins search_path = pg_catalog, pg_temp (docs/architecture.md, "Functions and search_path").

-- awp._now(): the one clock. Database time (clock_timestamp), unless a test froze it with
-- SET awp.test_now = '…' (pgTAP does; see db/tests). The frozen clock is honoured only in a test
-- database (one with the pgtap extension, which migrations install nowhere else), so no client
-- of a real database can move time for its leases. Takes no locks, raises nothing.
CREATE OR REPLACE FUNCTION awp._now() RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_frozen text := current_setting('awp.test_now', true);
BEGIN
  -- The catalog lookup only when a frozen time is set: the usual call costs one GUC read. Two IFs, not one
  -- condition: a condition with a subquery is run as a query (executor start-up, the catalog scan's plan set up)
  -- even when AND stops before the subquery; the outer test alone is a plain expression (measured: 3.6-5.5 us per
  -- call -> 0.7-1.3 us on this machine at a quarter of its speed).
  IF v_frozen IS NOT NULL AND v_frozen <> '' THEN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'pgtap') THEN
      RETURN v_frozen::timestamptz;
    END IF;
  END IF;
  RETURN clock_timestamp();
END $$;
COMMENT ON FUNCTION awp._now() IS 'The database clock used by every rule; frozen by SET awp.test_now in tests.';

-- awp._ms(interval): an interval as whole milliseconds (rounded down, never negative).
CREATE OR REPLACE FUNCTION awp._ms(p interval) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN greatest(0, floor(extract(epoch FROM p) * 1000))::bigint;
END $$;
COMMENT ON FUNCTION awp._ms(interval) IS 'An interval as non-negative whole milliseconds.';

-- awp._new_id(prefix): a random identifier such as run_3f2a….
CREATE OR REPLACE FUNCTION awp._new_id(p_prefix text) RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN p_prefix || '_' || replace(gen_random_uuid()::text, '-', '');
END $$;
COMMENT ON FUNCTION awp._new_id(text) IS 'A new random identifier with a type prefix.';

-- awp._token(): 32 random bytes as base64url (43 characters). Returned once, never stored.
CREATE OR REPLACE FUNCTION awp._token() RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN translate(rtrim(encode(public.gen_random_bytes(32), 'base64'), '='), '+/', '-_');
END $$;
COMMENT ON FUNCTION awp._token() IS 'A secret token: base64url of 32 random bytes.';

-- awp._hash(text): SHA-256 of a token; only this is stored.
CREATE OR REPLACE FUNCTION awp._hash(p text) RETURNS bytea
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN sha256(convert_to(coalesce(p, ''), 'UTF8'));
END $$;
COMMENT ON FUNCTION awp._hash(text) IS 'SHA-256 of a secret token.';

-- awp._executor_kinds(): the executor kinds a definition and a worker may name.
CREATE OR REPLACE FUNCTION awp._executor_kinds() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$ SELECT ARRAY['mock', 'python'] $$;
COMMENT ON FUNCTION awp._executor_kinds() IS 'The known executor kinds.';

-- awp._settings(): the settings row.
CREATE OR REPLACE FUNCTION awp._settings() RETURNS awp.settings
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s awp.settings;
BEGIN
  SELECT * INTO s FROM awp.settings;
  RETURN s;
END $$;
COMMENT ON FUNCTION awp._settings() IS 'The one settings row.';

-- awp._session(worker_id, token, lock): the worker row of a valid session.
-- Locks the worker row FOR UPDATE when p_lock. Raises AWSES for an unknown worker, a wrong token,
-- or an offline/stopped session; this check comes before every other check of a worker call.
CREATE OR REPLACE FUNCTION awp._session(p_worker_id text, p_session_token text, p_lock boolean)
RETURNS awp.workers
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w awp.workers;
BEGIN
  IF p_lock THEN
    SELECT * INTO w FROM awp.workers WHERE worker_id = p_worker_id FOR UPDATE;
  ELSE
    SELECT * INTO w FROM awp.workers WHERE worker_id = p_worker_id;
  END IF;
  IF NOT FOUND OR p_session_token IS NULL OR w.session_token_hash <> awp._hash(p_session_token) THEN
    PERFORM awp._raise_session_invalid('unknown worker or wrong session token');
  END IF;
  IF w.status NOT IN ('active', 'draining') THEN
    PERFORM awp._raise_session_invalid(format('worker %s is %s; register a new session', w.worker_id, w.status));
  END IF;
  RETURN w;
END $$;
COMMENT ON FUNCTION awp._session(text, text, boolean) IS 'Checks a worker session (AWSES when invalid) and returns the worker row.';

-- The per-call state of the runs a call changed (transaction-local setting awp.log_state): for each
-- run ";run_id,revision,last_sequence,unfinished_delta" -- the revision of this transaction, the last
-- event sequence used and the change to runs.unfinished_tasks not yet written. awp._append_events and
-- awp._unfinished_add keep it; awp._log_flush() writes it to the run rows (one UPDATE per run), and
-- every public function that changes a run calls it before it returns. The state lives only inside one public
-- call: every SECURITY DEFINER function sets awp.log_state (and awp.new_dispatches) empty on entry and
-- PostgreSQL gives the caller back its own value on exit (db/functions/zz_grants.sql), so a value a caller set
-- is never read, and a state left unflushed is lost, not written at commit (the pgTAP suite's
-- tests.sequences_contiguous and awp.check_invariants catch that). Updating a hot run row once per call,
-- not once per step, keeps its version chain short: every further update of a row in one
-- transaction makes each later lookup of it walk the chain, and blocks other writers longer.

-- awp._run_state(run): that run's entry, read from the state or (first use in this call) from its row,
-- whose lock the caller holds. The revision is bumped once per transaction (runs.revision_xid).
CREATE OR REPLACE FUNCTION awp._run_state(p_run_id text, OUT revision bigint, OUT last_sequence bigint,
                                          OUT unfinished_delta integer)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_state text := coalesce(current_setting('awp.log_state', true), '');
  v_pos   integer := strpos(v_state, ';' || p_run_id || ',');
  v_entry text;
BEGIN
  IF v_pos > 0 THEN
    v_entry := split_part(substr(v_state, v_pos + 1), ';', 1);
    revision := split_part(v_entry, ',', 2)::bigint;
    last_sequence := split_part(v_entry, ',', 3)::bigint;
    unfinished_delta := split_part(v_entry, ',', 4)::integer;
  ELSE
    SELECT CASE WHEN r.revision_xid = pg_current_xact_id() THEN r.revision ELSE r.revision + 1 END, r.last_sequence, 0
      INTO revision, last_sequence, unfinished_delta FROM awp.runs r WHERE r.run_id = p_run_id;
  END IF;
END $$;
COMMENT ON FUNCTION awp._run_state(text) IS 'A run''s revision, last sequence and unfinished-task change in this call (awp.log_state).';

-- awp._run_state_put(run, revision, last_sequence, unfinished_delta): stores a run's entry.
CREATE OR REPLACE FUNCTION awp._run_state_put(p_run_id text, p_revision bigint, p_last_sequence bigint,
                                              p_unfinished_delta integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_state text := coalesce(current_setting('awp.log_state', true), '');
  v_pos   integer := strpos(v_state, ';' || p_run_id || ',');
  v_new   text := ';' || p_run_id || ',' || p_revision || ',' || p_last_sequence || ',' || p_unfinished_delta;
BEGIN
  IF v_pos > 0 THEN
    v_state := replace(v_state, ';' || split_part(substr(v_state, v_pos + 1), ';', 1), v_new);
  ELSE
    v_state := v_state || v_new;
  END IF;
  PERFORM set_config('awp.log_state', v_state, true);
END $$;
COMMENT ON FUNCTION awp._run_state_put(text, bigint, bigint, integer) IS 'Stores a run''s entry of awp.log_state.';

-- Appending events (the run's history, awp.events): awp._append_events (any events, parallel arrays),
-- awp._append_events_alike (many entities of one type moving to one status for one reason) and
-- awp._append_event (one event). Every state change of a run goes through one of them.

-- awp._append_events(run, entity_types, keys, froms, tos, reasons): appends one event per array element
-- (parallel arrays) with contiguous per-run sequence numbers, all with the run's revision of this
-- transaction. The caller holds the run's row lock (lock order: Run first), so no other writer
-- interleaves; the run row itself is written by awp._log_flush().
CREATE OR REPLACE FUNCTION awp._append_events(p_run_id text, p_types text[], p_keys text[], p_from text[],
                                              p_to text[], p_reasons text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n integer := coalesce(cardinality(p_keys), 0);
  st  record;
BEGIN
  IF v_n = 0 THEN
    RETURN;
  END IF;
  st := awp._run_state(p_run_id);
  PERFORM awp._run_state_put(p_run_id, st.revision, st.last_sequence + v_n, st.unfinished_delta);
  INSERT INTO awp.events (run_id, sequence, revision, entity_type, entity_key, from_status, to_status,
                          reason, occurred_at)
  SELECT p_run_id, st.last_sequence + u.o, st.revision, u.t, u.k, u.f, u.s, u.r, awp._now()
    FROM unnest(p_types, p_keys, coalesce(p_from, '{}'::text[]), p_to, p_reasons) WITH ORDINALITY AS u(t, k, f, s, r, o);
END $$;
COMMENT ON FUNCTION awp._append_events(text, text[], text[], text[], text[], text[]) IS 'Appends events for a run (parallel arrays) with the revision of this transaction; the run row is updated by awp._log_flush().';

-- awp._unfinished_add(run, delta): changes the run's unfinished_tasks by delta, in the state (see
-- above); awp._unfinished_tasks(run) reads the value as it is now. The caller holds the run's lock.
CREATE OR REPLACE FUNCTION awp._unfinished_add(p_run_id text, p_delta integer) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st record;
BEGIN
  IF p_delta <> 0 THEN
    st := awp._run_state(p_run_id);
    PERFORM awp._run_state_put(p_run_id, st.revision, st.last_sequence, st.unfinished_delta + p_delta);
  END IF;
END $$;
COMMENT ON FUNCTION awp._unfinished_add(text, integer) IS 'Changes a run''s unfinished-task count (written by awp._log_flush).';

-- awp._log_flush(): writes each run's entry of awp.log_state to its row (revision, last sequence,
-- unfinished tasks; one UPDATE per run) and clears the state. Cheap when nothing was logged.
-- One UPDATE by primary key per entry, not one UPDATE joined with the entries: the planner hashed the join
-- against a sequential scan of every run (its statistics taken while runs was small), 0.45 ms per call with
-- 2,000 runs instead of 0.02 (AWP issue 46). Planned with enable_seqscan off (set around the loop): with runs
-- ANALYZEd while nearly empty, the plan scanned every run for each one, and a transaction that started 10,000 runs
-- (each start writes its row here) read all it had started for each (python/tests/sql/test_start_plans.py).
-- Locks: the run rows, which every caller of _append_events and _unfinished_add already holds.
CREATE OR REPLACE FUNCTION awp._log_flush() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_state text := current_setting('awp.log_state', true);
  v_entry text;
  v_seqscan text;
BEGIN
  IF v_state IS NULL OR v_state = '' THEN
    RETURN;
  END IF;
  PERFORM set_config('awp.log_state', '', true);
  v_seqscan := current_setting('enable_seqscan');
  PERFORM set_config('enable_seqscan', 'off', true);
  FOREACH v_entry IN ARRAY string_to_array(substr(v_state, 2), ';') LOOP
    UPDATE awp.runs r
       SET revision = split_part(v_entry, ',', 2)::bigint, revision_xid = pg_current_xact_id(),
           last_sequence = split_part(v_entry, ',', 3)::bigint,
           unfinished_tasks = r.unfinished_tasks + split_part(v_entry, ',', 4)::integer
     WHERE r.run_id = split_part(v_entry, ',', 1);
  END LOOP;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
END $$;
COMMENT ON FUNCTION awp._log_flush() IS 'Writes the per-call run state (revision, last sequence, unfinished tasks) to the run rows.';


-- awp._append_events_alike(run, entity_type, keys, froms, to, reason): appends one event per key, all of one
-- entity type, target status and reason (each key with its from status).
-- (PL/pgSQL rather than SQL, here and in the other small helpers called per task: PL/pgSQL caches
-- its plans, while a SQL function called from PL/pgSQL is planned again on every call.)
CREATE OR REPLACE FUNCTION awp._append_events_alike(p_run_id text, p_entity_type text, p_keys text[], p_from text[],
                                                    p_to text, p_reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n integer := coalesce(cardinality(p_keys), 0);
BEGIN
  IF v_n > 0 THEN
    PERFORM awp._append_events(p_run_id, array_fill(p_entity_type, ARRAY[v_n]), p_keys, p_from,
                               array_fill(p_to, ARRAY[v_n]), array_fill(p_reason, ARRAY[v_n]));
  END IF;
END $$;
COMMENT ON FUNCTION awp._append_events_alike(text, text, text[], text[], text, text) IS 'Appends events of one entity type and target status for a run.';

-- awp._append_event(run, entity_type, key, from, to, reason): appends one event.
CREATE OR REPLACE FUNCTION awp._append_event(p_run_id text, p_entity_type text, p_key text, p_from text,
                                             p_to text, p_reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM awp._append_events(p_run_id, ARRAY[p_entity_type], ARRAY[p_key], ARRAY[p_from], ARRAY[p_to], ARRAY[p_reason]);
END $$;
COMMENT ON FUNCTION awp._append_event(text, text, text, text, text, text) IS 'Appends one event for a run.';

-- awp._write_log(run, entity_types, keys, froms, tos, reasons, unfinished_delta, dispatched, now): a call's events of
-- one run and that run's row in one go, for a call that writes each run once (the hot path of claim on complete,
-- awp._lease_refill): the same rows as awp._append_events, awp._unfinished_add and awp._log_flush (revision bumped
-- once per transaction, sequences going on from the run's last), in one UPDATE and one INSERT. dispatched: the
-- call also dispatched for the run (its place in the fairness order moves, a pending run starts, as in
-- awp._dispatch_one). awp.log_state must not hold the run (the caller flushed it). Locks: the run row, which
-- the caller holds.
CREATE OR REPLACE FUNCTION awp._write_log(p_run_id text, p_types text[], p_keys text[], p_from text[], p_to text[],
                                          p_reasons text[], p_unfinished_delta integer, p_dispatched boolean,
                                          p_now timestamptz)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n    integer := coalesce(cardinality(p_keys), 0);
  v_xid  xid8 := pg_current_xact_id();
  v_rev  bigint;
  v_last bigint;
BEGIN
  UPDATE awp.runs x
     SET revision = CASE WHEN x.revision_xid = v_xid THEN x.revision ELSE x.revision + 1 END, revision_xid = v_xid,
         last_sequence = x.last_sequence + v_n, unfinished_tasks = x.unfinished_tasks + p_unfinished_delta,
         last_dispatch_seq = CASE WHEN p_dispatched THEN nextval('awp.dispatch_order_seq') ELSE x.last_dispatch_seq END,
         status = CASE WHEN p_dispatched THEN 'running' ELSE x.status END,
         started_at = CASE WHEN p_dispatched THEN coalesce(x.started_at, p_now) ELSE x.started_at END
   WHERE x.run_id = p_run_id
  RETURNING x.revision, x.last_sequence INTO v_rev, v_last;
  INSERT INTO awp.events (run_id, sequence, revision, entity_type, entity_key, from_status, to_status, reason, occurred_at)
  SELECT p_run_id, v_last - v_n + u.o, v_rev, u.t, u.k, u.f, u.s, u.r, p_now
    FROM unnest(p_types, p_keys, p_from, p_to, p_reasons) WITH ORDINALITY AS u(t, k, f, s, r, o);
END $$;
COMMENT ON FUNCTION awp._write_log(text, text[], text[], text[], text[], text[], integer, boolean, timestamptz) IS 'Appends a call''s events of a run and writes its row (revision, sequence, counters) in one go.';

-- Raising the project's errors: one helper per SQLSTATE (python/awp/server/errors.py maps each to its HTTP status and
-- error code; docs/sql-api.md lists them), so each code is written once, here. The message is the short
-- MESSAGE_TEXT (clients branch on the SQLSTATE, never on the text), the detail says exactly what is wrong
-- (PG_EXCEPTION_DETAIL; the gateway passes it on). PL/pgSQL: a RAISE cannot be inlined anyway, and the helpers
-- run only on the way out. Locks: none; none of them returns.

-- awp._raise_invalid_request(message, detail): AWREQ (400 invalid_request): malformed or out-of-range input.
CREATE OR REPLACE FUNCTION awp._raise_invalid_request(p_message text, p_detail text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWREQ', DETAIL = coalesce(p_detail, p_message);
END $$;
COMMENT ON FUNCTION awp._raise_invalid_request(text, text) IS 'Raises invalid_request (AWREQ).';

-- awp._raise_not_found(message, detail): AWNTF (404 not_found): an unknown run, task, workflow, worker, schedule.
CREATE OR REPLACE FUNCTION awp._raise_not_found(p_message text, p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWNTF', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_not_found(text, text) IS 'Raises not_found (AWNTF).';

-- awp._raise_session_invalid(detail): AWSES (401 worker_session_invalid): the worker must register anew.
CREATE OR REPLACE FUNCTION awp._raise_session_invalid(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'worker session is invalid' USING ERRCODE = 'AWSES', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_session_invalid(text) IS 'Raises worker_session_invalid (AWSES).';

-- awp._raise_protocol_unsupported(message, detail): AWPRO (400 worker_protocol_unsupported).
CREATE OR REPLACE FUNCTION awp._raise_protocol_unsupported(p_message text, p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWPRO', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_protocol_unsupported(text, text) IS 'Raises worker_protocol_unsupported (AWPRO).';

-- awp._raise_worker_draining(detail): AWDRN (409 worker_draining): a draining worker claims nothing new.
CREATE OR REPLACE FUNCTION awp._raise_worker_draining(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'worker is draining' USING ERRCODE = 'AWDRN', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_worker_draining(text) IS 'Raises worker_draining (AWDRN).';

-- awp._raise_capacity_exceeded(detail): AWCAP (409 worker_capacity_exceeded): more slots asked than are free.
CREATE OR REPLACE FUNCTION awp._raise_capacity_exceeded(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'worker capacity exceeded' USING ERRCODE = 'AWCAP', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_capacity_exceeded(text) IS 'Raises worker_capacity_exceeded (AWCAP).';

-- awp._raise_lease_lost(detail): AWLST (409 lease_lost): the lease is not (or no longer) this worker's to complete.
CREATE OR REPLACE FUNCTION awp._raise_lease_lost(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'lease lost' USING ERRCODE = 'AWLST', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_lease_lost(text) IS 'Raises lease_lost (AWLST).';

-- awp._raise_too_large(message, detail): AWBIG (413 payload_too_large): a value over its size limit (a progress value,
-- a log line, an output chunk: docs/progress.md); the detail names the limit.
CREATE OR REPLACE FUNCTION awp._raise_too_large(p_message text, p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWBIG', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_too_large(text, text) IS 'Raises payload_too_large (AWBIG).';

-- awp._raise_result_conflict(detail): AWCNF (409 result_conflict): a completed lease reported with another result.
CREATE OR REPLACE FUNCTION awp._raise_result_conflict(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'result conflict' USING ERRCODE = 'AWCNF', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_result_conflict(text) IS 'Raises result_conflict (AWCNF).';

-- awp._raise_idempotency_conflict(message, detail): AWIDM (409 idempotency_conflict): a key reused for another request.
CREATE OR REPLACE FUNCTION awp._raise_idempotency_conflict(p_message text, p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWIDM', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_idempotency_conflict(text, text) IS 'Raises idempotency_conflict (AWIDM).';

-- awp._raise_leadership_lost(message, detail): AWLDR, internal (never a client's answer): a fenced coordinator
-- pass, heartbeat or retention batch whose term is over (db/functions/leadership.sql).
CREATE OR REPLACE FUNCTION awp._raise_leadership_lost(p_message text, p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION '%', p_message USING ERRCODE = 'AWLDR', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_leadership_lost(text, text) IS 'Raises leadership lost (AWLDR, internal).';

-- awp._raise_signal_not_waiting(detail): AWSIG (409 signal_not_waiting): a signal to a task that does not wait for
-- one (docs/waits.md).
CREATE OR REPLACE FUNCTION awp._raise_signal_not_waiting(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'task not waiting for a signal' USING ERRCODE = 'AWSIG', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_signal_not_waiting(text) IS 'Raises AWSIG (signal_not_waiting).';

-- awp._raise_group_not_applicable(detail): AWGRP, internal (never a client's answer): the group path of
-- awp.complete_and_claim_many (awp._complete_and_refill_group) does not apply to this group; the caller rolls it
-- back and settles the items one by one.
CREATE OR REPLACE FUNCTION awp._raise_group_not_applicable(p_detail text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE EXCEPTION 'group path not applicable' USING ERRCODE = 'AWGRP', DETAIL = p_detail;
END $$;
COMMENT ON FUNCTION awp._raise_group_not_applicable(text) IS 'Raises group path not applicable (AWGRP, internal).';

-- awp._wake(channel, payload): a NOTIFY hint (delivered at commit). Tables stay the truth.
-- Channels: awp_dispatch (sent by awp._notify_pending: one per dispatch left pending),
--           awp_coordinator (capacity freed, new run, completion, cancel, new worker).
CREATE OR REPLACE FUNCTION awp._wake(p_channel text, p_payload text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM pg_notify(p_channel, coalesce(p_payload, ''));
END $$;
COMMENT ON FUNCTION awp._wake(text, text) IS 'Sends a NOTIFY wake-up hint.';
