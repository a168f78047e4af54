-- Private helpers shared by the public functions: time, ids, tokens, hashing, sessions, events.
-- None of them is granted to awp_gateway; they run inside the SECURITY DEFINER callers.

-- awp._now(): the one clock. Database time (clock_timestamp), unless a test froze it with
-- SET awp.test_now = '…' (pgTAP does; see db/tests). The frozen clock is honoured only in a test
-- database (one with the pgtap extension, which migrations install nowhere else), so no client
-- of a real database can move time for its leases. Takes no locks, raises nothing.
CREATE OR REPLACE FUNCTION awp._now() RETURNS timestamptz
LANGUAGE sql VOLATILE SET search_path = '' AS $$
  SELECT CASE WHEN coalesce(current_setting('awp.test_now', true), '') <> ''
                   AND EXISTS (SELECT 1 FROM pg_catalog.pg_extension e WHERE e.extname = 'pgtap')
              THEN current_setting('awp.test_now')::timestamptz
              ELSE clock_timestamp() END
$$;
COMMENT ON FUNCTION awp._now() IS 'The database clock used by every rule; frozen by SET awp.test_now in tests.';

-- awp._ms(interval): an interval as whole milliseconds (rounded down, never negative).
CREATE OR REPLACE FUNCTION awp._ms(p interval) RETURNS bigint
LANGUAGE sql IMMUTABLE SET search_path = '' AS $$
  SELECT greatest(0, floor(extract(epoch FROM p) * 1000))::bigint
$$;
COMMENT ON FUNCTION awp._ms(interval) IS 'An interval as non-negative whole milliseconds.';

-- awp._new_id(prefix): a random identifier such as run_3f2a….
CREATE OR REPLACE FUNCTION awp._new_id(p_prefix text) RETURNS text
LANGUAGE sql VOLATILE SET search_path = '' AS $$
  SELECT p_prefix || '_' || replace(pg_catalog.gen_random_uuid()::text, '-', '')
$$;
COMMENT ON FUNCTION awp._new_id(text) IS 'A new random identifier with a type prefix.';

-- awp._token(): 32 random bytes as base64url (43 characters). Returned once, never stored.
CREATE OR REPLACE FUNCTION awp._token() RETURNS text
LANGUAGE sql VOLATILE SET search_path = '' AS $$
  SELECT translate(rtrim(encode(public.gen_random_bytes(32), 'base64'), '='), '+/', '-_')
$$;
COMMENT ON FUNCTION awp._token() IS 'A secret token: base64url of 32 random bytes.';

-- awp._hash(text): SHA-256 of a token; only this is stored.
CREATE OR REPLACE FUNCTION awp._hash(p text) RETURNS bytea
LANGUAGE sql IMMUTABLE SET search_path = '' AS $$
  SELECT sha256(convert_to(coalesce(p, ''), 'UTF8'))
$$;
COMMENT ON FUNCTION awp._hash(text) IS 'SHA-256 of a secret token.';

-- awp._executor_kinds(): the executor kinds a definition and a worker may name.
CREATE OR REPLACE FUNCTION awp._executor_kinds() RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = '' AS $$ SELECT ARRAY['mock', 'python'] $$;
COMMENT ON FUNCTION awp._executor_kinds() IS 'The known executor kinds.';

-- awp._settings(): the settings row.
CREATE OR REPLACE FUNCTION awp._settings() RETURNS awp.settings
LANGUAGE plpgsql STABLE SET search_path = '' AS $$
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
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  w awp.workers;
BEGIN
  IF p_lock THEN
    SELECT * INTO w FROM awp.workers WHERE worker_id = p_worker_id FOR UPDATE;
  ELSE
    SELECT * INTO w FROM awp.workers WHERE worker_id = p_worker_id;
  END IF;
  IF NOT FOUND OR p_session_token IS NULL OR w.session_token_hash <> awp._hash(p_session_token) THEN
    RAISE EXCEPTION 'worker session is invalid' USING ERRCODE = 'AWSES',
      DETAIL = 'unknown worker or wrong session token';
  END IF;
  IF w.status NOT IN ('active', 'draining') THEN
    RAISE EXCEPTION 'worker session is invalid' USING ERRCODE = 'AWSES',
      DETAIL = format('worker %s is %s; register a new session', w.worker_id, w.status);
  END IF;
  RETURN w;
END $$;
COMMENT ON FUNCTION awp._session(text, text, boolean) IS 'Checks a worker session (AWSES when invalid) and returns the worker row.';

-- awp._logn(run, entity_types, keys, froms, tos, reasons): appends one event per array element
-- (parallel arrays) with contiguous per-run sequence numbers, and bumps the run's revision exactly
-- once per transaction (runs.revision_xid remembers the transaction that bumped it last).
-- The caller holds the run's row lock (lock order: Run first), so no other writer interleaves.
CREATE OR REPLACE FUNCTION awp._logn(p_run_id text, p_types text[], p_keys text[], p_from text[],
                                     p_to text[], p_reasons text[])
RETURNS void
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  v_n    integer := coalesce(cardinality(p_keys), 0);
  v_xid  xid8 := pg_current_xact_id();
  v_rev  bigint;
  v_base bigint;
  v_now  timestamptz;
BEGIN
  IF v_n = 0 THEN
    RETURN;
  END IF;
  v_now := awp._now();
  UPDATE awp.runs r
     SET revision = CASE WHEN r.revision_xid = v_xid THEN r.revision ELSE r.revision + 1 END,
         revision_xid = v_xid,
         last_sequence = r.last_sequence + v_n
   WHERE r.run_id = p_run_id
  RETURNING r.revision, r.last_sequence - v_n INTO v_rev, v_base;
  INSERT INTO awp.events (run_id, sequence, revision, entity_type, entity_key, from_status, to_status,
                          reason, occurred_at)
  SELECT p_run_id, v_base + u.o, v_rev, u.t, u.k, u.f, u.s, u.r, v_now
    FROM unnest(p_types, p_keys, coalesce(p_from, '{}'::text[]), p_to, p_reasons) WITH ORDINALITY AS u(t, k, f, s, r, o);
END $$;
COMMENT ON FUNCTION awp._logn(text, text[], text[], text[], text[], text[]) IS 'Appends events for a run (parallel arrays) and bumps its revision once per transaction.';

-- awp._log(run, entity_type, keys, froms, to, reason): events of one entity type and target status.
-- (PL/pgSQL rather than SQL, here and in the other small helpers called per task: PL/pgSQL caches
-- its plans, while a SQL function called from PL/pgSQL is planned again on every call.)
CREATE OR REPLACE FUNCTION awp._log(p_run_id text, p_entity_type text, p_keys text[], p_from text[],
                                    p_to text, p_reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  v_n integer := coalesce(cardinality(p_keys), 0);
BEGIN
  IF v_n > 0 THEN
    PERFORM awp._logn(p_run_id, array_fill(p_entity_type, ARRAY[v_n]), p_keys, p_from,
                      array_fill(p_to, ARRAY[v_n]), array_fill(p_reason, ARRAY[v_n]));
  END IF;
END $$;
COMMENT ON FUNCTION awp._log(text, text, text[], text[], text, text) IS 'Appends events of one entity type and target status for a run.';

-- awp._log1: one event.
CREATE OR REPLACE FUNCTION awp._log1(p_run_id text, p_entity_type text, p_key text, p_from text,
                                     p_to text, p_reason text)
RETURNS void
LANGUAGE plpgsql SET search_path = '' AS $$
BEGIN
  PERFORM awp._logn(p_run_id, ARRAY[p_entity_type], ARRAY[p_key], ARRAY[p_from], ARRAY[p_to], ARRAY[p_reason]);
END $$;
COMMENT ON FUNCTION awp._log1(text, text, text, text, text, text) IS 'Appends one event for a run.';

-- awp._wake(channel, payload): a NOTIFY hint (delivered at commit). Tables stay the truth.
-- Channels: awp_dispatch (sent by awp._notify_pending: one per dispatch left pending),
--           awp_coordinator (capacity freed, new run, completion, cancel, new worker).
CREATE OR REPLACE FUNCTION awp._wake(p_channel text, p_payload text) RETURNS void
LANGUAGE plpgsql SET search_path = '' AS $$
BEGIN
  PERFORM pg_notify(p_channel, coalesce(p_payload, ''));
END $$;
COMMENT ON FUNCTION awp._wake(text, text) IS 'Sends a NOTIFY wake-up hint.';
