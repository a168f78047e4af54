-- Live progress, logs and partial output (docs/progress.md): awp.report_progress is fenced like complete (wrong token,
-- another worker, unknown dispatch, expired, past the attempt deadline, revoked by a cancel, another attempt's lease:
-- AWLST and nothing written); sizes (AWBIG, AWREQ); the per-attempt bounds drop the oldest first and mark the attempt
-- truncated; awp.report_progress_many answers per item; awp.task_logs, awp.get_task and awp.run_stream read it back;
-- awp.prune deletes it with the run.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(62);
SELECT tests.no_history_ranges();   -- row by row at the frozen time (_fixtures.sql.inc)

SELECT tests.freeze('2030-01-01 00:00:00+00') AS t0 \gset
SELECT * FROM tests.register_worker('w1', '{mock}', 8) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 8) \gset w2_
SELECT tests.make_run('wf', jsonb_build_array(
         tests.task('a', '{}', '{"timeout_ms": 60000, "retry": {"max_attempts": 3, "interval_ms": 1000}}'),
         tests.task('b', '{}', '{"timeout_ms": 20000}'),
         tests.task('c', '{}', '{"timeout_ms": 60000}'))) AS run \gset
SELECT tests.dispatch_all();
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 3);
SELECT l.dispatch_id AS a_id, l.lease_token AS a_tok FROM l WHERE task_key = 'a' \gset
SELECT l.dispatch_id AS b_id, l.lease_token AS b_tok FROM l WHERE task_key = 'b' \gset
SELECT l.dispatch_id AS c_id, l.lease_token AS c_tok FROM l WHERE task_key = 'c' \gset
CREATE FUNCTION tests.outputs() RETURNS bigint LANGUAGE sql AS $$
  SELECT (SELECT count(*) FROM awp.task_output) + (SELECT count(*) FROM awp.task_progress)
         + (SELECT coalesce(sum(last_seq), 0) FROM awp.run_outputs)
$$;

-- A valid write: lines, then chunks, then the progress value take the run's next sequence numbers.
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'a_id', :'a_tok', '{"pct": 10}', '{one,two}', '{tok1}'),
          jsonb_build_object('seq', 4, 'truncated', false, 'run_id', :'run'), 'a write answers its last sequence number');
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'a_id', :'a_tok', p_logs => '{three}'),
          jsonb_build_object('seq', 5, 'truncated', false, 'run_id', :'run'), 'logs alone');
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', '"half"'),
          jsonb_build_object('seq', 6, 'truncated', false, 'run_id', :'run'), 'another task of the run continues the run''s numbering');
SELECT is((SELECT array_agg(x->>'kind' || ':' || (x->>'text') ORDER BY (x->>'seq')::int)
             FROM jsonb_array_elements(awp.task_logs(:'run', 'a')->'items') x),
          ARRAY['log:one', 'log:two', 'chunk:tok1', 'log:three'], 'task_logs: lines and chunks in order');
SELECT is(awp.task_logs(:'run', 'a', p_after_seq => 2)->'items'->0->>'text', 'tok1', 'task_logs after a sequence number');
SELECT is(awp.task_logs(:'run', 'a') - '{items,progress_at,attempt,run_id,task_key,task_status,progress,next_after,more}'::text[],
          '{"logs": ["one", "two", "three"], "chunks": ["tok1"], "truncated": false, "logs_dropped": 0, "chunks_dropped": 0}'::jsonb,
          'task_logs: the texts of each kind, and no truncation');
SELECT is(awp.task_logs(:'run', 'a', p_limit => 2)->>'next_after', '2', 'next_after: the last sequence number of the page');
SELECT is(awp.task_logs(:'run', 'a', p_limit => 2)->>'more', 'true', 'more: a full page');
SELECT is(awp.task_logs(:'run', 'a')->'progress', '{"pct": 10}'::jsonb, 'task_logs: the latest progress');
SELECT is((SELECT progress FROM awp.get_task(:'run', 'a')), '{"pct": 10}'::jsonb, 'get_task: the latest progress');
SELECT is((SELECT progress FROM awp.get_task(:'run', 'c')), NULL, 'get_task: no progress yet');
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'a_id', :'a_tok', '{"pct": 20}'),
          jsonb_build_object('seq', 7, 'truncated', false, 'run_id', :'run'), 'a newer progress value');
SELECT is((SELECT progress FROM awp.get_task(:'run', 'a')), '{"pct": 20}'::jsonb, 'latest wins');
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'c_id', :'c_tok', 'null'),
          jsonb_build_object('seq', 8, 'truncated', false, 'run_id', :'run'), 'JSON null is a progress value');

-- Fencing: each refusal is AWLST and writes nothing.
SELECT tests.outputs() AS before \gset
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, 'wrong', '1')$$, :'w1_worker_id', :'w1_token', :'a_id'),
                 'AWLST', 'lease lost', 'a wrong lease token is lease_lost');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1')$$, :'w2_worker_id', :'w2_token', :'a_id', :'a_tok'),
                 'AWLST', 'lease lost', 'another worker''s lease is lease_lost');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, 'dsp_nope', 't', '1')$$, :'w1_worker_id', :'w1_token'),
                 'AWLST', 'lease lost', 'an unknown dispatch is lease_lost');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, 'bad', %L, %L, '1')$$, :'w1_worker_id', :'a_id', :'a_tok'),
                 'AWSES', NULL, 'a wrong session is worker_session_invalid');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L)$$, :'w1_worker_id', :'w1_token', :'a_id', :'a_tok'),
                 'AWREQ', 'nothing to report', 'nothing to report is invalid_request');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, p_logs => ARRAY['x', NULL])$$,
                        :'w1_worker_id', :'w1_token', :'a_id', :'a_tok'),
                 'AWREQ', NULL, 'a null line is invalid_request');
SELECT throws_like(format($$SELECT awp.report_progress(%L, %L, %L, %L, jsonb_build_object('k', repeat('x', %s)))$$,
                          :'w1_worker_id', :'w1_token', :'a_id', :'a_tok', awp._limit_progress_bytes()),
                   '%progress too large%', 'a progress value over its limit is refused');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, jsonb_build_object('k', repeat('x', %s)))$$,
                        :'w1_worker_id', :'w1_token', :'a_id', :'a_tok', awp._limit_progress_bytes()),
                 'AWBIG', NULL, '... with payload_too_large (AWBIG)');
SELECT lives_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, jsonb_build_object('k', repeat('x', %s)))$$,
                       :'w1_worker_id', :'w1_token', :'c_id', :'c_tok', awp._limit_progress_bytes() - 11),
                'a progress value of exactly the limit is accepted');
SELECT tests.outputs() AS before \gset
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, p_logs => ARRAY['ok', repeat('y', %s)])$$,
                        :'w1_worker_id', :'w1_token', :'a_id', :'a_tok', awp._limit_progress_entry_bytes() + 1),
                 'AWBIG', 'log line or chunk too large', 'a line over its limit is AWBIG');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, p_chunks => array_fill('z'::text, ARRAY[%s]))$$,
                        :'w1_worker_id', :'w1_token', :'a_id', :'a_tok', awp._limit_progress_entries() + 1),
                 'AWBIG', 'too many entries', 'more entries than one write may carry is AWBIG');
SELECT is(tests.outputs(), :'before'::bigint, 'the refused writes wrote nothing (not even the valid line beside the big one)');

-- Another attempt's lease: a's attempt 1 fails (temporary), attempt 2 is w2's.
SELECT tests.complete(:'w1_worker_id', :'w1_token', :'a_id', :'a_tok', 'temporary_failure');
SELECT tests.advance('2 s');
SELECT * FROM tests.claim_one(:'w2_worker_id', :'w2_token') \gset a2_
SELECT is(:'a2_attempt'::int, 2, 'setup: w2 runs attempt 2 of a');
SELECT tests.outputs() AS before \gset
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1')$$, :'w1_worker_id', :'w1_token', :'a_id', :'a_tok'),
                 'AWLST', 'lease lost', 'the previous attempt''s lease (completed) is lease_lost');
SELECT is(tests.outputs(), :'before'::bigint, '... and writes nothing');
SELECT ok(awp.report_progress(:'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token', '{"pct": 1}', '{second}')
          ? 'seq', 'attempt 2 writes with its own lease');
SELECT is(awp.task_logs(:'run', 'a')->'items'->0->>'text', 'second', 'task_logs shows the latest attempt by default');
SELECT is(awp.task_logs(:'run', 'a', 1)->'items'->0->>'text', 'one', '... and an earlier one by number');
SELECT is((SELECT progress FROM awp.get_task(:'run', 'a')), '{"pct": 1}'::jsonb, 'get_task: the latest attempt''s progress');

-- Bounds: the oldest entries of one kind are dropped first; the attempt is marked truncated.
SELECT is(awp.configure(progress_log_bytes => 1024)->>'progress_log_bytes', '1024', 'progress_log_bytes is configurable');
SELECT throws_ok($$SELECT awp.configure(progress_chunk_bytes => 1023)$$, 'AWREQ', 'invalid progress_chunk_bytes',
                 'progress_chunk_bytes below its range is AWREQ');
SELECT is(awp.report_progress(:'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token',
                              p_logs => ARRAY[repeat('1', 400), repeat('2', 400)], p_chunks => ARRAY[repeat('c', 900)])->>'truncated',
          'false', 'within the bound nothing is dropped');
SELECT is(awp.report_progress(:'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token',
                              p_logs => ARRAY[repeat('3', 400)])->>'truncated', 'true', 'past the bound: truncated');
SELECT is((SELECT array_agg(left(x->>'text', 1) ORDER BY (x->>'seq')::int)
             FROM jsonb_array_elements(awp.task_logs(:'run', 'a')->'items') x),
          ARRAY['2', 'c', '3'], 'the oldest lines went first (second and "1"), chunks have their own bound');
SELECT is(ARRAY[(awp.task_logs(:'run', 'a')->>'logs_dropped')::int, (awp.task_logs(:'run', 'a')->>'chunks_dropped')::int],
          ARRAY[2, 0], 'the dropped entries are counted per kind');
SELECT is(awp.task_logs(:'run', 'a')->>'truncated', 'true', 'task_logs marks the attempt truncated');
SELECT is((SELECT log_bytes FROM awp.task_progress WHERE dispatch_id = :'a2_dispatch_id'), 800::bigint,
          'the bytes kept stay within the bound');

-- A write with its offset is applied once: a repeat (its answer was lost) skips what the attempt already has.
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', p_logs => '{o1,o2}', p_chunks => '{o3}', p_offset => 0)->>'truncated',
          'false', 'a first write with offset 0');
SELECT is(awp.report_progress(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', p_logs => '{o1,o2}', p_chunks => '{o3}', p_offset => 0)->'seq',
          'null'::jsonb, 'its repeat writes nothing');
SELECT ok((awp.report_progress(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', p_chunks => '{o3,o4}', p_offset => 2)->>'seq') IS NOT NULL,
          'an overlapping write keeps only its new entries');
SELECT is((SELECT array_agg(x->>'text' ORDER BY (x->>'seq')::int) FROM jsonb_array_elements(awp.task_logs(:'run', 'b')->'items') x),
          ARRAY['o1', 'o2', 'o3', 'o4'], 'each entry once, in order');
SELECT is((SELECT entries FROM awp.task_progress WHERE dispatch_id = :'b_id'), 4::bigint, 'the attempt counts the entries it received');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1', p_offset => -1)$$, :'w1_worker_id', :'w1_token', :'b_id', :'b_tok'),
                 'AWREQ', 'invalid offset', 'a negative offset is AWREQ');

-- Several leases at once: each item on its own.
SELECT results_eq(format($$SELECT dispatch_id, seq IS NOT NULL, error->>'sqlstate'
                            FROM awp.report_progress_many(%L, %L, jsonb_build_array(
                              jsonb_build_object('dispatch_id', %L, 'lease_token', %L, 'logs', '["many"]'::jsonb),
                              jsonb_build_object('dispatch_id', %L, 'lease_token', 'wrong', 'logs', '["x"]'::jsonb),
                              jsonb_build_object('dispatch_id', %L, 'lease_token', %L, 'progress', '{"k": 1}'::jsonb)))$$,
                         :'w1_worker_id', :'w1_token', :'b_id', :'b_tok', :'c_id', :'c_id', :'c_tok'),
                  format($$VALUES (%L, true, NULL::text), (%L, false, 'AWLST'), (%L, true, NULL)$$, :'b_id', :'c_id', :'c_id'),
                  'report_progress_many answers each item');
SELECT throws_ok(format($$SELECT * FROM awp.report_progress_many(%L, %L, '[{"dispatch_id": "x"}]')$$, :'w1_worker_id', :'w1_token'),
                 'AWREQ', 'invalid items', 'a malformed item list is AWREQ');

-- The event stream's reads.
SELECT is(jsonb_array_length(awp.run_stream(:'run', 0, 0)->'events'), tests.event_count(:'run')::int, 'run_stream: every event');
SELECT is((SELECT array_agg(x->>'kind' ORDER BY (x->>'seq')::int) FROM jsonb_array_elements(awp.run_stream(:'run', 0, 0, 3)->'outputs') x),
          ARRAY['log', 'log', 'chunk'], 'run_stream: outputs in order, at most limit');
SELECT is((SELECT count(*) FROM jsonb_array_elements(awp.run_stream(:'run', 0, 0)->'outputs') x
            WHERE x->>'kind' = 'progress' AND x->>'task_key' = 'a' AND (x->>'attempt')::int = 1), 1::bigint,
          'a progress value appears once, at its latest write');
SELECT throws_ok($$SELECT awp.run_stream('run_nope')$$, 'AWNTF', 'run not found', 'run_stream: an unknown run is AWNTF');
SELECT throws_ok(format($$SELECT awp.task_logs(%L, 'nope')$$, :'run'), 'AWNTF', 'task not found', 'task_logs: an unknown task is AWNTF');

-- Expired, past the deadline, revoked.
SELECT tests.advance('10 s');
SELECT awp.heartbeat(:'w2_worker_id', :'w2_token', jsonb_build_array(jsonb_build_object('dispatch_id', :'a2_dispatch_id', 'lease_token', :'a2_lease_token')));
SELECT awp.heartbeat(:'w1_worker_id', :'w1_token', jsonb_build_array(jsonb_build_object('dispatch_id', :'b_id', 'lease_token', :'b_tok')));
SELECT tests.advance('6 s');
CREATE FUNCTION tests.refusal(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE v_state text; v_detail text;
BEGIN
  EXECUTE p_sql;
  RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_detail = PG_EXCEPTION_DETAIL;
  RETURN v_state || ': ' || v_detail;
END $$;
SELECT is(tests.refusal(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1')$$, :'w1_worker_id', :'w1_token', :'c_id', :'c_tok')),
          'AWLST: the lease has expired', 'an expired lease is lease_lost');
SELECT is(tests.refusal(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1')$$, :'w1_worker_id', :'w1_token', :'b_id', :'b_tok')),
          'accepted', 'a renewed lease is writable');
SELECT ok(awp.report_progress(:'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token', '2') ? 'seq',
          'a heartbeat keeps a lease writable');
SELECT tests.advance('5 s');
SELECT is(tests.refusal(format($$SELECT awp.report_progress(%L, %L, %L, %L, '1')$$, :'w1_worker_id', :'w1_token', :'b_id', :'b_tok')),
          'AWLST: the attempt deadline has passed', 'past its attempt deadline a lease is lease_lost');
SELECT awp.request_cancel(:'run');
SELECT throws_ok(format($$SELECT awp.report_progress(%L, %L, %L, %L, '3')$$, :'w2_worker_id', :'w2_token', :'a2_dispatch_id', :'a2_lease_token'),
                 'AWLST', 'lease lost', 'a lease revoked by a cancel is lease_lost');

-- Pruning deletes a run's outputs with it.
SELECT tests.dispatch_all();
SELECT tests.advance('1 hour');
SELECT tests.dispatch_all();
SELECT is(tests.run_status(:'run'), 'canceled', 'setup: the run ended');
SELECT ok((SELECT count(*) FROM awp.task_output WHERE run_id = :'run') > 0, 'setup: it has outputs');
SELECT awp.prune('1 minute');
SELECT is(ARRAY[(SELECT count(*) FROM awp.task_output WHERE run_id = :'run'),
                (SELECT count(*) FROM awp.task_progress WHERE run_id = :'run'),
                (SELECT count(*) FROM awp.run_outputs WHERE run_id = :'run')], ARRAY[0, 0, 0]::bigint[],
          'prune deletes its log lines, chunks, progress and sequence counter');

SELECT * FROM finish();
ROLLBACK;
