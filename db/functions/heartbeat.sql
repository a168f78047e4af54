-- awp.heartbeat(worker_id, session_token, leases, claimed_through, claims_pending, dropped): proves a worker
-- alive (also with no leases) and answers per lease (docs/protocol.md, rule 6):
--   renewed  lease_expires_at := least(now + lease_duration, attempt_deadline)
--   revoked  the dispatch is no longer leased (canceled, expired, completed), the lease or the
--            attempt deadline has passed, or the run's cancellation was requested
--   unknown  no such dispatch, another worker's, or a wrong lease token
-- Lease recovery (docs/protocol.md, Lease recovery), only for a worker that sends claimed_through (an older
-- worker keeps the rules above and nothing more):
--   not received  a lease of this worker whose claim request (dispatches.claim_seq) is at or before
--                 claimed_through and not in claims_pending (the requests still waiting for their answer),
--                 that is listed neither in leases nor in dropped (nor was dropped before), is one whose
--                 answer never reached the worker: its lease ends now (uncounted = not_received) and the next
--                 coordinator pass, woken at once, ends its attempt as not_received, not counted against
--                 max_attempts. A lease granted to a request the worker still waits for is never released
--                 (its claim_seq is pending or after claimed_through), so neither is one granted after the
--                 worker composed this heartbeat.
--   outage        while no coordinator has passed for longer than a heartbeat interval (the database or every
--                 gateway was down), a listed lease that expired after the last pass (no reaper has seen it)
--                 is renewed as if it had not expired: lease time does not run while no coordinator can work.
--   dropped       leases the worker gave up without a result (its local safety deadline passed, its result was
--                 dropped): marked dropped_at, never renewed nor released as not received; they end as before
--                 at their expiry, except one in outage grace (uncounted = outage), whose lease ends now.
-- All leases are renewed in one statement. Raises AWSES (checked first), AWREQ (malformed leases, dropped or
-- claims).
-- Locks: the worker row, then the renewable, dropped and released dispatches with SKIP LOCKED: a dispatch that
-- another transaction is settling right now is answered from its committed state without a change (the
-- next heartbeat renews, marks or releases it), so a heartbeat never waits behind the reaper or a cancellation.
-- A heartbeat waits for its worker's row with twice the session's lock_timeout (awp._outwait_completion): the
-- longest holder of that row that is itself waiting is a completion of this worker at the head of a stuck
-- run's queue, which gives up after one lock_timeout (docs/architecture.md, Lock order); the heartbeat is then
-- answered after it instead of timing out with it (or after the next one, when that takes the freed row first:
-- docs/operations.md, Timeouts and pools).
-- awp._outwait_completion(): for the rest of this transaction, lock_timeout doubled (unless it is 0, no
-- limit; at most the largest value PostgreSQL takes). Once per transaction: a further call (several heartbeats
-- in one transaction) leaves the doubled value as it is, unless the caller has set another one meanwhile
-- (awp.outwait_set keeps the value this set). Locks: none.
CREATE OR REPLACE FUNCTION awp._outwait_completion() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_ms  bigint := (extract(epoch FROM current_setting('lock_timeout')::interval) * 1000)::bigint;
  v_set text := current_setting('awp.outwait_set', true);
BEGIN
  IF v_ms > 0 AND v_ms::text IS DISTINCT FROM nullif(v_set, '') THEN
    v_ms := least(2 * v_ms, 2147483647);
    PERFORM set_config('lock_timeout', v_ms::text, true);
    PERFORM set_config('awp.outwait_set', v_ms::text, true);
  END IF;
END $$;
COMMENT ON FUNCTION awp._outwait_completion() IS 'Doubles lock_timeout for this transaction (a heartbeat outwaits its worker''s completion queued on a stuck run).';

-- awp._check_lease_refs(refs, name): AWREQ (naming the heartbeat argument `name`) unless refs is an array of at
-- most awp._limit_heartbeat_list() {"dispatch_id": string, "lease_token": string} objects. Locks: none.
CREATE OR REPLACE FUNCTION awp._check_lease_refs(p_refs jsonb, p_name text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF jsonb_typeof(p_refs) <> 'array' OR jsonb_array_length(p_refs) > awp._limit_heartbeat_list() OR EXISTS (
       SELECT 1 FROM jsonb_array_elements(p_refs) e
        WHERE jsonb_typeof(e) <> 'object'
           OR jsonb_typeof(e->'dispatch_id') IS DISTINCT FROM 'string'
           OR jsonb_typeof(e->'lease_token') IS DISTINCT FROM 'string'
           OR e - '{dispatch_id,lease_token}'::text[] <> '{}'::jsonb) THEN   -- an unknown key
    PERFORM awp._raise_invalid_request('invalid ' || p_name,
      format('%s must be an array of at most %s {"dispatch_id": string, "lease_token": string} objects',
             p_name, awp._limit_heartbeat_list()));
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_lease_refs(jsonb, text) IS 'Validates a heartbeat''s list of {dispatch_id, lease_token} (AWREQ).';

CREATE OR REPLACE FUNCTION awp.heartbeat(p_worker_id text, p_session_token text, p_leases jsonb,
                                         p_claimed_through bigint DEFAULT NULL,
                                         p_claims_pending bigint[] DEFAULT NULL,
                                         p_dropped jsonb DEFAULT NULL)
RETURNS TABLE (dispatch_id text, status text, lease_remaining_ms bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  w      awp.workers;
  s      awp.settings := awp._settings();
  v_now  timestamptz := awp._now();
  v_seqscan text := current_setting('enable_seqscan');   -- restored after the key probes below
  -- An outage (for a worker that takes part in lease recovery): no coordinator pass for longer than a heartbeat
  -- interval. Leases that expired after the last pass are then suspended, not over.
  v_outage boolean := p_claimed_through IS NOT NULL AND s.last_tick_at IS NOT NULL
                      AND v_now - s.last_tick_at > make_interval(secs => s.heartbeat_interval_ms / 1000.0);
  v_t0   timestamptz := s.last_tick_at;
  v_ended integer := 0;
  v_n    integer;
BEGIN
  PERFORM awp._outwait_completion();   -- before the worker row's lock (see above)
  w := awp._session(p_worker_id, p_session_token, true);   -- AWSES first
  p_leases := coalesce(p_leases, '[]'::jsonb);
  p_dropped := coalesce(p_dropped, '[]'::jsonb);
  PERFORM awp._check_lease_refs(p_leases, 'leases');
  PERFORM awp._check_lease_refs(p_dropped, 'dropped');
  IF p_claimed_through < 0 OR cardinality(p_claims_pending) > awp._limit_heartbeat_list()
     OR array_position(p_claims_pending, NULL) IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid claims',
      format('claimed_through must be at least 0 and claims_pending an array of at most %s claim numbers',
             awp._limit_heartbeat_list()));
  END IF;
  UPDATE awp.workers x SET last_heartbeat_at = v_now WHERE x.worker_id = p_worker_id;

  -- Each listed lease found by key (LATERAL ... LIMIT 1, in dispatch_id order): as a join, a generic plan over the
  -- partitioned tables read every leased dispatch and every run (1,140 buffers per heartbeat of 16 leases at 1,000
  -- runs; docs/performance.md). Its lease conditions are not part of the probe (status = 'leased' would let a plan
  -- made while a partition held no lease read the partial index of leases, dead entries and all): the row is found
  -- and locked by its id and token, the rest is checked on it. Planned with enable_seqscan off (set around it, as the
  -- answers below), so a plan made while the tables were small probes too (python/tests/sql/test_completion_plans.py).
  PERFORM set_config('enable_seqscan', 'off', true);
  WITH req AS (
    SELECT DISTINCT e->>'dispatch_id' AS id, awp._hash(e->>'lease_token') AS h
      FROM jsonb_array_elements(p_leases) e
     ORDER BY 1
  ), renewable AS (
    SELECT d.dispatch_id
      FROM req
     CROSS JOIN LATERAL (SELECT y.* FROM awp.dispatches y WHERE y.dispatch_id = req.id AND y.lease_token_hash = req.h
                          LIMIT 1 FOR UPDATE SKIP LOCKED) d
     WHERE d.worker_id = p_worker_id AND d.status = 'leased'
       AND (v_now < d.lease_expires_at
            OR (v_outage AND d.lease_expires_at > v_t0 AND d.uncounted IS DISTINCT FROM 'not_received'))
       AND v_now < d.attempt_deadline
       AND (SELECT r.cancel_requested_at IS NULL AND r.status = 'running'   -- its run, by key
              FROM awp.runs r WHERE r.run_id = d.run_id LIMIT 1)
  )
  UPDATE awp.dispatches d
     SET lease_expires_at = greatest(d.lease_expires_at,
                                     least(v_now + make_interval(secs => s.lease_duration_ms / 1000.0),
                                           d.attempt_deadline))
   WHERE d.dispatch_id = ANY (ARRAY(SELECT renewable.dispatch_id FROM renewable));
  PERFORM set_config('enable_seqscan', v_seqscan, true);

  IF jsonb_array_length(p_dropped) > 0 THEN
    WITH req AS (   -- found by key, as the renewals above
      SELECT DISTINCT e->>'dispatch_id' AS id, awp._hash(e->>'lease_token') AS h
        FROM jsonb_array_elements(p_dropped) e
       ORDER BY 1
    ), gone AS (
      SELECT d.dispatch_id
        FROM req
       CROSS JOIN LATERAL (SELECT y.* FROM awp.dispatches y WHERE y.dispatch_id = req.id AND y.lease_token_hash = req.h
                            LIMIT 1 FOR UPDATE SKIP LOCKED) d
       WHERE d.worker_id = p_worker_id AND d.status = 'leased' AND d.dropped_at IS NULL
    ), u AS (
      UPDATE awp.dispatches d
         SET dropped_at = v_now,
             lease_expires_at = CASE WHEN d.uncounted = 'outage' THEN least(d.lease_expires_at, v_now)
                                     ELSE d.lease_expires_at END
       WHERE d.dispatch_id = ANY (ARRAY(SELECT gone.dispatch_id FROM gone))
      RETURNING d.uncounted
    )
    SELECT count(*) FILTER (WHERE u.uncounted = 'outage') INTO v_n FROM u;
    v_ended := v_ended + v_n;
  END IF;

  IF p_claimed_through IS NOT NULL THEN
    WITH listed AS (
      SELECT e->>'dispatch_id' AS id FROM jsonb_array_elements(p_leases) e
      UNION
      SELECT e->>'dispatch_id' FROM jsonb_array_elements(p_dropped) e
    ), lost AS (
      SELECT d.dispatch_id
        FROM awp.dispatches d
       WHERE d.worker_id = p_worker_id AND d.status = 'leased'
         AND d.claim_seq <= p_claimed_through AND d.claim_seq <> ALL (coalesce(p_claims_pending, '{}'))
         AND d.dropped_at IS NULL AND d.uncounted IS DISTINCT FROM 'not_received'
         AND d.dispatch_id NOT IN (SELECT listed.id FROM listed)
         AND (v_now < d.lease_expires_at OR (v_outage AND d.lease_expires_at > v_t0))
         AND v_now < d.attempt_deadline
         AND (SELECT r.cancel_requested_at IS NULL AND r.status = 'running'   -- by key (a join read every run)
                FROM awp.runs r WHERE r.run_id = d.run_id LIMIT 1)
       ORDER BY d.dispatch_id
       FOR UPDATE OF d SKIP LOCKED
    )
    UPDATE awp.dispatches d
       SET uncounted = 'not_received', lease_expires_at = least(d.lease_expires_at, v_now)
     WHERE d.dispatch_id = ANY (ARRAY(SELECT lost.dispatch_id FROM lost));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_ended := v_ended + v_n;
  END IF;
  IF v_ended > 0 THEN
    PERFORM awp._wake('awp_coordinator', 'leases_released');   -- the reaper settles them at once
  END IF;

  PERFORM set_config('enable_seqscan', 'off', true);
  RETURN QUERY
  SELECT e.id,
         CASE
           WHEN d.dispatch_id IS NULL OR d.worker_id IS DISTINCT FROM p_worker_id
                OR d.lease_token_hash IS DISTINCT FROM e.h THEN 'unknown'
           WHEN d.status <> 'leased' OR v_now >= d.attempt_deadline
                OR (v_now >= d.lease_expires_at
                    AND NOT (v_outage AND d.lease_expires_at > v_t0 AND d.uncounted IS DISTINCT FROM 'not_received'))
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
    LEFT JOIN LATERAL (SELECT y.* FROM awp.dispatches y WHERE y.dispatch_id = e.id LIMIT 1) d ON true   -- by key
    LEFT JOIN LATERAL (SELECT y.status, y.cancel_requested_at FROM awp.runs y WHERE y.run_id = d.run_id LIMIT 1) r ON true
   ORDER BY e.o;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
END $$;
COMMENT ON FUNCTION awp.heartbeat(text, text, jsonb, bigint, bigint[], jsonb) IS 'Records liveness and renews, revokes or disowns each listed lease (renewed/revoked/unknown); with claimed_through also releases the leases the worker never received and renews those suspended by an outage; AWSES/AWREQ.';
