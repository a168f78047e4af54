-- The CHECK rules of six tables every task writes are kept in one PL/pgSQL function per table (migration
-- 0025_table_rules; docs/architecture.md, Table rules): one constraint per table, the rules and their names
-- unchanged, a broken rule reported as before (23514 naming the rule), and awp.check_rules listing them all, the
-- plain constraints of the other tables (awp.events among them) too.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(27);

CREATE TEMP TABLE rule_tables (tbl text PRIMARY KEY, rules integer);
INSERT INTO rule_tables VALUES ('runs', 12), ('tasks', 20), ('dispatches', 19), ('task_progress', 3),
                               ('task_output', 2), ('workers', 9);

-- One constraint per table, calling its rules function; each partition has it too (inherited).
SELECT is(ARRAY(SELECT c.conname::text FROM pg_constraint c
                 WHERE c.conrelid = ('awp.' || t.tbl)::regclass AND c.contype = 'c'),
          ARRAY[t.tbl || '_rules'], format('awp.%s has one CHECK constraint, %s_rules', t.tbl, t.tbl))
  FROM rule_tables t ORDER BY t.tbl;
SELECT is((SELECT count(*) FROM pg_inherits i JOIN rule_tables t ON i.inhparent = ('awp.' || t.tbl)::regclass
            WHERE NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conrelid = i.inhrelid AND c.contype = 'c'
                                 AND c.conname = t.tbl || '_rules' AND c.coninhcount = 1)),
          0::bigint, 'every partition of those tables has the table''s rules constraint, inherited');
SELECT ok((SELECT bool_and(p.provolatile = 'i')
             FROM rule_tables t JOIN pg_proc p ON p.oid = ('awp._' || t.tbl || '_rules')::regproc),
          'the rules functions are IMMUTABLE');

-- awp.check_rules reads every rule of the functions: as many as the functions have WHEN NOT branches, each named,
-- the names unique in the schema (a rule the view could not read shows as a row without a name).
SELECT is((SELECT count(*) FROM awp.check_rules r WHERE r.table_name = ('awp.' || t.tbl)::regclass),
          t.rules::bigint, format('awp.check_rules lists the %s rules of awp.%s', t.rules, t.tbl))
  FROM rule_tables t ORDER BY t.tbl;
SELECT is((SELECT sum((length(p.prosrc) - length(replace(p.prosrc, 'WHEN NOT ', ''))) / length('WHEN NOT '))
             FROM rule_tables t JOIN pg_proc p ON p.oid = ('awp._' || t.tbl || '_rules')::regproc),
          (SELECT sum(rules) FROM rule_tables), 'each WHEN NOT of the rules functions is one rule');
SELECT is((SELECT count(*) FROM awp.check_rules WHERE rule IS NULL OR definition !~ '^CHECK \(.+\)$'),
          0::bigint, 'every rule has a name and a definition');
SELECT is((SELECT count(*) FROM (SELECT rule FROM awp.check_rules GROUP BY rule HAVING count(*) > 1) d), 0::bigint,
          'no rule name is used twice');

-- tests.broken(statement): the SQLSTATE, constraint, table and message of the error the statement raises.
CREATE FUNCTION tests.broken(p_sql text) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
  v_state text; v_constraint text; v_table text; v_message text; v_schema text;
BEGIN
  EXECUTE p_sql;
  RETURN NULL;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_constraint = CONSTRAINT_NAME, v_table = TABLE_NAME,
                          v_message = MESSAGE_TEXT, v_schema = SCHEMA_NAME;
  RETURN ARRAY[v_state, v_constraint, v_table, v_message, v_schema];
END $$;

SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'), tests.task('b', '{a}')), 2) AS run \gset
SELECT tests.dispatch_all();
SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 1) \gset l_

SELECT is(tests.broken(format($$UPDATE awp.runs SET priority = 10 WHERE run_id = %L$$, :'run')),
          ARRAY['23514', 'run_priority_in_range', 'runs',
                'new row for relation "runs" violates check constraint "run_priority_in_range"', 'awp'],
          'a broken rule of awp.runs: 23514 naming the rule, the table and the schema');
SELECT is(tests.broken(format($$UPDATE awp.tasks SET pending_deps = -1 WHERE run_id = %L AND task_key = 'b'$$,
                              :'run')),
          ARRAY['23514', 'task_pending_deps_non_negative', 'tasks',
                'new row for relation "tasks" violates check constraint "task_pending_deps_non_negative"', 'awp'],
          'awp.tasks names its rule');
SELECT is((tests.broken(format($$UPDATE awp.dispatches SET claim_seq = 0 WHERE dispatch_id = %L$$,
                               :'l_dispatch_id')))[2:3],
          ARRAY['dispatch_claim_seq_positive', 'dispatches'],
          'awp.dispatches names its rule and the table, not the partition the row is in');
-- awp.events keeps CHECK constraints of its own, listed by awp.check_rules with the rest.
SELECT is((tests.broken(format($$UPDATE awp.events SET entity_type = 'lease' WHERE run_id = %L$$, :'run')))[2],
          'event_entity_type_is_valid', 'awp.events''s own constraint names its rule');
SELECT is(ARRAY(SELECT rule FROM awp.check_rules WHERE table_name = 'awp.events'::regclass ORDER BY rule),
          ARRAY['event_entity_type_is_valid', 'event_sequence_positive'],
          'awp.check_rules lists awp.events''s constraints');
SELECT is((tests.broken(format($$UPDATE awp.workers SET max_concurrency = 0 WHERE worker_id = %L$$,
                               :'w1_worker_id')))[2],
          'worker_max_concurrency_in_range', 'awp.workers names its rule');
-- Of several broken rules, the first by name (the order PostgreSQL checked separate constraints in).
SELECT is((tests.broken(format($$UPDATE awp.runs SET priority = 10, concurrency = 0 WHERE run_id = %L$$,
                               :'run')))[2],
          'run_concurrency_in_range', 'of two broken rules, the first by name is reported');
-- A rule over a NULL holds (a CHECK passes on NULL): a run without an idempotency key.
SELECT is((SELECT idempotency_key FROM awp.runs WHERE run_id = :'run'), NULL, 'setup: the run has no idempotency key');
SELECT is(tests.broken(format($$UPDATE awp.runs SET priority = 9 WHERE run_id = %L$$, :'run')), NULL,
          'a row that keeps every rule is written (NULL keeps a rule, as in a CHECK)');

SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold');
SELECT * FROM finish();
ROLLBACK;
