-- awp.configure(lease_duration_ms, heartbeat_interval_ms, offline_after_heartbeats, dispatch_limit,
-- retention_ms, leader_lease_ms): changes the settings; a null leaves a setting as it is. Returns all
-- settings as jsonb.
-- retention_ms: how long finished runs, ended worker sessions and idempotency records are kept before
-- the active coordinator prunes them (awp.apply_retention; 0 = keep forever; default 7 days).
-- leader_lease_ms: how long the active coordinator may be silent (no pass, no heartbeat; database clock)
-- before a standby ends its session and takes over (awp.take_leadership; 500 to 3,600,000; default 10 s).
-- Raises AWREQ when a value is out of range or the lease does not exceed the heartbeat interval.
-- Locks: the settings row.
CREATE OR REPLACE FUNCTION awp.configure(lease_duration_ms integer DEFAULT NULL,
                                         heartbeat_interval_ms integer DEFAULT NULL,
                                         offline_after_heartbeats integer DEFAULT NULL,
                                         dispatch_limit integer DEFAULT NULL,
                                         retention_ms bigint DEFAULT NULL,
                                         leader_lease_ms integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  s awp.settings;
BEGIN
  SELECT * INTO s FROM awp.settings FOR UPDATE;
  s.lease_duration_ms := coalesce(configure.lease_duration_ms, s.lease_duration_ms);
  s.heartbeat_interval_ms := coalesce(configure.heartbeat_interval_ms, s.heartbeat_interval_ms);
  s.offline_after_heartbeats := coalesce(configure.offline_after_heartbeats, s.offline_after_heartbeats);
  s.dispatch_limit := coalesce(configure.dispatch_limit, s.dispatch_limit);
  s.retention_ms := coalesce(configure.retention_ms, s.retention_ms);
  s.leader_lease_ms := coalesce(configure.leader_lease_ms, s.leader_lease_ms);
  IF s.lease_duration_ms NOT BETWEEN 100 AND 86400000 THEN
    PERFORM awp._bad_request('invalid lease_duration_ms', 'lease_duration_ms must be from 100 to 86400000');
  ELSIF s.heartbeat_interval_ms NOT BETWEEN 10 AND 3600000 THEN
    PERFORM awp._bad_request('invalid heartbeat_interval_ms', 'heartbeat_interval_ms must be from 10 to 3600000');
  ELSIF s.offline_after_heartbeats NOT BETWEEN 1 AND 1000 THEN
    PERFORM awp._bad_request('invalid offline_after_heartbeats', 'offline_after_heartbeats must be from 1 to 1000');
  ELSIF s.dispatch_limit NOT BETWEEN 1 AND 1000000 THEN
    PERFORM awp._bad_request('invalid dispatch_limit', 'dispatch_limit must be from 1 to 1000000');
  ELSIF s.retention_ms NOT BETWEEN 0 AND 3153600000000 THEN
    PERFORM awp._bad_request('invalid retention_ms',
      'retention_ms must be from 0 (keep forever) to 3153600000000 (100 years)');
  ELSIF s.leader_lease_ms NOT BETWEEN 500 AND 3600000 THEN
    PERFORM awp._bad_request('invalid leader_lease_ms', 'leader_lease_ms must be from 500 to 3600000');
  ELSIF s.lease_duration_ms <= s.heartbeat_interval_ms THEN
    PERFORM awp._bad_request('lease must exceed heartbeat interval',
      format('lease_duration_ms (%s) must exceed heartbeat_interval_ms (%s)',
             s.lease_duration_ms, s.heartbeat_interval_ms));
  END IF;
  UPDATE awp.settings x
     SET lease_duration_ms = s.lease_duration_ms, heartbeat_interval_ms = s.heartbeat_interval_ms,
         offline_after_heartbeats = s.offline_after_heartbeats, dispatch_limit = s.dispatch_limit,
         retention_ms = s.retention_ms, leader_lease_ms = s.leader_lease_ms;
  PERFORM awp._wake('awp_coordinator', 'configured');
  RETURN awp.get_settings();
END $$;
COMMENT ON FUNCTION awp.configure(integer, integer, integer, integer, bigint, integer) IS 'Changes settings (named arguments; null keeps a value); returns them as jsonb; AWREQ when invalid.';

-- awp.get_settings(): the settings as jsonb.
CREATE OR REPLACE FUNCTION awp.get_settings() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = '' AS $$
  SELECT jsonb_build_object('lease_duration_ms', s.lease_duration_ms,
                            'heartbeat_interval_ms', s.heartbeat_interval_ms,
                            'offline_after_heartbeats', s.offline_after_heartbeats,
                            'dispatch_limit', s.dispatch_limit,
                            'retention_ms', s.retention_ms,
                            'leader_lease_ms', s.leader_lease_ms)
    FROM awp.settings s
$$;
COMMENT ON FUNCTION awp.get_settings() IS 'The current settings as jsonb.';
