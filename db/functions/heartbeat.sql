-- awp.heartbeat(worker_id, session_token, leases): proves a worker alive (also with no leases)
-- and answers per lease (docs/protocol.md, rule 6):
--   renewed  lease_expires_at := least(now + lease_duration, attempt_deadline)
--   revoked  the dispatch is no longer leased (canceled, expired, completed), the lease or the
--            attempt deadline has passed, or the run's cancellation was requested
--   unknown  no such dispatch, another worker's, or a wrong lease token
-- All leases are renewed in one statement. Raises AWSES (checked first), AWREQ (malformed leases).
-- Locks: the worker row, then the renewable dispatches with SKIP LOCKED: a dispatch that another
-- transaction is settling right now is answered from its committed state without renewal (the
-- next heartbeat renews it), so a heartbeat never waits behind the reaper or a cancellation.
CREATE OR REPLACE FUNCTION awp.heartbeat(p_worker_id text, p_session_token text, p_leases jsonb)
RETURNS TABLE (dispatch_id text, status text, lease_remaining_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
#variable_conflict use_column
DECLARE
  w     awp.workers := awp._session(p_worker_id, p_session_token, true);
  s     awp.settings := awp._settings();
  v_now timestamptz := awp._now();
BEGIN
  p_leases := coalesce(p_leases, '[]'::jsonb);
  IF jsonb_typeof(p_leases) <> 'array' OR jsonb_array_length(p_leases) > 1024 OR EXISTS (
       SELECT 1 FROM jsonb_array_elements(p_leases) e
        WHERE jsonb_typeof(e) <> 'object'
           OR jsonb_typeof(e->'dispatch_id') IS DISTINCT FROM 'string'
           OR jsonb_typeof(e->'lease_token') IS DISTINCT FROM 'string'
           OR EXISTS (SELECT 1 FROM jsonb_object_keys(e) k WHERE k NOT IN ('dispatch_id', 'lease_token'))) THEN
    PERFORM awp._bad_request('invalid leases',
      'leases must be an array of at most 1024 {"dispatch_id": string, "lease_token": string} objects');
  END IF;
  UPDATE awp.workers x SET last_heartbeat_at = v_now WHERE x.worker_id = p_worker_id;

  WITH req AS (
    SELECT DISTINCT e->>'dispatch_id' AS id, awp._hash(e->>'lease_token') AS h
      FROM jsonb_array_elements(p_leases) e
  ), renewable AS (
    SELECT d.dispatch_id
      FROM awp.dispatches d
      JOIN req ON req.id = d.dispatch_id AND req.h = d.lease_token_hash
      JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.worker_id = p_worker_id AND d.status = 'leased'
       AND v_now < d.lease_expires_at AND v_now < d.attempt_deadline
       AND r.cancel_requested_at IS NULL AND r.status = 'running'
     ORDER BY d.dispatch_id
     FOR UPDATE OF d SKIP LOCKED
  )
  UPDATE awp.dispatches d
     SET lease_expires_at = greatest(d.lease_expires_at,
                                     least(v_now + make_interval(secs => s.lease_duration_ms / 1000.0),
                                           d.attempt_deadline))
    FROM renewable WHERE d.dispatch_id = renewable.dispatch_id;

  RETURN QUERY
  SELECT e.id,
         CASE
           WHEN d.dispatch_id IS NULL OR d.worker_id IS DISTINCT FROM p_worker_id
                OR d.lease_token_hash IS DISTINCT FROM e.h THEN 'unknown'
           WHEN d.status <> 'leased' OR v_now >= d.lease_expires_at OR v_now >= d.attempt_deadline
                OR r.cancel_requested_at IS NOT NULL OR r.status <> 'running' THEN 'revoked'
           ELSE 'renewed'
         END,
         CASE
           WHEN d.dispatch_id IS NOT NULL AND d.worker_id = p_worker_id AND d.lease_token_hash = e.h
                AND d.status = 'leased' AND v_now < d.lease_expires_at AND v_now < d.attempt_deadline
                AND r.cancel_requested_at IS NULL AND r.status = 'running'
           THEN awp._ms(d.lease_expires_at - v_now) ELSE 0::bigint
         END
    FROM (SELECT x->>'dispatch_id' AS id, awp._hash(x->>'lease_token') AS h, o
            FROM jsonb_array_elements(p_leases) WITH ORDINALITY AS a(x, o)) e
    LEFT JOIN awp.dispatches d ON d.dispatch_id = e.id
    LEFT JOIN awp.runs r ON r.run_id = d.run_id
   ORDER BY e.o;
END $$;
COMMENT ON FUNCTION awp.heartbeat(text, text, jsonb) IS 'Records liveness and renews, revokes or disowns each listed lease (renewed/revoked/unknown); AWSES/AWREQ.';
