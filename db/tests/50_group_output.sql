-- The group path writes its items' last output itself (awp._write_group_output, docs/progress.md, Cost on the hot
-- path): the common form (one write of lines and chunks, the attempt without a counters row and holding exactly
-- the write's offset's worth of rows, within 1 KiB per kind) is numbered per run in the group's item order and stored with the completions; any other form
-- makes the group path not apply (AWGRP, rolled back), and awp.complete_and_claim_many then writes it exactly, one
-- item at a time (awp._write_live_output). Each case is tried on the group path alone (a direct call of
-- awp._complete_and_refill_group), then through awp.complete_and_claim_many.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(28);

SELECT * FROM tests.register_worker('w1', '{mock}', 1) \gset w1_
SELECT * FROM tests.register_worker('w2', '{mock}', 1) \gset w2_
SELECT tests.make_run('wf', (SELECT jsonb_agg(tests.task('t' || i)) FROM generate_series(1, 20) i), 2) AS run \gset
SELECT tests.dispatch_all();
-- The leases held, one per worker (w = its place in worker_id order: the group path's item order).
CREATE TEMP TABLE l (w integer PRIMARY KEY, worker_id text, token text, dispatch_id text, lease_token text,
                     task_key text);
INSERT INTO l
SELECT row_number() OVER (ORDER BY x.worker_id), x.worker_id, x.token, c.dispatch_id, c.lease_token, c.task_key
  FROM (VALUES (:'w1_worker_id', :'w1_token'), (:'w2_worker_id', :'w2_token')) AS x(worker_id, token)
 CROSS JOIN LATERAL awp.claim_tasks(x.worker_id, x.token, 1) c;
SELECT is((SELECT count(*) FROM l WHERE dispatch_id IS NOT NULL), 2::bigint, 'setup: each worker holds one lease');

-- tests.step(live outputs, direct): the two held leases completed in one group (item i = the lease of l.w = i, with
-- live_output live[i] unless NULL), by awp._complete_and_refill_group alone (direct) or by
-- awp.complete_and_claim_many; l then holds the refills. Returns 'ok', or the SQLSTATE of the error (the call's, or
-- an item's), nothing of the call kept.
CREATE FUNCTION tests.step(p_live jsonb[], p_direct boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  v_items jsonb;
  r       record;
  v_err   text;
BEGIN
  SELECT jsonb_agg(jsonb_build_object('worker_id', l.worker_id, 'session_token', l.token, 'dispatch_id', l.dispatch_id,
                                      'lease_token', l.lease_token, 'result', tests.result(), 'slots', 1,
                                      'claim_seq', NULL)
                   || CASE WHEN p_live[l.w] IS NULL THEN '{}'::jsonb
                           ELSE jsonb_build_object('live_output', p_live[l.w]) END ORDER BY l.w)
    INTO v_items FROM l;
  BEGIN
    IF p_direct THEN
      FOR r IN SELECT g.item, g.lease FROM awp._complete_and_refill_group(v_items) g LOOP
        UPDATE l SET dispatch_id = (r.lease).dispatch_id, lease_token = (r.lease).lease_token,
                     task_key = (r.lease).task_key
         WHERE l.w = r.item;
      END LOOP;
    ELSE
      FOR r IN SELECT m.item, m.error, m.lease FROM awp.complete_and_claim_many(v_items) m LOOP
        IF r.error IS NOT NULL THEN
          v_err := r.error->>'sqlstate';
        ELSE
          UPDATE l SET dispatch_id = (r.lease).dispatch_id, lease_token = (r.lease).lease_token,
                       task_key = (r.lease).task_key
           WHERE l.w = r.item;
        END IF;
      END LOOP;
      IF v_err IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = v_err, MESSAGE = 'an item was refused';
      END IF;
    END IF;
  EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
  END;
  RETURN 'ok';
END $$;
-- tests.entries(run, key): the lines and chunks its task's latest attempt kept, in order, as 'kind:text ...'.
CREATE FUNCTION tests.entries(p_run text, p_key text) RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(i->>'kind' || ':' || (i->>'text'), ' ' ORDER BY (i->>'seq')::bigint)
    FROM jsonb_array_elements(awp.task_logs(p_run, p_key)->'items') i
$$;
-- tests.numbered(run): the run's lines, chunks and progress values are numbered 1 .. its counter, each number once
-- (each attempt here reports one progress value at most: none is replaced).
CREATE FUNCTION tests.numbered(p_run text) RETURNS boolean LANGUAGE sql AS $$
  SELECT coalesce(array_agg(s ORDER BY s), '{}') = ARRAY(SELECT generate_series(1, (SELECT last_seq FROM awp.run_outputs
                                                                                      WHERE run_id = p_run)))
    FROM (SELECT o.first_seq + u.i - 1 AS s FROM awp.task_output o, unnest(o.entries) WITH ORDINALITY u(t, i)
           WHERE o.run_id = p_run
          UNION ALL
          SELECT p.progress_seq FROM awp.task_progress p WHERE p.run_id = p_run AND p.progress_seq IS NOT NULL) x
$$;
CREATE TEMP TABLE k AS SELECT w, task_key FROM l;

-- 1. The common form, on the group path alone: both items' output stored with their completions, numbered in item
-- order (each write's lines, then its chunks), one counter for the run.
SELECT is(tests.step(ARRAY['[{"logs": ["a1", "a2"], "offset": 0}]', '[{"logs": ["b1"], "chunks": ["c1", "c2"]}]']::jsonb[],
                     true), 'ok', 'the group path settles two items carrying lines and chunks');
SELECT is(ARRAY[tests.entries(:'run', (SELECT task_key FROM k WHERE w = 1)),
                tests.entries(:'run', (SELECT task_key FROM k WHERE w = 2))],
          ARRAY['log:a1 log:a2', 'log:b1 chunk:c1 chunk:c2'], 'each item''s lines and chunks, in order');
SELECT is((SELECT array_agg(o.first_seq || '-' || o.seq || ':' || o.kind ORDER BY o.seq) FROM awp.task_output o
            WHERE o.run_id = :'run'),
          '{1-2:log,3-3:log,4-5:chunk}'::text[], 'numbered in item order, lines before chunks');
SELECT is((SELECT last_seq FROM awp.run_outputs WHERE run_id = :'run'), 5::bigint, 'the run''s counter counts them');
SELECT is((SELECT count(*) FROM awp.task_progress), 0::bigint, 'no counters row');
SELECT is(ARRAY[tests.task_status(:'run', (SELECT task_key FROM k WHERE w = 1)),
                tests.task_status(:'run', (SELECT task_key FROM k WHERE w = 2))],
          '{succeeded,succeeded}'::text[], 'both completions settled');
SELECT ok(tests.ok_run(:'run'), 'invariants hold');

-- 2. One item with output, one without (and an empty live_output): still the group path.
DELETE FROM k; INSERT INTO k SELECT w, task_key FROM l;
SELECT is(tests.step(ARRAY[NULL, '[{"chunks": ["x"]}]']::jsonb[], true), 'ok', 'one item carries output, one none');
SELECT is(tests.entries(:'run', (SELECT task_key FROM k WHERE w = 2)), 'chunk:x', 'its chunk stored');
DELETE FROM k; INSERT INTO k SELECT w, task_key FROM l;
SELECT is(tests.step(ARRAY['[]', '[]']::jsonb[], true), 'ok', 'an empty live_output is none');

-- 3. A write sent before (its answer lost) and resent at its offset with the completion: not the group path's
-- (the attempt has rows); complete_and_claim_many writes each line once.
DELETE FROM k; INSERT INTO k SELECT w, task_key FROM l;
SELECT ok(awp.report_progress((SELECT worker_id FROM l WHERE w = 1), (SELECT token FROM l WHERE w = 1),
                              (SELECT dispatch_id FROM l WHERE w = 1), (SELECT lease_token FROM l WHERE w = 1),
                              p_logs => '{r1}', p_offset => 0) ? 'seq', 'a write of the first lease');
SELECT is(tests.step(ARRAY['[{"logs": ["r1", "r2"], "offset": 0}]', '[{"logs": ["s1"]}]']::jsonb[], true), 'AWGRP',
          'resent at offset 0 with the completion: not the group path''s');
SELECT is(tests.step(ARRAY['[{"logs": ["r1", "r2"], "offset": 0}]', '[{"logs": ["s1"]}]']::jsonb[], false), 'ok',
          'complete_and_claim_many settles it');
SELECT is(ARRAY[tests.entries(:'run', (SELECT task_key FROM k WHERE w = 1)),
                tests.entries(:'run', (SELECT task_key FROM k WHERE w = 2))],
          ARRAY['log:r1 log:r2', 'log:s1'], 'each line once');

-- 4. A line that is not a string: not the group path's; the whole call is AWREQ, nothing settled.
DELETE FROM k; INSERT INTO k SELECT w, task_key FROM l;
SELECT is(tests.step(ARRAY['[{"logs": [1]}]', NULL]::jsonb[], true), 'AWGRP', 'a line not a string: not the group path''s');
SELECT is(tests.step(ARRAY['[{"logs": [1]}]', NULL]::jsonb[], false), 'AWREQ', 'complete_and_claim_many: invalid_request');
SELECT is((SELECT array_agg(tests.dispatch_status(dispatch_id) ORDER BY w) FROM l), '{leased,leased}'::text[],
          'nothing settled');

-- 5. Other forms, each written exactly by complete_and_claim_many: a progress value, more than 1 KiB of lines (the
-- counters row follows the bytes), two writes, a write past a gap (counted from its offset).
SELECT is(tests.step(ARRAY['[{"logs": ["p1"], "progress": {"pct": 100}}]', NULL]::jsonb[], true), 'AWGRP',
          'a progress value: not the group path''s');
SELECT is(tests.step(ARRAY[jsonb_build_array(jsonb_build_object('logs', ARRAY[repeat('x', 1100)])), NULL]::jsonb[], true),
          'AWGRP', 'over 1 KiB of lines: not the group path''s');
SELECT is(tests.step(ARRAY['[{"logs": ["m1"]}, {"logs": ["m2"], "offset": 1}]', NULL]::jsonb[], true), 'AWGRP',
          'two writes: not the group path''s');
SELECT is(tests.step(ARRAY['[{"logs": ["g4"], "offset": 3}]', NULL]::jsonb[], true), 'AWGRP',
          'a write past a gap: not the group path''s');
SELECT is(tests.step(ARRAY['[{"logs": ["p1"], "progress": {"pct": 100}}]',
                           jsonb_build_array(jsonb_build_object('logs', ARRAY[repeat('x', 1100)]))]::jsonb[], false),
          'ok', 'complete_and_claim_many: a progress value and 1,100 bytes of lines');
SELECT is(ARRAY[tests.entries(:'run', (SELECT task_key FROM k WHERE w = 1)),
                awp.task_logs(:'run', (SELECT task_key FROM k WHERE w = 1))->>'progress',
                (SELECT log_bytes::text FROM awp.task_progress p JOIN k ON k.w = 2
                  WHERE p.run_id = :'run' AND p.task_key = k.task_key)],
          ARRAY['log:p1', '{"pct": 100}', '1100'], 'both written, the big one with its counters row');
DELETE FROM k; INSERT INTO k SELECT w, task_key FROM l;
SELECT is(tests.step(ARRAY['[{"logs": ["m1"]}, {"logs": ["m2"], "offset": 1}]', '[{"logs": ["g4"], "offset": 3}]']::jsonb[],
                     false), 'ok', 'complete_and_claim_many: two writes, and a write past a gap');
SELECT is(ARRAY[tests.entries(:'run', (SELECT task_key FROM k WHERE w = 1)),
                (SELECT entries::text FROM awp.task_progress p JOIN k ON k.w = 2
                  WHERE p.run_id = :'run' AND p.task_key = k.task_key)],
          ARRAY['log:m1 log:m2', '4'], 'both written, the late one counted from its offset');

-- 6. After all of it: every number once, invariants hold.
SELECT ok(tests.numbered(:'run'), 'the run''s lines and chunks numbered 1 .. its counter, each once');
SELECT ok(tests.ok_run(:'run'), 'invariants hold');

SELECT * FROM finish();
ROLLBACK;
