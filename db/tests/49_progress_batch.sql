-- awp._write_progress_batch (awp.report_progress_many, a completion's live_output): a batch of progress writes is
-- stored as the same writes one at a time (awp._write_progress, on a twin run) store them: the same answers, the same
-- entries per attempt in the same order, the same counters rows; a run's sequence numbers stay contiguous (the plain
-- writes take theirs together, the others after them, and the numbers of a plain write left to the one-at-a-time path
-- are given back); a batch spans runs.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(13);

SELECT * FROM tests.register_worker('w1', '{mock}', 40) \gset w1_
SELECT tests.make_run('wf', (SELECT jsonb_agg(tests.task(k)) FROM unnest('{a,b,c,d,e,f,g,h,i,j,k}'::text[]) k),
                      11) AS x \gset
SELECT tests.make_run('wf') AS y \gset
SELECT tests.make_run('wf') AS z \gset
SELECT tests.dispatch_all();
CREATE TEMP TABLE l AS SELECT * FROM awp.claim_tasks(:'w1_worker_id', :'w1_token', 33);
SELECT set_config('tests.w1', :'w1_worker_id', true);
SELECT is((SELECT count(*) FROM l), 33::bigint, 'setup: the three runs'' 33 tasks leased to w1');

-- The writes, in the order given: (position, task, write, whether its lease token is right).
CREATE TEMP TABLE writes (o integer, task_key text, w jsonb, token_ok boolean DEFAULT true);
INSERT INTO writes (o, task_key, w, token_ok) VALUES
  (1, 'a', '{"logs": ["a1", "a2"]}', true),                              -- plain
  (2, 'b', '{"progress": {"pct": 5}, "logs": ["b1"]}', true),           -- a progress value: one at a time
  (3, 'c', '{"logs": ["c1"]}', false),                                  -- a wrong lease token: AWLST
  (4, 'd', '{"logs": ["d1"], "offset": 0}', true),                      -- two writes of one lease, in order
  (5, 'd', '{"logs": ["d2"], "offset": 1}', true),
  (6, 'e', '{"logs": ["e1", "e2", "e3"], "offset": 0}', true),          -- a repeat: only e3 is new
  (7, 'f', '{"logs": ["f1"]}', true),                                   -- an attempt with a counters row
  (8, 'g', '{"logs": ["g1", null]}', true),                             -- a null line: AWREQ
  (9, 'h', '{"logs": ["h0"], "chunks": ["h1", "h2"], "offset": 0}', true),   -- plain, lines and chunks
  (10, 'i', jsonb_build_object('logs', jsonb_build_array(repeat('x', 600), repeat('y', 600))), true),  -- > 1 KiB
  (11, 'j', '{"logs": []}', true),                                      -- nothing: AWREQ
  (12, 'k', '{"chunks": ["k1"]}', true);                                -- plain
-- What the attempts had before: e two lines, f a progress value (so a counters row).
CREATE TEMP TABLE pre (task_key text, w jsonb);
INSERT INTO pre VALUES ('e', '{"logs": ["e1", "e2"], "offset": 0}'), ('f', '{"progress": "started"}');

CREATE FUNCTION pg_temp.one(p_run text, p_key text, p_w jsonb, p_ok boolean) RETURNS jsonb LANGUAGE sql AS $$
  SELECT awp._write_progress(current_setting('tests.w1'), l.dispatch_id, CASE WHEN p_ok THEN l.lease_token ELSE 'wrong' END,
                             p_w->'progress',
                             CASE WHEN jsonb_array_length(coalesce(p_w->'logs', '[]')) > 0
                                  THEN ARRAY(SELECT jsonb_array_elements_text(p_w->'logs')) END,
                             CASE WHEN jsonb_array_length(coalesce(p_w->'chunks', '[]')) > 0
                                  THEN ARRAY(SELECT jsonb_array_elements_text(p_w->'chunks')) END,
                             (p_w->>'offset')::bigint)
    FROM l WHERE l.run_id = p_run AND l.task_key = p_key
$$;
SELECT pg_temp.one(r, p.task_key, p.w, true) FROM pre p, unnest(ARRAY[:'x', :'y']) r;

-- Run x: one write at a time; run y: the same writes in one report_progress_many call, with one write of run z
-- first and one of an unknown dispatch last.
CREATE TEMP TABLE one_at_a_time AS SELECT w.o, pg_temp.one(:'x', w.task_key, w.w, w.token_ok) AS answer FROM writes w ORDER BY w.o;
CREATE TEMP TABLE batch AS
SELECT row_number() OVER () AS o, m.* FROM awp.report_progress_many(:'w1_worker_id', :'w1_token', (
  SELECT jsonb_build_array(jsonb_build_object('dispatch_id', z.dispatch_id, 'lease_token', z.lease_token, 'logs', '["z1"]'::jsonb))
         || jsonb_agg(w.w || jsonb_build_object('dispatch_id', l.dispatch_id,
                                                'lease_token', CASE WHEN w.token_ok THEN l.lease_token ELSE 'wrong' END)
                      ORDER BY w.o)
         || '[{"dispatch_id": "dsp_nope", "lease_token": "t", "logs": ["u"]}]'::jsonb
    FROM writes w JOIN l ON l.run_id = :'y' AND l.task_key = w.task_key
   CROSS JOIN (SELECT * FROM l WHERE l.run_id = :'z' AND l.task_key = 'a') z
   GROUP BY z.dispatch_id, z.lease_token)) m;

SELECT is((SELECT array_agg(coalesce(b.error->>'sqlstate', 'ok') ORDER BY b.o) FROM batch b),
          '{ok,ok,ok,AWLST,ok,ok,ok,ok,AWREQ,ok,ok,AWREQ,ok,AWLST}'::text[], 'the batch answers each write in the order given');
SELECT is((SELECT array_agg(b.dispatch_id ORDER BY b.o) FROM batch b WHERE b.o BETWEEN 2 AND 13),
          (SELECT array_agg(l.dispatch_id ORDER BY w.o) FROM writes w JOIN l ON l.run_id = :'y' AND l.task_key = w.task_key),
          'each answer names its dispatch');
SELECT is((SELECT array_agg(jsonb_build_array(b.error->>'sqlstate', b.error->>'message', b.error->>'detail', b.seq IS NULL,
                                              b.truncated) ORDER BY b.o) FROM batch b WHERE b.o BETWEEN 2 AND 13),
          (SELECT array_agg(jsonb_build_array(a.answer->'error'->>'sqlstate', a.answer->'error'->>'message',
                                              a.answer->'error'->>'detail', a.answer->'seq' IS NULL OR a.answer->'seq' = 'null',
                                              (a.answer->>'truncated')::boolean) ORDER BY a.o) FROM one_at_a_time a),
          'the same answers as one write at a time (refusals, their messages, whether anything was written)');
SELECT ok((SELECT bool_and(b.run_id = :'y') FROM batch b WHERE b.o BETWEEN 2 AND 13 AND b.error IS NULL)
          AND (SELECT b.run_id FROM batch b WHERE b.o = 1) = :'z', 'each answer names its run');

CREATE FUNCTION pg_temp.entries(p_run text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT jsonb_object_agg(t.task_key, (SELECT jsonb_agg(jsonb_build_array(i->>'kind', i->>'text') ORDER BY (i->>'seq')::bigint)
                                         FROM jsonb_array_elements(awp.task_logs(p_run, t.task_key)->'items') i))
    FROM awp.tasks t WHERE t.run_id = p_run
$$;
CREATE FUNCTION pg_temp.counters(p_run text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT coalesce(jsonb_object_agg(p.task_key, jsonb_build_array(p.progress, p.log_bytes, p.chunk_bytes, p.logs_dropped,
                                                                 p.chunks_dropped, p.entries)), '{}')
    FROM awp.task_progress p WHERE p.run_id = p_run
$$;
SELECT is(pg_temp.entries(:'y'), pg_temp.entries(:'x'), 'the same entries per attempt, in the same order');
SELECT is(pg_temp.entries(:'y')->'e', '[["log", "e1"], ["log", "e2"], ["log", "e3"]]'::jsonb, 'a repeat adds only what is new');
SELECT is(pg_temp.entries(:'y')->'d', '[["log", "d1"], ["log", "d2"]]'::jsonb, 'two writes of one lease, in order');
SELECT is(pg_temp.counters(:'y'), pg_temp.counters(:'x'), 'the same counters rows');
SELECT is(pg_temp.counters(:'y')->'f', '["started", 2, 0, 0, 0, 1]'::jsonb,
          'an attempt with a counters row counts the line written to it (2 bytes, 1 entry)');
SELECT is((SELECT last_seq FROM awp.run_outputs WHERE run_id = :'y'), (SELECT last_seq FROM awp.run_outputs WHERE run_id = :'x'),
          'the run''s counter as far as one write at a time takes it');
SELECT is((SELECT array_agg(s ORDER BY s) FROM (
             SELECT o.first_seq + g - 1 AS s FROM awp.task_output o, generate_series(1, cardinality(o.entries)) g
              WHERE o.run_id = :'y'
             UNION ALL SELECT p.progress_seq FROM awp.task_progress p WHERE p.run_id = :'y' AND p.progress_seq IS NOT NULL) n),
          (SELECT array_agg(g ORDER BY g) FROM generate_series(1, (SELECT last_seq FROM awp.run_outputs WHERE run_id = :'y')) g),
          'its numbers are contiguous: each number once, none given twice, none skipped');
SELECT is(pg_temp.entries(:'z')->'a', '[["log", "z1"]]'::jsonb, 'the other run''s write is stored in its run');

SELECT * FROM finish();
ROLLBACK;
