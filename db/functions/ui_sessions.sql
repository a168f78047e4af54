-- Dashboard sessions (python/awp/server/ui/session.py, docs/operations.md "Dashboard sessions"). A session is a cookie
-- signed by the gateway, so every replica accepts it without asking the database; signing out records the
-- session's id here, and every replica refuses a recorded id on the next request. A row is kept until an hour
-- after the last cookie of its session would have expired anyway (the hour covers clock skew between the
-- gateways, whose clock signs the cookies, and the database).

-- awp.revoke_ui_session(session_id, expires_at): signs a dashboard session out everywhere: records its id
-- until expires_at (the end of its absolute lifetime, at most a day ahead) plus an hour; recording it twice is
-- a no-op. Also deletes up to 100 rows whose hour has passed, so the table holds about the sessions signed out
-- within the last absolute lifetime. AWREQ for an id that is not 1-64 characters, or expires_at NULL or more
-- than a day ahead.
-- Locks: the session's row (INSERT ... ON CONFLICT DO NOTHING), then expired rows with FOR UPDATE SKIP LOCKED
-- (a row another sign-out is deleting is left to the next one): never waits for another transaction.
CREATE OR REPLACE FUNCTION awp.revoke_ui_session(p_session_id text, p_expires_at timestamptz)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now timestamptz := awp._now();
BEGIN
  IF p_session_id IS NULL OR length(p_session_id) NOT BETWEEN 1 AND 64 THEN
    PERFORM awp._raise_invalid_request('invalid session_id', 'session_id must be a string of 1-64 characters');
  END IF;
  IF p_expires_at IS NULL OR p_expires_at > v_now + interval '1 day' THEN
    PERFORM awp._raise_invalid_request('invalid expires_at',
      'expires_at must be a time at most a day ahead (when the session''s last cookie expires)');
  END IF;
  IF p_expires_at + interval '1 hour' > v_now THEN
    INSERT INTO awp.ui_revoked_sessions (session_id, expires_at)
    VALUES (p_session_id, p_expires_at)
    ON CONFLICT (session_id) DO NOTHING;
  END IF;
  WITH x AS (
    SELECT s.session_id FROM awp.ui_revoked_sessions s
     WHERE s.expires_at < v_now - interval '1 hour'
     ORDER BY s.expires_at
     LIMIT 100
       FOR UPDATE SKIP LOCKED
  )
  DELETE FROM awp.ui_revoked_sessions s USING x WHERE s.session_id = x.session_id;
END $$;
COMMENT ON FUNCTION awp.revoke_ui_session(text, timestamptz) IS 'Signs a dashboard session out on every gateway: records its id until its last cookie expires (plus an hour) and deletes up to 100 expired records; AWREQ for a bad id or an expiry NULL or over a day ahead.';

-- awp.ui_session_revoked(session_id): whether that dashboard session was signed out (awp.revoke_ui_session) and
-- its record is still kept. One primary-key lookup; every dashboard request with a valid cookie calls it.
-- Locks: none.
CREATE OR REPLACE FUNCTION awp.ui_session_revoked(p_session_id text)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM awp.ui_revoked_sessions s WHERE s.session_id = p_session_id)
$$;
COMMENT ON FUNCTION awp.ui_session_revoked(text) IS 'Whether a dashboard session was signed out (awp.revoke_ui_session); one primary-key lookup.';
