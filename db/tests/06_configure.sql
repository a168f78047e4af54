-- awp.configure: defaults, named arguments, null keeps a value, validation (AWREQ).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(30);

SELECT is(awp.configure(), '{"lease_duration_ms": 15000, "heartbeat_interval_ms": 5000, "offline_after_heartbeats": 3, "dispatch_limit": 10000, "retention_ms": 604800000, "leader_lease_ms": 10000, "progress_log_bytes": 1048576, "progress_chunk_bytes": 1048576, "history_partition_ms": 0}'::jsonb,
          'the defaults are 15000 / 5000 / 3 / 10000 (dispatch_limit: docs/limits.md) / 7 days / leader lease 10 s');
SELECT is(awp.get_settings(), awp.configure(), 'get_settings returns the same');
SELECT is(awp.configure(dispatch_limit => 7),
          '{"lease_duration_ms": 15000, "heartbeat_interval_ms": 5000, "offline_after_heartbeats": 3, "dispatch_limit": 7, "retention_ms": 604800000, "leader_lease_ms": 10000, "progress_log_bytes": 1048576, "progress_chunk_bytes": 1048576, "history_partition_ms": 0}'::jsonb,
          'a named argument changes only that setting');
SELECT is(awp.configure(heartbeat_interval_ms => NULL, lease_duration_ms => 20000)->>'lease_duration_ms', '20000',
          'named arguments in any order; null keeps');
SELECT is(awp.configure(offline_after_heartbeats => 5)->>'dispatch_limit', '7', 'earlier changes persist');
SELECT is((SELECT row(lease_duration_ms, heartbeat_interval_ms, offline_after_heartbeats, dispatch_limit)::text FROM awp.settings),
          '(20000,5000,5,7)', 'the settings row holds the values');
SELECT is(awp.configure(30000, 10000, 3, 100)->>'heartbeat_interval_ms', '10000', 'positional arguments work too');

SELECT throws_ok($$SELECT awp.configure(lease_duration_ms => 10000)$$, 'AWREQ', NULL, 'a lease equal to the heartbeat interval is AWREQ');
SELECT throws_ok($$SELECT awp.configure(heartbeat_interval_ms => 40000)$$, 'AWREQ', NULL, 'a heartbeat interval above the lease is AWREQ');
SELECT lives_ok($$SELECT awp.configure(lease_duration_ms => 60000, heartbeat_interval_ms => 40000)$$,
                'both changed together are checked against each other');
SELECT throws_ok($$SELECT awp.configure(lease_duration_ms => 99)$$, 'AWREQ', NULL, 'lease_duration_ms 99 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(lease_duration_ms => 86400001)$$, 'AWREQ', NULL, 'lease_duration_ms above a day is AWREQ');
SELECT throws_ok($$SELECT awp.configure(heartbeat_interval_ms => 9)$$, 'AWREQ', NULL, 'heartbeat_interval_ms 9 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(offline_after_heartbeats => 0)$$, 'AWREQ', NULL, 'offline_after_heartbeats 0 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(offline_after_heartbeats => 1001)$$, 'AWREQ', NULL, 'offline_after_heartbeats 1001 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(dispatch_limit => 0)$$, 'AWREQ', NULL, 'dispatch_limit 0 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(dispatch_limit => -5)$$, 'AWREQ', NULL, 'a negative dispatch_limit is AWREQ');
SELECT throws_ok($$SELECT awp.configure(retention_ms => -1)$$, 'AWREQ', NULL, 'a negative retention_ms is AWREQ');
SELECT throws_ok($$SELECT awp.configure(retention_ms => 3153600000001)$$, 'AWREQ', NULL, 'retention_ms above 100 years is AWREQ');
SELECT throws_ok($$SELECT awp.configure(leader_lease_ms => 499)$$, 'AWREQ', 'invalid leader_lease_ms', 'leader_lease_ms 499 is AWREQ');
SELECT throws_ok($$SELECT awp.configure(leader_lease_ms => 3600001)$$, 'AWREQ', 'invalid leader_lease_ms', 'leader_lease_ms above an hour is AWREQ');
SELECT is(awp.get_settings(), '{"lease_duration_ms": 60000, "heartbeat_interval_ms": 40000, "offline_after_heartbeats": 3, "dispatch_limit": 100, "retention_ms": 604800000, "leader_lease_ms": 10000, "progress_log_bytes": 1048576, "progress_chunk_bytes": 1048576, "history_partition_ms": 0}'::jsonb,
          'rejected calls changed nothing');
SELECT is(awp.configure(retention_ms => 0)->>'retention_ms', '0', 'retention_ms 0 (keep forever) is allowed');
SELECT is(awp.configure(retention_ms => 30 * 86400000::bigint)->>'retention_ms', '2592000000', 'retention_ms beyond 32 bits (30 days)');
SELECT is((SELECT retention_ms FROM awp.settings), 2592000000::bigint, 'the settings row holds retention_ms');
SELECT throws_ok($$UPDATE awp.settings SET retention_ms = -1$$, '23514', NULL, 'the CHECK retention_ms_in_range guards the row');
SELECT is(awp.configure(leader_lease_ms => 500)->>'leader_lease_ms', '500', 'leader_lease_ms 500 is the shortest allowed');
SELECT is((SELECT leader_lease_ms FROM awp.settings), 500, 'the settings row holds leader_lease_ms');
SELECT throws_ok($$UPDATE awp.settings SET leader_lease_ms = 0$$, '23514', NULL, 'the CHECK leader_lease_in_range guards the row');
SELECT is((SELECT lease_duration_ms || '/' || heartbeat_interval_ms FROM awp.register_worker('w', '{mock}', 1)), '60000/40000',
          'register_worker tells workers the configured durations');

SELECT * FROM finish();
ROLLBACK;
