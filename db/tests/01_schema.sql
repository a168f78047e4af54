-- The schema: tables, named CHECK constraints, the indexes that make broken states impossible,
-- and the shape of every function (comment, search_path, SECURITY DEFINER, the signatures of README.md's SQL API).
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(110);

-- ---------------------------------------------------------------- tables
SELECT has_table('awp', t, 'table awp.' || t || ' exists')
  FROM unnest(ARRAY['settings', 'workflows', 'workflow_versions', 'runs', 'tasks',
                    'events', 'workers', 'dispatches']) t;
-- An attempt is stored on its dispatch (0010_fold_attempts); awp.attempts reads them as the old table did.
SELECT has_view('awp', 'attempts', 'awp.attempts is a view of the leased dispatches');
SELECT is(ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = 'awp.attempts'::regclass AND attnum > 0
                 ORDER BY attnum),
          '{run_id,task_key,attempt,dispatch_id,worker_id,fencing_token,status,started_at,deadline,finished_at,output,error_code,error_message,counted,error_detail}',
          'awp.attempts has the attempt columns, in the old table''s order (error_detail appended: migration 0018)');
SELECT has_sequence('awp', 'fencing_token_seq', 'the fencing token sequence exists');

-- ---------------------------------------------------------------- named checks
-- Six tables every task writes keep their rules in one function each (migration 0025_table_rules);
-- awp.check_rules lists them with the other tables' CHECK constraints.
SELECT ok(EXISTS (SELECT 1 FROM awp.check_rules r WHERE r.table_name = ('awp.' || x.tbl)::regclass AND r.rule = x.name),
          format('CHECK %s exists on awp.%s', x.name, x.tbl))
  FROM (VALUES ('runs', 'run_status_is_valid'), ('runs', 'run_finished_iff_terminal'),
               ('runs', 'run_started_unless_pending'), ('runs', 'run_concurrency_in_range'),
               ('tasks', 'task_status_is_valid'), ('tasks', 'task_finished_iff_terminal'),
               ('tasks', 'task_waiting_retry_has_ready_at'), ('tasks', 'task_ready_has_no_pending_deps'),
               ('tasks', 'task_running_has_attempt'), ('tasks', 'task_attempts_in_range'),
               ('dispatches', 'attempt_status_is_valid'), ('dispatches', 'attempt_finished_iff_settled'),
               ('dispatches', 'attempt_iff_leased'), ('dispatches', 'attempt_columns_only_with_attempt'),
               ('dispatches', 'dispatch_status_is_valid'), ('dispatches', 'dispatch_leased_has_lease'),
               ('dispatches', 'dispatch_pending_has_no_lease'), ('dispatches', 'dispatch_lease_within_deadline'),
               ('dispatches', 'dispatch_completed_has_result'), ('dispatches', 'dispatch_finished_iff_final'),
               ('workers', 'worker_status_is_valid'), ('workers', 'worker_stopped_has_stopped_at'),
               ('workers', 'worker_offline_has_offline_at'), ('workers', 'worker_token_hash_is_sha256'),
               ('events', 'event_entity_type_is_valid'), ('settings', 'lease_exceeds_heartbeat'))
       AS x(tbl, name);

-- The status sets are exactly those of docs/protocol.md, State machines (a check listing an extra or missing state fails).
SELECT is((SELECT definition FROM awp.check_rules WHERE rule = 'run_status_is_valid' AND table_name = 'awp.runs'::regclass),
          $$CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'canceled'::text])))$$,
          'run statuses are the documented set');
SELECT is((SELECT definition FROM awp.check_rules
            WHERE rule = 'dispatch_status_is_valid' AND table_name = 'awp.dispatches'::regclass),
          $$CHECK ((status = ANY (ARRAY['pending'::text, 'leased'::text, 'completed'::text, 'expired'::text, 'canceled'::text])))$$,
          'dispatch statuses are the documented set');

-- ---------------------------------------------------------------- indexes
-- awp.dispatches is partitioned by dispatch id (migration 0023_partitioned_history): the unique indexes without it are
-- on each partition (a run's dispatches are all in its run's partition: CHECK dispatch_in_run_range).
SELECT is(ARRAY(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'awp.dispatches'::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_index x JOIN pg_class n ON n.oid = x.indexrelid
                                    WHERE x.indrelid = c.oid AND x.indisunique AND x.indpred IS NOT NULL
                                      AND n.relname LIKE 'dispatches_one_live_per_task_uq%'
                                      AND pg_get_indexdef(x.indexrelid) LIKE '%(run_id, task_key) WHERE (status = ANY%')),
          '{}'::text[], 'every dispatches partition has its unique partial index: one live dispatch per task');
SELECT is(ARRAY(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'awp.dispatches'::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisunique
                                      AND pg_get_indexdef(x.indexrelid) LIKE '% USING btree (run_id, task_key, attempt)'))
          || ARRAY(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'awp.dispatches'::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisunique
                                      AND pg_get_indexdef(x.indexrelid) LIKE '% USING btree (run_id, task_key) WHERE (attempt_status = ''running''::text)'))
          || ARRAY(SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'awp.dispatches'::regclass
                   AND NOT EXISTS (SELECT 1 FROM pg_index x WHERE x.indrelid = c.oid AND x.indisunique
                                      AND pg_get_indexdef(x.indexrelid) LIKE '% USING btree (fencing_token)%')),
          '{}'::text[], 'every dispatches partition: attempts unique by (run, task, number), one running attempt per task, fencing tokens unique');
SELECT ok((SELECT count(*) FROM pg_inherits WHERE inhparent = 'awp.dispatches'::regclass) >= 3,
          'dispatches has its default and (at least two) time partitions');
SELECT has_index('awp', 'dispatches', 'dispatches_pkey', 'dispatches are unique by id');

-- A live scenario to break: one leased task `a`, one ready task `b`.
SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'), tests.task('b', '{a}'), tests.task('c'))) AS run \gset
SELECT * FROM tests.register_worker('w1') \gset w1_
SELECT * FROM tests.claim_one(:'w1_worker_id', :'w1_token') \gset l_
-- Dispatch ids in the run's time range (CHECK dispatch_in_run_range), so that the unique indexes decide.
CREATE TEMP TABLE tests_ids AS SELECT 'dsp_' || substr(:'run', 5, 13) AS p;

SELECT throws_ok(format($$INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
                         VALUES ((SELECT p FROM tests_ids) || 'dup', %L, %L, 'mock', now())$$, :'run', :'l_task_key'),
                 '23505', NULL, 'a second live dispatch for a task is rejected (pending next to leased)');
SELECT throws_ok(format($$INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at)
                         VALUES ((SELECT p FROM tests_ids) || 'c1', %L, 'c', 'mock', now()), ((SELECT p FROM tests_ids) || 'c2', %L, 'c', 'mock', now())$$, :'run', :'run'),
                 '23505', NULL, 'two pending dispatches for one task are rejected');
SELECT lives_ok(format($$INSERT INTO awp.dispatches (dispatch_id, run_id, task_key, executor_kind, created_at, status, finished_at)
                         VALUES ((SELECT p FROM tests_ids) || 'old', %L, %L, 'mock', now(), 'canceled', now())$$, :'run', :'l_task_key'),
                'a finished dispatch next to the live one is allowed (the index is partial)');
SELECT throws_ok($$UPDATE awp.dispatches SET attempt = 1, attempt_status = 'canceled', attempt_finished_at = now()
                    WHERE dispatch_id = (SELECT p FROM tests_ids) || 'old'$$,
                 '23505', NULL, 'a second attempt with the same number is rejected');
SELECT throws_ok($$UPDATE awp.dispatches SET attempt_status = 'canceled', attempt_finished_at = now()
                    WHERE dispatch_id = (SELECT p FROM tests_ids) || 'old'$$,
                 '23514',
                 'new row for relation "dispatches" violates check constraint "attempt_iff_leased"',
                 'an attempt without a number (a dispatch never leased) is rejected');
SELECT throws_ok(format($$UPDATE awp.dispatches SET fencing_token = %s WHERE dispatch_id = (SELECT p FROM tests_ids) || 'old'$$, :'l_fencing_token'),
                 '23505', NULL, 'a fencing token can never be issued twice');

-- Illegal shapes.
SELECT throws_ok(format($$UPDATE awp.runs SET status = 'paused' WHERE run_id = %L$$, :'run'), '23514',
                 'new row for relation "runs" violates check constraint "run_status_is_valid"',
                 'an unknown run status is rejected');
SELECT throws_ok(format($$UPDATE awp.runs SET status = 'succeeded' WHERE run_id = %L$$, :'run'), '23514',
                 'new row for relation "runs" violates check constraint "run_finished_iff_terminal"',
                 'a terminal run without finished_at is rejected');
SELECT throws_ok(format($$UPDATE awp.tasks SET status = 'waiting_retry' WHERE run_id = %L AND task_key = 'c'$$, :'run'),
                 '23514',
                 'new row for relation "tasks" violates check constraint "task_waiting_retry_has_ready_at"',
                 'waiting_retry without ready_at is rejected');
SELECT throws_ok(format($$UPDATE awp.tasks SET status = 'ready' WHERE run_id = %L AND task_key = 'b'$$, :'run'),
                 '23514',
                 'new row for relation "tasks" violates check constraint "task_ready_has_no_pending_deps"',
                 'a task with unfinished dependencies cannot be ready');
SELECT throws_ok(format($$UPDATE awp.tasks SET status = 'done' WHERE run_id = %L AND task_key = 'c'$$, :'run'),
                 '23514',
                 'new row for relation "tasks" violates check constraint "task_status_is_valid"',
                 'an unknown task status is rejected');
SELECT throws_ok(format($$UPDATE awp.dispatches SET status = 'pending' WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "dispatch_pending_has_no_lease"',
                 'a pending dispatch cannot keep a lease');
SELECT throws_ok(format($$UPDATE awp.dispatches SET lease_token_hash = NULL WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "dispatch_leased_has_lease"',
                 'a leased dispatch must have a lease token hash');
SELECT throws_ok(format($$UPDATE awp.dispatches SET lease_expires_at = attempt_deadline + interval '1 ms' WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "dispatch_lease_within_deadline"',
                 'a lease may not outlive the attempt deadline');
SELECT throws_ok(format($$UPDATE awp.dispatches SET status = 'completed', finished_at = now() WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "dispatch_completed_has_result"',
                 'a completed dispatch must have a result hash');
SELECT throws_ok(format($$UPDATE awp.attempts SET status = 'succeeded' WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "attempt_finished_iff_settled"',
                 'a settled attempt must have finished_at');
SELECT throws_ok(format($$UPDATE awp.attempts SET status = 'lost', finished_at = now() WHERE dispatch_id = %L$$, :'l_dispatch_id'),
                 '23514',
                 'new row for relation "dispatches" violates check constraint "attempt_status_is_valid"',
                 'an unknown attempt status is rejected');
SELECT throws_ok(format($$UPDATE awp.workers SET status = 'stopped' WHERE worker_id = %L$$, :'w1_worker_id'),
                 '23514',
                 'new row for relation "workers" violates check constraint "worker_stopped_has_stopped_at"',
                 'a stopped worker must have stopped_at');
SELECT throws_ok(format($$UPDATE awp.workers SET status = 'sleeping' WHERE worker_id = %L$$, :'w1_worker_id'),
                 '23514',
                 'new row for relation "workers" violates check constraint "worker_status_is_valid"',
                 'an unknown worker status is rejected');
SELECT throws_ok($$UPDATE awp.settings SET lease_duration_ms = heartbeat_interval_ms$$, '23514', NULL,
                 'the settings row keeps the lease above the heartbeat interval');
SELECT throws_ok($$INSERT INTO awp.settings (singleton) VALUES (false)$$, '23514', NULL,
                 'settings is a singleton');

-- ---------------------------------------------------------------- function shape
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND obj_description(p.oid, 'pg_proc') IS NULL
                 ORDER BY 1),
          '{}'::text[], 'every awp function has a COMMENT');
-- search_path (docs/architecture.md, "Functions and search_path"): the functions anyone but their owner may execute
-- are SECURITY DEFINER (the next test), and every function in schema awp, public or private, of any language,
-- pins search_path = pg_catalog, pg_temp: pg_temp named last, so no type or table a caller creates in its
-- temporary schema is found before pg_catalog's (db/migrations/0012_caller_environment.sql).
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND NOT p.prosecdef
                   AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                                WHERE a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE')
                 ORDER BY 1),
          '{}'::text[], 'only SECURITY DEFINER functions may be executed by anyone but their owner');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace
                   AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)
                   AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
                 ORDER BY 1),
          '{}'::text[], 'every awp function pins SET search_path = pg_catalog, pg_temp');
-- The caller's state settings (db/functions/zz_grants.sql): every SECURITY DEFINER function starts with
-- awp.log_state and awp.new_dispatches empty (PostgreSQL restores the caller's value on exit).
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND p.prosecdef
                   AND NOT (coalesce('awp.log_state=' = ANY (p.proconfig), false)
                            AND coalesce('awp.new_dispatches=' = ANY (p.proconfig), false))
                 ORDER BY 1),
          '{}'::text[], 'every SECURITY DEFINER function sets awp.log_state and awp.new_dispatches empty on entry');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND left(p.proname, 1) <> '_' AND NOT p.prosecdef
                 ORDER BY 1),
          '{}'::text[], 'every public awp function is SECURITY DEFINER');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND p.proowner <> 'awp_owner'::regrole
                 ORDER BY 1),
          '{}'::text[], 'every awp function belongs to awp_owner');
SELECT is(ARRAY(SELECT c.relname::text FROM pg_class c
                 WHERE c.relnamespace = 'awp'::regnamespace AND c.relkind IN ('r', 'S', 'v', 'c')
                   AND c.relowner <> 'awp_owner'::regrole ORDER BY 1),
          '{}'::text[], 'every awp table, sequence, view and composite type belongs to awp_owner');
SELECT cmp_ok((SELECT count(*) FROM pg_proc WHERE pronamespace = 'awp'::regnamespace AND left(proname, 1) <> '_'),
              '>=', 17::bigint, 'the public surface is there (the checks above are not vacuous)');

-- the signatures of README.md's SQL API.
SELECT has_function('awp', f, args, format('awp.%s(%s) exists', f, array_to_string(args, ', ')))
  FROM (VALUES ('create_workflow_version', ARRAY['jsonb']),
               ('start_run', ARRAY['text', 'integer', 'text', 'jsonb']),
               ('request_cancel', ARRAY['text']),
               ('register_worker', ARRAY['text', 'text[]', 'integer', 'integer', 'jsonb']),
               ('claim_tasks', ARRAY['text', 'text', 'integer', 'bigint']),
               ('heartbeat', ARRAY['text', 'text', 'jsonb', 'bigint', 'bigint[]', 'jsonb']),
               ('complete_task', ARRAY['text', 'text', 'text', 'text', 'jsonb', 'jsonb']),
               ('drain_worker', ARRAY['text', 'text']),
               ('get_run', ARRAY['text']),
               ('run_tasks', ARRAY['text', 'text', 'integer']),
               ('task_attempts', ARRAY['text', 'text']),
               ('run_events', ARRAY['text', 'bigint', 'integer']),
               ('list_runs', ARRAY['text', 'text', 'text', 'integer', 'timestamptz']),
               ('list_workers', ARRAY['timestamptz', 'text', 'integer']),
               ('get_worker', ARRAY['text']),
               ('coordinator_tick', ARRAY['boolean', 'bigint']),
               ('configure', ARRAY['integer', 'integer', 'integer', 'integer', 'bigint', 'integer', 'integer', 'integer', 'bigint']),
               ('prune', ARRAY['interval'])) AS x(f, args);

SELECT function_returns('awp', 'coordinator_tick', ARRAY['boolean', 'bigint'], 'jsonb', 'coordinator_tick returns jsonb');
SELECT function_returns('awp', 'configure', ARRAY['integer', 'integer', 'integer', 'integer', 'bigint', 'integer', 'integer', 'integer', 'bigint'], 'jsonb', 'configure returns jsonb');
SELECT function_returns('awp', 'prune', ARRAY['interval'], 'jsonb', 'prune returns jsonb');
SELECT function_returns('awp', 'start_run', ARRAY['text', 'integer', 'text', 'jsonb'], 'text', 'start_run returns the run id');
SELECT function_returns('awp', 'complete_task', ARRAY['text', 'text', 'text', 'text', 'jsonb', 'jsonb'], 'boolean', 'complete_task returns applied');

-- Result columns, in documented order (more trailing columns are allowed where README.md's SQL API says so).
-- The OUT/TABLE columns, or for a function returning (SETOF) a composite type such as awp.lease its attributes.
CREATE FUNCTION tests.out_columns(p regprocedure) RETURNS text[] LANGUAGE sql AS $$
  SELECT coalesce(
    (SELECT array_agg(n ORDER BY i) FROM pg_proc p2,
            unnest(p2.proargnames, p2.proargmodes) WITH ORDINALITY AS a(n, m, i)
      WHERE p2.oid = p AND a.m IN ('o', 't')),
    (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_proc p2
       JOIN pg_type t ON t.oid = p2.prorettype JOIN pg_attribute a ON a.attrelid = t.typrelid
      WHERE p2.oid = p AND t.typtype = 'c' AND a.attnum > 0 AND NOT a.attisdropped))
$$;
SELECT is(tests.out_columns('awp.create_workflow_version(jsonb)'), ARRAY['workflow_id', 'version'],
          'create_workflow_version returns (workflow_id, version)');
SELECT is(tests.out_columns('awp.request_cancel(text)'), ARRAY['run_id', 'status', 'cancel_requested_at'],
          'request_cancel returns (run_id, status, cancel_requested_at)');
SELECT is(tests.out_columns('awp.register_worker(text, text[], integer, integer, jsonb)'),
          ARRAY['worker_id', 'session_token', 'heartbeat_interval_ms', 'lease_duration_ms', 'protocol_version'],
          'register_worker returns the documented columns');
SELECT is(tests.out_columns('awp.claim_tasks(text, text, integer, bigint)'),
          ARRAY['dispatch_id', 'lease_token', 'workflow_id', 'workflow_version', 'run_id', 'task_key', 'executor_kind',
                'action', 'input', 'attempt', 'attempt_deadline', 'lease_expires_at', 'lease_remaining_ms', 'fencing_token',
                'run_input', 'upstream', 'item', 'item_index'],
          'claim_tasks returns the lease columns, run_input, upstream, item and item_index included');
SELECT is(ARRAY(SELECT p.oid::regprocedure::text FROM pg_proc p
                 WHERE p.pronamespace = 'awp'::regnamespace AND p.prorettype = 'awp.lease'::regtype AND p.proretset
                 ORDER BY 1),
          ARRAY['awp._claim(awp.workers,integer,boolean,bigint)',
                'awp._complete_and_claim(awp.workers,text,text,jsonb,integer,bigint)',
                'awp._lease_refill(awp.workers,bigint,timestamp with time zone,text,text,text[],text[],text[],text[],text[],text,bytea,jsonb,text)',
                'awp.claim_tasks(text,text,integer,bigint)',
                'awp.complete_and_claim(text,text,text,text,jsonb,integer,bigint,jsonb)'],
          'the lease columns are defined once (awp.lease): claim_tasks, complete_and_claim, _claim, _lease_refill return it');
SELECT is(tests.out_columns('awp.heartbeat(text, text, jsonb, bigint, bigint[], jsonb)'), ARRAY['dispatch_id', 'status', 'lease_remaining_ms'],
          'heartbeat returns (dispatch_id, status, lease_remaining_ms)');
SELECT is((tests.out_columns('awp.get_run(text)'))[1:9],
          ARRAY['run_id', 'workflow_id', 'workflow_version', 'status', 'revision', 'cancel_requested_at',
                'created_at', 'started_at', 'finished_at'], 'get_run starts with the documented columns');
SELECT is((tests.out_columns('awp.run_tasks(text, text, integer)'))[1:4], ARRAY['task_key', 'status', 'attempts', 'ready_at'],
          'run_tasks starts with the documented columns');
SELECT is((tests.out_columns('awp.task_attempts(text, text)'))[1:9],
          ARRAY['attempt', 'status', 'worker_id', 'dispatch_id', 'started_at', 'finished_at', 'output',
                'error_code', 'error_message'], 'task_attempts starts with the documented columns');
SELECT is(tests.out_columns('awp.run_events(text, bigint, integer)'),
          ARRAY['sequence', 'revision', 'entity_type', 'entity_key', 'from_status', 'to_status', 'reason', 'occurred_at'],
          'run_events returns the documented columns');
SELECT is((tests.out_columns('awp.list_workers(timestamptz, text, integer)'))[1:7],
          ARRAY['worker_id', 'display_name', 'status', 'executor_kinds', 'max_concurrency', 'active_leases',
                'last_heartbeat_at'], 'list_workers starts with the documented columns');
SELECT is(tests.out_columns('awp.drain_worker(text, text)'), tests.out_columns('awp.get_worker(text)'),
          'drain_worker returns the worker summary row');
SELECT is((SELECT array_agg(n ORDER BY i) FROM pg_proc p, unnest(p.proargnames) WITH ORDINALITY a(n, i)
            WHERE p.oid = 'awp.configure(integer, integer, integer, integer, bigint, integer, integer, integer, bigint)'::regprocedure),
          ARRAY['lease_duration_ms', 'heartbeat_interval_ms', 'offline_after_heartbeats', 'dispatch_limit', 'retention_ms',
                'leader_lease_ms', 'progress_log_bytes', 'progress_chunk_bytes', 'history_partition_ms'],
          'configure has the fixed argument names');
SELECT is((SELECT pronargdefaults FROM pg_proc WHERE oid = 'awp.start_run(text, integer, text, jsonb)'::regprocedure),
          3::smallint, 'start_run: version, idempotency_key and input are optional');
SELECT is((SELECT pronargdefaults FROM pg_proc WHERE oid = 'awp.register_worker(text, text[], integer, integer, jsonb)'::regprocedure),
          2::smallint, 'register_worker: protocol_version and actions are optional');

SELECT * FROM finish();
ROLLBACK;
