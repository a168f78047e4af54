-- awp.configure(lease_duration_ms, heartbeat_interval_ms, offline_after_heartbeats, dispatch_limit,
-- retention_ms, leader_lease_ms, progress_log_bytes, progress_chunk_bytes, history_partition_ms): changes the settings; a null leaves a setting as it is. Returns all
-- settings as jsonb.
-- retention_ms: how long finished runs, ended worker sessions and idempotency records are kept before
-- the active coordinator prunes them (awp.apply_retention; 0 = keep forever; default 7 days).
-- leader_lease_ms: how long the active coordinator may be silent (no pass, no heartbeat; database clock)
-- before a standby ends its session and takes over (awp.take_leadership; 500 to 3,600,000; default 10 s).
-- progress_log_bytes, progress_chunk_bytes: the bytes of log lines and of output chunks one attempt keeps (default
-- 1 MiB each); past that the oldest are dropped first (docs/progress.md). They apply to later writes.
-- history_partition_ms: the time range of each partition of the run-scoped tables (1 s to 30 days; 0, the default:
-- half the retention; docs/retention.md, Partitions); it applies to the ranges awp.maintain_partitions makes from
-- then on.
-- Raises AWREQ when a value is out of its range (awp._setting_ranges(), db/functions/00_limits.sql) or the
-- lease does not exceed the heartbeat interval. A call that sets heartbeat_interval_ms or offline_after_heartbeats
-- so that a worker goes offline after less than 2 s without a heartbeat is applied with a WARNING: a worker waits
-- up to max(1 s, 2 heartbeats) for a heartbeat's answer before it sends the next (python/awp/worker/heartbeats.py),
-- so one slow answer can mark it offline (docs/operations.md); the test suites use such windows on purpose.
-- Locks: the settings row.
CREATE OR REPLACE FUNCTION awp.configure(lease_duration_ms integer DEFAULT NULL,
                                         heartbeat_interval_ms integer DEFAULT NULL,
                                         offline_after_heartbeats integer DEFAULT NULL,
                                         dispatch_limit integer DEFAULT NULL,
                                         retention_ms bigint DEFAULT NULL,
                                         leader_lease_ms integer DEFAULT NULL,
                                         progress_log_bytes integer DEFAULT NULL,
                                         progress_chunk_bytes integer DEFAULT NULL,
                                         history_partition_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s awp.settings;
  v record;
  v_window bigint;   -- how long a worker may be silent before it is marked offline (ms)
BEGIN
  SELECT * INTO s FROM awp.settings FOR UPDATE;
  s.lease_duration_ms := coalesce(configure.lease_duration_ms, s.lease_duration_ms);
  s.heartbeat_interval_ms := coalesce(configure.heartbeat_interval_ms, s.heartbeat_interval_ms);
  s.offline_after_heartbeats := coalesce(configure.offline_after_heartbeats, s.offline_after_heartbeats);
  s.dispatch_limit := coalesce(configure.dispatch_limit, s.dispatch_limit);
  s.retention_ms := coalesce(configure.retention_ms, s.retention_ms);
  s.leader_lease_ms := coalesce(configure.leader_lease_ms, s.leader_lease_ms);
  s.progress_log_bytes := coalesce(configure.progress_log_bytes, s.progress_log_bytes);
  s.progress_chunk_bytes := coalesce(configure.progress_chunk_bytes, s.progress_chunk_bytes);
  s.history_partition_ms := coalesce(configure.history_partition_ms, s.history_partition_ms);
  -- Each setting within its range (awp._setting_ranges(), the same ranges as the CHECKs of awp.settings).
  FOR v IN SELECT r.setting, r.lo, r.hi, r.note, (to_jsonb(s)->>r.setting)::bigint AS value
             FROM awp._setting_ranges() r
  LOOP
    IF v.value NOT BETWEEN v.lo AND v.hi THEN
      PERFORM awp._raise_invalid_request('invalid ' || v.setting,
        format('%s must be from %s to %s%s', v.setting, v.lo, v.hi, v.note));
    END IF;
  END LOOP;
  IF s.history_partition_ms > 0 AND s.history_partition_ms < 1000 THEN   -- 0 (half the retention), or at least 1 s
    SELECT r.setting, r.lo, r.hi, r.note, s.history_partition_ms AS value INTO v
      FROM awp._setting_ranges() r WHERE r.setting = 'history_partition_ms';
    PERFORM awp._raise_invalid_request('invalid history_partition_ms',
      format('history_partition_ms must be 0 or from 1000 to %s%s', v.hi, v.note));
  END IF;
  IF s.lease_duration_ms <= s.heartbeat_interval_ms THEN
    PERFORM awp._raise_invalid_request('lease must exceed heartbeat interval',
      format('lease_duration_ms (%s) must exceed heartbeat_interval_ms (%s)',
             s.lease_duration_ms, s.heartbeat_interval_ms));
  END IF;
  v_window := s.heartbeat_interval_ms::bigint * s.offline_after_heartbeats;
  IF (configure.heartbeat_interval_ms IS NOT NULL OR configure.offline_after_heartbeats IS NOT NULL)
     AND v_window < 2000 THEN
    RAISE WARNING 'workers go offline after % ms without a heartbeat, under 2 s', v_window
      USING DETAIL = 'a worker waits up to max(1 s, 2 heartbeats) for a heartbeat''s answer before it sends the next, '
                     'so one slow answer can mark it offline',
            HINT = 'raise heartbeat_interval_ms or offline_after_heartbeats (docs/operations.md)';
  END IF;
  UPDATE awp.settings x
     SET lease_duration_ms = s.lease_duration_ms, heartbeat_interval_ms = s.heartbeat_interval_ms,
         offline_after_heartbeats = s.offline_after_heartbeats, dispatch_limit = s.dispatch_limit,
         retention_ms = s.retention_ms, leader_lease_ms = s.leader_lease_ms,
         progress_log_bytes = s.progress_log_bytes, progress_chunk_bytes = s.progress_chunk_bytes,
         history_partition_ms = s.history_partition_ms;
  PERFORM awp._wake('awp_coordinator', 'configured');
  RETURN awp.get_settings();
END $$;
COMMENT ON FUNCTION awp.configure(integer, integer, integer, integer, bigint, integer, integer, integer, bigint) IS 'Changes settings (named arguments; null keeps a value); returns them as jsonb; AWREQ when invalid.';

-- awp.get_settings(): the settings as jsonb.
CREATE OR REPLACE FUNCTION awp.get_settings() RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object('lease_duration_ms', s.lease_duration_ms,
                            'heartbeat_interval_ms', s.heartbeat_interval_ms,
                            'offline_after_heartbeats', s.offline_after_heartbeats,
                            'dispatch_limit', s.dispatch_limit,
                            'retention_ms', s.retention_ms,
                            'leader_lease_ms', s.leader_lease_ms,
                            'progress_log_bytes', s.progress_log_bytes,
                            'progress_chunk_bytes', s.progress_chunk_bytes,
                            'history_partition_ms', s.history_partition_ms)
    FROM awp.settings s
$$;
COMMENT ON FUNCTION awp.get_settings() IS 'The current settings as jsonb.';
