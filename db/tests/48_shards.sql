-- A database as one shard behind a PL/Proxy router (db/functions/shards.sql, migration 0024; docs/scale-out.md): the
-- shard's number in its run and dispatch ids, set only while it holds no run, and the copy of a worker session the
-- router makes on every shard (awp._worker_record, awp._adopt_worker: awp_router only). (The router itself:
-- python/tests/sql/test_router.py, python/tests/faults/test_shards.py.)
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(24);

-- ================================================================ no shard: ids as before
SELECT tests.freeze('2030-01-01 00:00:00+00');
SELECT is(awp._shard_index(), NULL::integer, 'a database is no shard until it is made one');
SELECT tests.make_workflow('wf', jsonb_build_array(tests.task('a')));
SELECT tests.make_run('wf') AS r_plain \gset
SELECT ok(:'r_plain' ~ '^run_t[0-9a-f]{31}$', 'not a shard: run_t + 12 digits of time + 19 random ones');

-- ================================================================ the shard's number
SELECT throws_ok($$SELECT awp._set_shard_index(3)$$, 'AWREQ', 'the shard number cannot change',
                 'a database that holds runs cannot become a shard (its run ids do not name one)');
DELETE FROM awp.runs;
DELETE FROM awp.tasks;
DELETE FROM awp.dispatches;
DELETE FROM awp.events;
SELECT throws_ok($$SELECT awp._set_shard_index(256)$$, 'AWREQ', 'invalid shard number', 'a shard number is at most 255');
SELECT throws_ok($$SELECT awp._set_shard_index(-1)$$, 'AWREQ', 'invalid shard number', 'and at least 0');
SELECT throws_ok($$SELECT awp._set_shard_index(NULL)$$, 'AWREQ', 'invalid shard number', 'and not null');
SELECT is(awp._set_shard_index(3), 3, 'an empty database becomes shard 3');
SELECT is(awp._shard_index(), 3, 'and says so');
SELECT is(awp._set_shard_index(3), 3, 'setting the same number again is a no-op');
SELECT is(awp._set_shard_index(7), 7, 'another number, while it still holds no run');
SELECT is(awp._set_shard_index(3), 3, 'and back');

SELECT * FROM tests.register_worker('w1') \gset w1_
SELECT tests.make_run('wf') AS r \gset
SELECT ok(:'r' ~ '^run_t[0-9a-f]{12}03[0-9a-f]{17}$', 'a shard''s run id: its time, then its number (03), then 17 random digits');
SELECT is(substr(:'r', 18, 2), '03', 'the router reads the number at characters 18-19');
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
SELECT is(substr(:'l_dispatch_id', 1, 19), 'dsp_' || substr(:'r', 5, 15),
          'a dispatch id repeats its run''s time and shard number');
SELECT ok(:'l_dispatch_id' ~ '^dsp_t[0-9a-f]{31}$', 'and keeps the form of a dispatch id');
SELECT throws_ok($$SELECT awp._set_shard_index(4)$$, 'AWREQ', 'the shard number cannot change',
                 'once a run exists the number is fixed');
SELECT is((SELECT count(*)::integer FROM awp.check_invariants()), 0, 'invariants hold');

-- ================================================================ a worker session copied from another shard
SELECT is((SELECT count(*)::integer FROM awp._worker_record(:'w1_worker_id') w
            WHERE w.session_token_hash = awp._hash(:'w1_token') AND w.status = 'active'), 1,
          'the record the router copies: the token only as its hash');
SELECT ok(awp._adopt_worker('wkr_copied', 'copied', '{mock}', 2, 1, awp._hash('the-token'), NULL),
          'adopting a session from another shard makes it here');
SELECT ok(NOT awp._adopt_worker('wkr_copied', 'copied', '{mock}', 2, 1, awp._hash('other'), NULL),
          'adopting it again changes nothing (a retry)');
SELECT is(awp.check_worker_session('wkr_copied', 'the-token'), 'active',
          'the copied session answers to the same token as on the shard that made it');
SELECT throws_ok($$SELECT awp._adopt_worker('nope', 'x', '{mock}', 2, 1, awp._hash('t'), NULL)$$, 'AWREQ',
                 'invalid worker id', 'a worker id must look like one');

-- ================================================================ privileges
SELECT ok(NOT has_function_privilege('awp_gateway', 'awp._adopt_worker(text, text, text[], integer, integer, bytea, jsonb)', 'EXECUTE')
          AND NOT has_function_privilege('awp_gateway', 'awp._worker_record(text)', 'EXECUTE'),
          'the gateway cannot copy worker sessions');
SELECT ok(has_function_privilege('awp_router', 'awp._adopt_worker(text, text, text[], integer, integer, bytea, jsonb)', 'EXECUTE')
          AND has_function_privilege('awp_router', 'awp.claim_tasks(text, text, integer, bigint)', 'EXECUTE')
          AND NOT has_function_privilege('awp_router', 'awp._set_shard_index(integer)', 'EXECUTE'),
          'the router''s role can, with the gateway''s rights besides, and cannot renumber a shard');

SELECT * FROM finish();
ROLLBACK;
