-- awp.register_worker: a new session; the token is returned once and only its SHA-256 is stored.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(24);

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM awp.register_worker('alpha', '{python,mock,mock}', 3) \gset r_

SELECT matches(:'r_session_token'::text, '^[A-Za-z0-9_-]{43}$', 'the session token is 43 characters of base64url (32 bytes)');
SELECT matches(:'r_worker_id'::text, '^wkr_[0-9a-f]{32}$', 'the worker id is a prefixed random id');
SELECT is(:'r_heartbeat_interval_ms'::integer, 5000, 'the heartbeat interval is returned');
SELECT is(:'r_lease_duration_ms'::integer, 15000, 'the lease duration is returned');
SELECT is(:'r_protocol_version'::integer, 1, 'protocol version 1 (the default) is echoed');
SELECT results_eq(format($$SELECT display_name, status, executor_kinds, max_concurrency, registered_at, last_heartbeat_at
                             FROM awp.workers WHERE worker_id = %L$$, :'r_worker_id'),
                  format($$VALUES ('alpha'::text, 'active'::text, '{mock,python}'::text[], 3, %L::timestamptz, %L::timestamptz)$$, :'t0', :'t0'),
                  'the worker is active, kinds deduplicated, registered and heard from now');
SELECT is((SELECT session_token_hash FROM awp.workers WHERE worker_id = :'r_worker_id'),
          sha256(convert_to(:'r_session_token', 'UTF8')), 'only the SHA-256 of the token is stored');
SELECT is((SELECT count(*) FROM awp.workers w, jsonb_each_text(to_jsonb(w)) e
            WHERE w.worker_id = :'r_worker_id' AND strpos(e.value, :'r_session_token') > 0), 0::bigint,
          'no column of the worker row holds the plaintext token');
SELECT is(ARRAY(SELECT attname::text FROM pg_attribute
                 WHERE attrelid = 'awp.workers'::regclass AND attnum > 0 AND NOT attisdropped AND attname LIKE '%token%'),
          ARRAY['session_token_hash'], 'the only token column of awp.workers is the hash');
SELECT col_type_is('awp', 'workers', 'session_token_hash', 'bytea', 'the token hash is bytea');
SELECT is(awp.check_worker_session(:'r_worker_id', :'r_session_token'), 'active', 'the new session is valid');

SELECT * FROM awp.register_worker('alpha', '{mock}', 1) \gset s_
SELECT isnt(:'s_worker_id'::text, :'r_worker_id', 'a second registration is a new session');
SELECT isnt(:'s_session_token'::text, :'r_session_token', '... with a different token');
SELECT throws_ok(format($$SELECT awp.check_worker_session(%L, %L)$$, :'s_worker_id', :'r_session_token'), 'AWSES', NULL,
                 'one session''s token does not open another');

SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock}', 1, 2)$$, 'AWPRO', NULL, 'protocol version 2 is AWPRO');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock}', 1, NULL)$$, 'AWPRO', NULL, 'a null protocol version is AWPRO');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{shell}', 1)$$, 'AWREQ', NULL, 'an unknown executor kind is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{}', 1)$$, 'AWREQ', NULL, 'no executor kind is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock,NULL}', 1)$$, 'AWREQ', NULL, 'a null executor kind is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock}', 0)$$, 'AWREQ', NULL, 'max_concurrency 0 is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock}', 1001)$$, 'AWREQ', NULL, 'max_concurrency 1001 is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('w', '{mock}', NULL)$$, 'AWREQ', NULL, 'a null max_concurrency is AWREQ');
SELECT throws_ok($$SELECT * FROM awp.register_worker('', '{mock}', 1)$$, 'AWREQ', NULL, 'an empty display name is AWREQ');
SELECT is((SELECT count(*) FROM awp.workers), 2::bigint, 'rejected registrations stored nothing');

SELECT * FROM finish();
ROLLBACK;
