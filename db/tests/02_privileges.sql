-- Least privilege: awp_gateway may only EXECUTE the public awp functions; it cannot touch a table
-- or a sequence, nor run a private `_` helper; PUBLIC can do nothing in schema awp.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(29 + 4 * (SELECT count(*)::integer FROM pg_class
                        WHERE relnamespace = 'awp'::regnamespace AND relkind IN ('r', 'p')));
SELECT cmp_ok((SELECT count(*)::integer FROM pg_class WHERE relnamespace = 'awp'::regnamespace AND relkind IN ('r', 'p')),
              '>=', 9, 'the nine tables of docs/protocol.md, Objects (at least) are covered below');

SELECT has_role('awp_gateway', 'role awp_gateway exists');
SELECT is((SELECT rolcanlogin FROM pg_roles WHERE rolname = 'awp_gateway'), false, 'awp_gateway is NOLOGIN');
SELECT is((SELECT rolsuper OR rolbypassrls OR rolcreaterole OR rolcreatedb FROM pg_roles WHERE rolname = 'awp_gateway'),
          false, 'awp_gateway has no special attributes');
SELECT is((SELECT rolcanlogin FROM pg_roles WHERE rolname = 'awp_owner'), false, 'awp_owner is NOLOGIN');

-- Catalog view: no table/sequence privilege at all; EXECUTE on exactly the public functions.
SELECT is(ARRAY(SELECT c.relname::text || ':' || p.priv
                  FROM pg_class c,
                       unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p(priv)
                 WHERE c.relnamespace = 'awp'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
                   AND has_table_privilege('awp_gateway', c.oid, p.priv) ORDER BY 1),
          '{}'::text[], 'awp_gateway holds no privilege on any awp table');
SELECT is(ARRAY(SELECT c.relname::text FROM pg_class c
                 WHERE c.relnamespace = 'awp'::regnamespace AND c.relkind = 'S'
                   AND (has_sequence_privilege('awp_gateway', c.oid, 'USAGE')
                        OR has_sequence_privilege('awp_gateway', c.oid, 'SELECT')
                        OR has_sequence_privilege('awp_gateway', c.oid, 'UPDATE')) ORDER BY 1),
          '{}'::text[], 'awp_gateway holds no privilege on any awp sequence');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND left(p.proname, 1) = '_'
                   AND has_function_privilege('awp_gateway', p.oid, 'EXECUTE') ORDER BY 1),
          '{}'::text[], 'awp_gateway cannot execute any private _ function');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND left(p.proname, 1) <> '_'
                   AND NOT has_function_privilege('awp_gateway', p.oid, 'EXECUTE') ORDER BY 1),
          '{}'::text[], 'awp_gateway can execute every public function');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                 WHERE p.pronamespace = 'awp'::regnamespace AND a.grantee = 0 ORDER BY 1),
          '{}'::text[], 'PUBLIC cannot execute any awp function (no default EXECUTE grant left)');
SELECT is(ARRAY(SELECT a.privilege_type FROM pg_namespace n, aclexplode(n.nspacl) a
                 WHERE n.nspname = 'awp' AND a.grantee = 0),
          '{}'::text[], 'PUBLIC has no privilege on schema awp');
SELECT ok(has_schema_privilege('awp_gateway', 'awp', 'USAGE'), 'awp_gateway may use schema awp');
SELECT ok(NOT has_schema_privilege('awp_gateway', 'awp', 'CREATE'), 'awp_gateway cannot create objects in awp');
SELECT ok(NOT has_database_privilege('public', current_database(), 'CONNECT'),
          'PUBLIC cannot connect to AWP''s database (migration 0007)');
SELECT ok(has_database_privilege('awp_gateway', current_database(), 'CONNECT'), 'members of awp_gateway may connect');

-- Acting as the gateway: data for it to (fail to) touch first.
SELECT tests.make_run('wf') AS run \gset
SELECT * FROM tests.register_worker('w1') \gset w1_
SET LOCAL ROLE awp_gateway;

-- Every table in schema awp (also those added by later migrations), with each of its first column.
SELECT throws_ok(format('%s awp.%I %s', x.verb, t.relname, replace(x.tail, '$col', quote_ident(t.col))), '42501', NULL,
                 format('awp_gateway cannot %s awp.%s', lower(split_part(x.verb, ' ', 1)), t.relname))
  FROM (SELECT c.relname, (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum = 1) AS col
          FROM pg_class c WHERE c.relnamespace = 'awp'::regnamespace AND c.relkind IN ('r', 'p')) t,
       (VALUES ('SELECT * FROM', ''), ('UPDATE', 'SET $col = $col'),
               ('INSERT INTO', 'DEFAULT VALUES'), ('DELETE FROM', '')) x(verb, tail)
 ORDER BY t.relname, x.verb;
SELECT throws_ok($$SELECT nextval('awp.fencing_token_seq')$$, '42501', NULL, 'awp_gateway cannot draw fencing tokens');
SELECT throws_ok($$SELECT * FROM awp._claim_candidates$$, '42501', NULL, 'awp_gateway cannot read the claim candidates view');
SELECT throws_ok($$SELECT awp._now()$$, '42501', NULL, 'awp_gateway cannot call awp._now()');
SELECT throws_ok(format($$SELECT awp._converge_cancel(%L)$$, :'run'), '42501', NULL,
                 'awp_gateway cannot call a private settling helper');
SELECT throws_ok(format($$SELECT awp._append_event(%L, 'run', 'x', NULL, 'failed', 'forged')$$, :'run'), '42501', NULL,
                 'awp_gateway cannot forge events');

-- The public functions work through SECURITY DEFINER, end to end.
SELECT is((SELECT version FROM awp.create_workflow_version(tests.def(jsonb_build_array(tests.task('x')), '{"id": "gw"}'))),
          1, 'awp_gateway creates a workflow version');
SELECT isnt(awp.start_run('gw'), NULL, 'awp_gateway starts a run');
SELECT ok(awp.coordinator_tick() ?& ARRAY['canceled', 'reaped', 'offline', 'promoted', 'dispatched'],
          'awp_gateway runs a coordinator pass');
SELECT is((SELECT count(*) FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 2)), 2::bigint,
          'awp_gateway claims through awp.claim_tasks');
SELECT is((SELECT status FROM awp.get_run(:'run')), 'running', 'awp_gateway reads a run');
SELECT is((SELECT count(*) FROM awp.list_workers()), 1::bigint, 'awp_gateway lists workers');
SELECT is((awp.configure(dispatch_limit => 50))->>'dispatch_limit', '50', 'awp_gateway configures');
SELECT is((SELECT status FROM awp.request_cancel(:'run')), 'running', 'awp_gateway requests a cancel');
RESET ROLE;
SELECT is(current_user::text, session_user::text, 'RESET ROLE restores the test user');

SELECT * FROM finish();
ROLLBACK;
