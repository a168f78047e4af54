-- awp.register_worker(display_name, executor_kinds, max_concurrency, protocol_version, actions):
-- opens a new worker session. The session token is returned in plain text exactly once; only its
-- SHA-256 is stored. actions (routing by action, db/functions/_routing.sql): {executor kind: [action, ...]},
-- the only actions it runs of each kind named; a kind not named, or NULL (a worker that sends no list), runs
-- every action (awp._check_actions). Raises AWPRO for an unsupported protocol version, AWREQ for bad arguments.
-- Locks: none (insert); wakes the coordinator (new capacity).
CREATE OR REPLACE FUNCTION awp.register_worker(p_display_name text, p_executor_kinds text[],
                                               p_max_concurrency integer, p_protocol_version integer DEFAULT 1,
                                               p_actions jsonb DEFAULT NULL)
RETURNS TABLE (worker_id text, session_token text, heartbeat_interval_ms integer,
               lease_duration_ms integer, protocol_version integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  v_id    text := awp._new_id('wkr');
  v_token text := awp._token();
  v_now   timestamptz := awp._now();
  s       awp.settings := awp._settings();
  v_bad   text;
BEGIN
  IF p_protocol_version IS DISTINCT FROM 1 THEN
    PERFORM awp._raise_protocol_unsupported(format('worker protocol version %s is not supported', p_protocol_version),
                                            'supported protocol versions: 1');
  END IF;
  IF p_display_name IS NULL OR length(p_display_name) NOT BETWEEN 1 AND 128 THEN
    PERFORM awp._raise_invalid_request('invalid display_name', 'display_name must have 1-128 characters');
  END IF;
  IF p_executor_kinds IS NULL OR cardinality(p_executor_kinds) = 0 THEN
    PERFORM awp._raise_invalid_request('invalid executor_kinds', 'executor_kinds must name at least one kind');
  END IF;
  SELECT string_agg(coalesce(k, 'null'), ', ') INTO v_bad
    FROM unnest(p_executor_kinds) k WHERE k IS NULL OR NOT k = ANY (awp._executor_kinds());
  IF v_bad IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('unknown executor kind',
      format('unknown executor kinds: %s (known: %s)', v_bad, array_to_string(awp._executor_kinds(), ', ')));
  END IF;
  IF p_max_concurrency IS NULL OR p_max_concurrency NOT BETWEEN 1 AND 1000 THEN
    PERFORM awp._raise_invalid_request('invalid max_concurrency', 'max_concurrency must be from 1 to 1000');
  END IF;
  PERFORM awp._check_actions(p_actions, p_executor_kinds);
  INSERT INTO awp.workers (worker_id, display_name, executor_kinds, max_concurrency, protocol_version,
                           session_token_hash, registered_at, last_heartbeat_at, actions)
  VALUES (v_id, p_display_name, ARRAY(SELECT DISTINCT k FROM unnest(p_executor_kinds) k ORDER BY k),
          p_max_concurrency, p_protocol_version, awp._hash(v_token), v_now, v_now, p_actions);
  PERFORM awp._wake('awp_coordinator', 'worker_registered');
  RETURN QUERY SELECT v_id, v_token, s.heartbeat_interval_ms, s.lease_duration_ms, p_protocol_version;
END $$;
COMMENT ON FUNCTION awp.register_worker(text, text[], integer, integer, jsonb) IS 'Registers a worker session (with the actions it runs per executor kind, when it lists them); returns its id and session token (shown once); AWPRO/AWREQ on bad input.';
