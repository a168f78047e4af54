-- A task's last output riding on its completion (docs/progress.md, Batching): awp.complete_task,
-- awp.complete_and_claim (p_live_output) and awp.complete_and_claim_many ("live_output" per item) and write it in the completion's own transaction, before the result
-- (awp._write_live_output): fenced per write like awp.report_progress (a refused item's or a wrong session's output
-- is not written), applied once with its offset, malformed ones refused (AWREQ) with nothing written or settled, and
-- the grouped path (two workers' items settled set-based) writes both.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(38);

SELECT * FROM tests.register_worker('w1', '{mock}', 4) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 4) \gset w2_
SELECT tests.make_run('wf', jsonb_build_array(tests.task('a'), tests.task('b'), tests.task('c'), tests.task('d'),
                                              tests.task('e'), tests.task('f'), tests.task('g'),
                                              tests.task('h'))) AS run \gset
SELECT tests.dispatch_all();
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 4);
INSERT INTO l SELECT * FROM awp.claim_tasks(:'w2_worker_id', :'w2_token', 4);
SELECT dispatch_id AS a_id, lease_token AS a_tok FROM l WHERE task_key = 'a' \gset
SELECT dispatch_id AS b_id, lease_token AS b_tok FROM l WHERE task_key = 'b' \gset
SELECT dispatch_id AS c_id, lease_token AS c_tok FROM l WHERE task_key = 'c' \gset
SELECT dispatch_id AS d_id, lease_token AS d_tok FROM l WHERE task_key = 'd' \gset
SELECT dispatch_id AS e_id, lease_token AS e_tok FROM l WHERE task_key = 'e' \gset
SELECT dispatch_id AS f_id, lease_token AS f_tok FROM l WHERE task_key = 'f' \gset
SELECT dispatch_id AS g_id, lease_token AS g_tok FROM l WHERE task_key = 'g' \gset
SELECT dispatch_id AS h_id, lease_token AS h_tok FROM l WHERE task_key = 'h' \gset
SELECT is((SELECT array_agg(worker_id ORDER BY task_key) FROM awp.dispatches WHERE run_id = :'run'),
          ARRAY[:'w1_worker_id', :'w1_worker_id', :'w1_worker_id', :'w1_worker_id', :'w2_worker_id', :'w2_worker_id',
                :'w2_worker_id', :'w2_worker_id'],
          'setup: a-d leased to w1, e-h to w2');
CREATE FUNCTION tests.outputs() RETURNS bigint LANGUAGE sql AS $$
  SELECT (SELECT count(*) FROM awp.task_output) + (SELECT count(*) FROM awp.task_progress)
         + (SELECT coalesce(sum(last_seq), 0) FROM awp.run_outputs)
$$;
CREATE FUNCTION tests.item(p_worker text, p_token text, p_dispatch text, p_lease text, p_live jsonb,
                           p_slots integer DEFAULT 0) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_build_object('worker_id', p_worker, 'session_token', p_token, 'dispatch_id', p_dispatch,
                            'lease_token', p_lease, 'result', tests.result(), 'slots', p_slots, 'claim_seq', NULL,
                            'live_output', p_live)
$$;

-- 1. One item: its lines, chunks and progress are stored, then its result.
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok')) FROM awp.complete_and_claim_many(jsonb_build_array(
             tests.item(:'w1_worker_id', :'w1_token', :'a_id', :'a_tok',
                        '[{"logs": ["one", "two"], "chunks": ["tok"], "progress": {"pct": 100}}]'))) m),
          '{ok}'::text[], 'complete_and_claim_many: an item with live_output is applied');
SELECT is(awp.task_logs(:'run', 'a')->'logs', '["one", "two"]'::jsonb, 'its log lines are stored');
SELECT is(awp.task_logs(:'run', 'a')->'chunks', '["tok"]'::jsonb, 'its chunks are stored');
SELECT is(awp.task_logs(:'run', 'a')->'progress', '{"pct": 100}'::jsonb, 'its progress is stored');
SELECT is(tests.task_status(:'run', 'a'), 'succeeded', 'and its result settled');

-- 2. Refusals write nothing: a wrong lease token, a wrong session (each answered on its own item).
SELECT tests.outputs() AS before \gset
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok') ORDER BY m.item)
             FROM awp.complete_and_claim_many(jsonb_build_array(
               tests.item(:'w1_worker_id', :'w1_token', :'b_id', 'wrong', '[{"logs": ["x"]}]'),
               tests.item(:'w1_worker_id', 'bad', :'c_id', :'c_tok', '[{"logs": ["y"]}]'))) m),
          '{AWLST,AWSES}'::text[], 'a wrong lease token and a wrong session are refused per item');
SELECT is(tests.outputs(), :before::bigint, 'and their live output is not written');

-- 3. Malformed live_output: the whole call is AWREQ, nothing written or settled.
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim_many(jsonb_build_array(tests.item(%L, %L, %L, %L, '{"logs": []}')))$$,
                        :'w1_worker_id', :'w1_token', :'b_id', :'b_tok'),
                 'AWREQ', 'invalid items', 'live_output not an array: invalid_request');
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim_many(jsonb_build_array(tests.item(%L, %L, %L, %L, '[{"logs": [1]}]')))$$,
                        :'w1_worker_id', :'w1_token', :'b_id', :'b_tok'),
                 'AWREQ', 'invalid items', 'a line that is not a string: invalid_request');
SELECT throws_ok(format($$SELECT * FROM awp.complete_and_claim_many(jsonb_build_array(tests.item(%L, %L, %L, %L, '[{"lines": ["x"]}]')))$$,
                        :'w1_worker_id', :'w1_token', :'b_id', :'b_tok'),
                 'AWREQ', 'invalid items', 'an unknown key in a write: invalid_request');
SELECT is(ARRAY[tests.outputs()::text, tests.dispatch_status(:'b_id')], ARRAY[:'before', 'leased'],
          'nothing written, nothing settled');

-- 4. Offsets: output the worker already sent (its answer lost) is applied once.
SELECT awp.report_progress(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', p_logs => '{l1}', p_offset => 0);
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok')) FROM awp.complete_and_claim_many(jsonb_build_array(
             tests.item(:'w1_worker_id', :'w1_token', :'b_id', :'b_tok', '[{"logs": ["l1", "l2"], "offset": 0}]'))) m),
          '{ok}'::text[], 'a completion resending a write');
SELECT is(awp.task_logs(:'run', 'b')->'logs', '["l1", "l2"]'::jsonb, 'each line once');

-- 6. The grouped path (two workers, one slot back each): both items' output written, both settled.
SELECT is((SELECT array_agg(coalesce(m.error->>'sqlstate', 'ok') ORDER BY m.item)
             FROM awp.complete_and_claim_many(jsonb_build_array(
               tests.item(:'w2_worker_id', :'w2_token', :'e_id', :'e_tok', '[{"logs": ["e"]}]', 1),
               tests.item(:'w1_worker_id', :'w1_token', :'d_id', :'d_tok', '[{"logs": ["d"]}]', 1))) m),
          '{ok,ok}'::text[], 'a group of two workers'' items');
SELECT is(ARRAY[awp.task_logs(:'run', 'e')->>'logs', awp.task_logs(:'run', 'd')->>'logs',
                tests.task_status(:'run', 'e'), tests.task_status(:'run', 'd')],
          ARRAY['["e"]', '["d"]', 'succeeded', 'succeeded'], 'both written and both settled');
SELECT ok(tests.sequences_contiguous(:'run'), 'sequences stay contiguous');

-- 7. The single calls: awp.complete_task and awp.complete_and_claim (p_live_output).
SELECT ok(awp.complete_task(:'w2_worker_id', :'w2_token', :'f_id', :'f_tok', tests.result(), '[{"logs": ["f1", "f2"]}]'),
          'complete_task with live_output: applied');
SELECT is(awp.task_logs(:'run', 'f')->'logs', '["f1", "f2"]'::jsonb, 'its lines are stored');
SELECT tests.outputs() AS before \gset
SELECT throws_ok(format($$SELECT awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1, NULL, '[{"logs": ["x"]}]')$$,
                        :'w2_worker_id', :'w2_token', :'g_id', 'wrong'),
                 'AWLST', 'lease lost', 'complete_and_claim with a wrong lease token: lease_lost');
SELECT is(tests.outputs(), :before::bigint, 'and its live output is not written');
SELECT throws_ok(format($$SELECT awp.complete_and_claim(%L, %L, %L, %L, tests.result(), 1, NULL, '[{"logs": "x"}]')$$,
                        :'w2_worker_id', :'w2_token', :'g_id', :'g_tok'),
                 'AWREQ', 'invalid live_output', 'a malformed live_output: invalid_request');
SELECT throws_ok(format($$SELECT awp.complete_and_claim(%L, 'bad', %L, %L, tests.result(), 1, NULL, '[{"logs": "x"}]')$$,
                        :'w2_worker_id', :'g_id', :'g_tok'),
                 'AWSES', NULL, 'a wrong session is AWSES before the output is looked at');
SELECT is((SELECT count(*) FROM awp.complete_and_claim(:'w2_worker_id', :'w2_token', :'g_id', :'g_tok', tests.result(), 0,
                                                       NULL, '[{"logs": ["g1"], "progress": "done"}]')), 0::bigint,
          'complete_and_claim with live_output: applied (no slot asked)');
SELECT is(ARRAY[awp.task_logs(:'run', 'g')->>'logs', awp.task_logs(:'run', 'g')->>'progress', tests.task_status(:'run', 'g')],
          ARRAY['["g1"]', 'done', 'succeeded'], 'its output written, its result settled');

-- 8. An attempt's counters row (awp.task_progress) is kept only when its rows do not tell: a short write without a
-- progress value is its task_output row alone; repeats are still applied once; past 1 KiB of a kind, or past a gap in
-- the offsets, the row is written with everything the attempt had.
SELECT is((SELECT array_agg(DISTINCT lo) FROM awp._setting_ranges() WHERE setting IN ('progress_log_bytes', 'progress_chunk_bytes')),
          ARRAY[1024::bigint], 'the 1 KiB _write_progress keeps without a counters row is the smallest bound allowed');
CREATE FUNCTION tests.counters(p_dispatch text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce((SELECT format('entries %s, log_bytes %s', entries, log_bytes) FROM awp.task_progress
                    WHERE dispatch_id = p_dispatch), 'no row')
$$;
SELECT is(ARRAY[awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h1,h2}', p_offset => 0)->>'truncated',
                tests.counters(:'h_id')],
          ARRAY['false', 'no row'], 'a short first write without progress: no counters row');
SELECT is(awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h1,h2}', p_offset => 0)->'seq',
          'null'::jsonb, 'its repeat writes nothing (what the attempt has is counted from its rows)');
SELECT is(ARRAY[awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h2,h3}', p_offset => 1)->>'truncated',
                tests.counters(:'h_id')],
          ARRAY['false', 'no row'], 'an overlapping write, still no row');
SELECT is(awp.task_logs(:'run', 'h')->'logs', '["h1", "h2", "h3"]'::jsonb, 'it kept only its new line');
SELECT is(ARRAY[awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h5}', p_offset => 4)->>'truncated',
                tests.counters(:'h_id')],
          ARRAY['false', 'entries 5, log_bytes 8'], 'a write past a gap (a write lost on its way) is counted from its offset');
SELECT is(awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h5}', p_offset => 4)->'seq',
          'null'::jsonb, 'and its repeat writes nothing');
SELECT is(awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => '{h4}', p_offset => 3)->'seq',
          'null'::jsonb, 'the lost write, when it comes late, is not taken (as with a counters row)');
SELECT is(awp.task_logs(:'run', 'h')->'logs', '["h1", "h2", "h3", "h5"]'::jsonb, 'the lines kept, in order');
SELECT is(ARRAY[awp.report_progress(:'w2_worker_id', :'w2_token', :'h_id', :'h_tok', p_logs => ARRAY[repeat('x', 1100)], p_offset => 5)->>'truncated',
                tests.counters(:'h_id')],
          ARRAY['false', 'entries 6, log_bytes 1108'], 'past 1 KiB of lines the counters follow the bytes');
SELECT is(ARRAY[awp.report_progress(:'w1_worker_id', :'w1_token', :'c_id', :'c_tok', p_logs => ARRAY[repeat('x', 600)], p_offset => 0)->>'truncated',
                tests.counters(:'c_id')],
          ARRAY['false', 'no row'], 'another attempt: 600 bytes of lines, no row');
SELECT is(ARRAY[awp.report_progress(:'w1_worker_id', :'w1_token', :'c_id', :'c_tok', p_logs => ARRAY[repeat('y', 600)], p_offset => 1)->>'truncated',
                tests.counters(:'c_id')],
          ARRAY['false', 'entries 2, log_bytes 1200'], 'past 1 KiB of lines the row is written, counting the earlier ones');
SELECT is(ARRAY[tests.counters(:'f_id'), awp.task_logs(:'run', 'f')->>'truncated', awp.task_logs(:'run', 'f')->>'logs_dropped'],
          ARRAY['no row', 'false', '0'], 'a task''s only write riding on its completion: one row, read as not truncated');

SELECT * FROM finish();
ROLLBACK;
