-- Live progress, logs and partial output of a running task (docs/progress.md; migration 0022). A worker reports,
-- for a lease it holds, the latest progress value (latest wins), log lines and output chunks (awp.report_progress,
-- POST /workers/{worker_id}/leases/{dispatch_id}/progress; awp.report_progress_many for several leases at once).
-- Readers: awp.task_logs, awp.run_stream (GET /runs/{id}/stream), awp.get_task (the latest progress).
-- A write is fenced like a completion and never locks the run, its dispatches or its tasks: it locks the run's row
-- of awp.run_outputs (its sequence counter) and its attempt's row of awp.task_progress, for one short transaction.

-- awp._progress_refusal(sqlstate, message, detail): a refused progress write's answer, {"error": {"sqlstate",
-- "message", "detail"}} (awp._write_progress). Locks: none.
CREATE OR REPLACE FUNCTION awp._progress_refusal(p_sqlstate text, p_message text, p_detail text) RETURNS jsonb
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT jsonb_build_object('error', jsonb_build_object('sqlstate', p_sqlstate, 'message', p_message, 'detail', p_detail))
$$;
COMMENT ON FUNCTION awp._progress_refusal(text, text, text) IS 'A refused progress write''s answer: {"error": {sqlstate, message, detail}}.';

-- awp._truncate_output(attempt row, kind, excess): drops the oldest entries of one kind ('log' or 'chunk') of an
-- attempt until at least `excess` bytes are gone (whole rows, then the leading entries of the next one), and counts
-- them on its awp.task_progress row (the attempt is then truncated).
-- Locks: the attempt's awp.task_progress row (already held by the caller) and the rows deleted or trimmed.
CREATE OR REPLACE FUNCTION awp._truncate_output(p awp.task_progress, p_kind text, p_excess bigint) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  o       record;
  v_left  bigint := p_excess;
  v_n     bigint := 0;
  v_bytes bigint := 0;
  v_k     integer;
  v_cut   bigint;
BEGIN
  FOR o IN SELECT x.seq, x.entries, x.bytes FROM awp.task_output x
            WHERE x.run_id = p.run_id AND x.task_key = p.task_key AND x.attempt = p.attempt AND x.kind = p_kind
            ORDER BY x.seq
  LOOP
    EXIT WHEN v_left <= 0;
    IF o.bytes <= v_left THEN
      DELETE FROM awp.task_output x WHERE x.run_id = p.run_id AND x.seq = o.seq;
      v_left := v_left - o.bytes;
      v_n := v_n + cardinality(o.entries);
      v_bytes := v_bytes + o.bytes;
    ELSE   -- the fewest leading entries of this row that cover the rest
      SELECT c.i, c.cum INTO v_k, v_cut
        FROM (SELECT u.i, sum(octet_length(u.t)) OVER (ORDER BY u.i) AS cum
                FROM unnest(o.entries) WITH ORDINALITY AS u(t, i)) c
       WHERE c.cum >= v_left ORDER BY c.i LIMIT 1;
      UPDATE awp.task_output x
         SET entries = x.entries[v_k + 1:], first_seq = x.first_seq + v_k, bytes = x.bytes - v_cut
       WHERE x.run_id = p.run_id AND x.seq = o.seq;
      v_left := 0;
      v_n := v_n + v_k;
      v_bytes := v_bytes + v_cut;
    END IF;
  END LOOP;
  UPDATE awp.task_progress t
     SET log_bytes = t.log_bytes - CASE p_kind WHEN 'log' THEN v_bytes ELSE 0 END,
         logs_dropped = t.logs_dropped + CASE p_kind WHEN 'log' THEN v_n ELSE 0 END,
         chunk_bytes = t.chunk_bytes - CASE p_kind WHEN 'chunk' THEN v_bytes ELSE 0 END,
         chunks_dropped = t.chunks_dropped + CASE p_kind WHEN 'chunk' THEN v_n ELSE 0 END
   WHERE t.dispatch_id = p.dispatch_id;
END $$;
COMMENT ON FUNCTION awp._truncate_output(awp.task_progress, text, bigint) IS 'Drops an attempt''s oldest log lines or chunks past its bound and counts them.';

-- awp._write_progress(worker_id, dispatch_id, lease_token, progress, logs, chunks, offset): one progress write of a
-- lease, checked and (when allowed) applied, in one call that never raises for a refused write: it answers
-- {"error": {"sqlstate", "message", "detail"}} and writes nothing (awp.report_progress raises it; the batch form and
-- the completions' live output need no subtransaction: more than 64 in one transaction would slow every other
-- session's snapshots). Refused, in this order: AWREQ when none of the three is given, a line or chunk is null or the
-- offset is negative; AWBIG (413) when the progress value is over awp._limit_progress_bytes(), the lines and chunks
-- together more than awp._limit_progress_entries(), or a line or chunk over awp._limit_progress_entry_bytes() (each
-- message names the limit); then AWLST unless this worker may still write the dispatch's progress: it holds the lease
-- (awp._holds_lease, the ownership test of a completion), the dispatch is leased, its attempt deadline and lease have
-- not passed, and its run is running without a cancellation request (the reasons awp.complete_task gives). A progress
-- write does not renew the lease; a heartbeat does.
-- offset (optional): how many lines and chunks the worker sent for this attempt before this write; the ones the
-- attempt already has (a write sent again after a lost answer) are skipped, so a write with its offset is applied
-- once. The run's next sequence numbers go to the (new) log lines in order, then the chunks in order, then the
-- progress value (latest wins). Past the attempt's bound (settings progress_log_bytes, progress_chunk_bytes) the
-- oldest entries of that kind are dropped. Answers {"seq": the last sequence number given (null when nothing was
-- written), "truncated": whether this attempt has dropped entries, "run_id"}.
-- The attempt's awp.task_progress row is written only when it has something its awp.task_output rows do not say: a
-- progress value, dropped entries, an offset past the entries it has (a write lost on its way), or bytes near a
-- bound (over 1 KiB of a kind, the smallest bound the settings allow). Without it, the attempt's entries and bytes are
-- those of its awp.task_output rows: a short task's only write (its last lines, riding on its completion) is one row.
-- Locks: the run's awp.run_outputs row (its writers queue there, one short transaction each; the sequence numbers
-- are taken with the lock, and the ones a repeat does not use are given back under it), then the attempt's
-- awp.task_progress row. Never the run, a dispatch, a task or a worker row (the lease's state at its plain read
-- decides).
CREATE OR REPLACE FUNCTION awp._write_progress(p_worker_id text, p_dispatch_id text, p_lease_token text,
                                               p_progress jsonb, p_logs text[], p_chunks text[],
                                               p_offset bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  d       awp.dispatches;
  p       awp.task_progress;
  s       awp.settings;
  v_now   timestamptz;
  v_logs  integer := coalesce(cardinality(p_logs), 0);
  v_sent  integer := coalesce(cardinality(p_logs), 0) + coalesce(cardinality(p_chunks), 0);
  v_lease   record;
  v_seqscan text := current_setting('enable_seqscan');   -- restored after the reads of the run and the attempt
  v_status  text;
  v_cancel  timestamptz;
  v_row   boolean;
  v_had   bigint[];
  v_have  bigint;
  v_skip  integer := 0;
  v_count integer;
  v_last  bigint;
  v_first bigint;
  v_bytes bigint;
  v_log_bytes   bigint := coalesce(octet_length(array_to_string(p_logs, '')), 0);
  v_chunk_bytes bigint := coalesce(octet_length(array_to_string(p_chunks, '')), 0);
BEGIN
  IF p_progress IS NULL AND p_logs IS NULL AND p_chunks IS NULL THEN
    RETURN awp._progress_refusal('AWREQ', 'nothing to report', 'give progress, logs or chunks');
  ELSIF array_position(p_logs, NULL) IS NOT NULL OR array_position(p_chunks, NULL) IS NOT NULL THEN
    RETURN awp._progress_refusal('AWREQ', 'invalid logs or chunks', 'logs and chunks must be arrays of strings');
  ELSIF p_offset < 0 THEN
    RETURN awp._progress_refusal('AWREQ', 'invalid offset', 'offset must be 0 or more');
  END IF;
  v_bytes := octet_length(p_progress::text);
  IF v_bytes > awp._limit_progress_bytes() THEN
    RETURN awp._progress_refusal('AWBIG', 'progress too large',
      format('progress is %s bytes, over the %s-byte limit', v_bytes, awp._limit_progress_bytes()));
  ELSIF v_sent > awp._limit_progress_entries() THEN
    RETURN awp._progress_refusal('AWBIG', 'too many entries',
      format('%s log lines and chunks in one write, over the limit of %s', v_sent, awp._limit_progress_entries()));
  ELSIF v_log_bytes + v_chunk_bytes > awp._limit_progress_entry_bytes() THEN   -- else no entry can be over it
    SELECT max(octet_length(x)) INTO v_bytes FROM (SELECT unnest(p_logs) UNION ALL SELECT unnest(p_chunks)) e(x);
    IF v_bytes > awp._limit_progress_entry_bytes() THEN
      RETURN awp._progress_refusal('AWBIG', 'log line or chunk too large',
        format('a log line or chunk is %s bytes, over the %s-byte limit', v_bytes, awp._limit_progress_entry_bytes()));
    END IF;
  END IF;
  SELECT x AS d, r.status, r.cancel_requested_at INTO v_lease   -- the lease and its run, by key
    FROM awp.dispatches x
    LEFT JOIN LATERAL (SELECT z.status, z.cancel_requested_at FROM awp.runs z WHERE z.run_id = x.run_id LIMIT 1) r ON true
   WHERE x.dispatch_id = p_dispatch_id;
  d := v_lease.d;
  v_status := v_lease.status;
  v_cancel := v_lease.cancel_requested_at;
  IF NOT FOUND OR NOT awp._holds_lease(d, p_worker_id, p_lease_token) THEN   -- (FOUND: of the SELECT)
    RETURN awp._progress_refusal('AWLST', 'lease lost', 'the dispatch is not leased to this worker with this lease token');
  END IF;
  v_now := awp._now();
  IF d.status <> 'leased' THEN
    RETURN awp._progress_refusal('AWLST', 'lease lost', format('the dispatch is %s', d.status));
  ELSIF v_now >= d.attempt_deadline THEN
    RETURN awp._progress_refusal('AWLST', 'lease lost', 'the attempt deadline has passed');
  ELSIF v_now >= d.lease_expires_at THEN
    RETURN awp._progress_refusal('AWLST', 'lease lost', 'the lease has expired');
  ELSIF v_cancel IS NOT NULL OR v_status <> 'running' THEN
    RETURN awp._progress_refusal('AWLST', 'lease lost', format('the run is %s%s', v_status,
                                 CASE WHEN v_cancel IS NOT NULL THEN ' (cancel requested)' ELSE '' END));
  END IF;

  -- The run's counter row first: the writers of one run (and the repeats of one write) queue here. The numbers
  -- for everything sent are taken at once (one statement locks and counts); a repeat gives back what it skips.
  -- The counter and the attempt's rows are read by key, planned with enable_seqscan off (set around these
  -- statements, as the claim's reads are): a plan made while the tables were small (a new database, or a partition
  -- analyzed while empty) would otherwise read the whole partition of the run's lines for every write.
  PERFORM set_config('enable_seqscan', 'off', true);
  v_count := v_sent + CASE WHEN p_progress IS NULL THEN 0 ELSE 1 END;
  UPDATE awp.run_outputs o SET last_seq = o.last_seq + v_count WHERE o.run_id = d.run_id RETURNING o.last_seq INTO v_last;
  IF NOT FOUND THEN   -- the run's first write
    INSERT INTO awp.run_outputs AS o (run_id, last_seq) VALUES (d.run_id, v_count)
    ON CONFLICT (run_id) DO UPDATE SET last_seq = o.last_seq + excluded.last_seq
    RETURNING o.last_seq INTO v_last;
  END IF;
  -- The common write in one statement (a short task's only write, riding on its completion): lines and chunks
  -- whose attempt has no counters row, sent at the offset the attempt has (or without one), within 1 KiB per kind:
  -- its rows stored, the attempt's checked in the same statement (after the lock above, so a concurrent write of the
  -- same attempt is seen). Otherwise nothing is inserted and the general path below reads and decides.
  IF p_progress IS NULL THEN
    INSERT INTO awp.task_output (run_id, seq, first_seq, task_key, attempt, kind, entries, bytes, created_at)
    SELECT d.run_id, r.seq, r.first_seq, d.task_key, d.attempt, r.kind, r.entries, r.bytes, v_now
      FROM (SELECT coalesce(sum(cardinality(o.entries)), 0) AS have,
                   coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'log'), 0) AS log_bytes,
                   coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'chunk'), 0) AS chunk_bytes
              FROM awp.task_output o
             WHERE o.run_id = d.run_id AND o.task_key = d.task_key AND o.attempt = d.attempt) h
     CROSS JOIN (VALUES (v_last - v_count + v_logs, v_last - v_count + 1, 'log', p_logs, v_log_bytes),
                        (v_last, v_last - v_count + v_logs + 1, 'chunk', p_chunks, v_chunk_bytes))
                   AS r(seq, first_seq, kind, entries, bytes)
     WHERE cardinality(r.entries) > 0 AND coalesce(p_offset, h.have) = h.have
       AND h.log_bytes + v_log_bytes <= 1024 AND h.chunk_bytes + v_chunk_bytes <= 1024
       AND NOT EXISTS (SELECT 1 FROM awp.task_progress t WHERE t.dispatch_id = d.dispatch_id);
    IF FOUND THEN
      PERFORM set_config('enable_seqscan', v_seqscan, true);
      RETURN jsonb_build_object('seq', v_last, 'run_id', d.run_id, 'truncated', false);
    END IF;
  END IF;
  -- What the attempt has: its counters row, else (nothing dropped, no gap) its rows (none, for its first write).
  SELECT t.dispatch_id IS NOT NULL,
         CASE WHEN t.dispatch_id IS NOT NULL THEN ARRAY[t.entries, t.log_bytes, t.chunk_bytes]
              ELSE (SELECT ARRAY[coalesce(sum(cardinality(o.entries)), 0),
                                 coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'log'), 0),
                                 coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'chunk'), 0)]
                      FROM awp.task_output o
                     WHERE o.run_id = d.run_id AND o.task_key = d.task_key AND o.attempt = d.attempt) END
    INTO v_row, v_had
    FROM (SELECT) one LEFT JOIN awp.task_progress t ON t.dispatch_id = d.dispatch_id;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  v_have := v_had[1];
  IF p_offset IS NOT NULL THEN
    v_skip := greatest(0, least(v_sent, v_have - p_offset))::integer;   -- the ones this attempt already has
    IF v_skip > 0 THEN
      p_chunks := p_chunks[greatest(1, v_skip - v_logs + 1):];
      p_logs := p_logs[v_skip + 1:];
      v_logs := coalesce(cardinality(p_logs), 0);
      v_log_bytes := coalesce(octet_length(array_to_string(p_logs, '')), 0);
      v_chunk_bytes := coalesce(octet_length(array_to_string(p_chunks, '')), 0);
      v_count := v_count - v_skip;
      UPDATE awp.run_outputs o SET last_seq = o.last_seq - v_skip WHERE o.run_id = d.run_id
      RETURNING o.last_seq INTO v_last;
    END IF;
  END IF;
  IF v_count = 0 THEN
    RETURN jsonb_build_object('seq', NULL, 'truncated', false, 'run_id', d.run_id);
  END IF;

  -- One row for the write's lines, one for its chunks: entries numbered from the first new sequence number.
  v_first := v_last - v_count + 1;
  IF v_logs > 0 THEN
    INSERT INTO awp.task_output (run_id, seq, first_seq, task_key, attempt, kind, entries, bytes, created_at)
    VALUES (d.run_id, v_first + v_logs - 1, v_first, d.task_key, d.attempt, 'log', p_logs, v_log_bytes, v_now);
  END IF;
  IF cardinality(p_chunks) > 0 THEN
    INSERT INTO awp.task_output (run_id, seq, first_seq, task_key, attempt, kind, entries, bytes, created_at)
    VALUES (d.run_id, v_first + v_logs + cardinality(p_chunks) - 1, v_first + v_logs, d.task_key, d.attempt, 'chunk',
            p_chunks, v_chunk_bytes, v_now);
  END IF;

  -- No counters row needed (see above): no progress, no gap, and within 1 KiB per kind, the smallest bound the
  -- settings allow (the lo of awp._setting_ranges(), db/tests/46_live_output.sql checks it), so no bound is read or
  -- passed.
  IF NOT v_row AND p_progress IS NULL AND coalesce(p_offset, 0) <= v_have
     AND v_had[2] + v_log_bytes <= 1024 AND v_had[3] + v_chunk_bytes <= 1024 THEN
    RETURN jsonb_build_object('seq', v_last, 'run_id', d.run_id, 'truncated', false);
  END IF;
  INSERT INTO awp.task_progress AS t (dispatch_id, run_id, task_key, attempt, progress, progress_seq, progress_at,
                                      log_bytes, chunk_bytes, entries, updated_at)
  VALUES (d.dispatch_id, d.run_id, d.task_key, d.attempt, p_progress,
          CASE WHEN p_progress IS NOT NULL THEN v_last END, CASE WHEN p_progress IS NOT NULL THEN v_now END,
          v_had[2] + v_log_bytes, v_had[3] + v_chunk_bytes,
          greatest(v_have, coalesce(p_offset, v_have)) + v_sent - v_skip, v_now)
  ON CONFLICT (dispatch_id) DO UPDATE
     SET progress = CASE WHEN excluded.progress_seq IS NULL THEN t.progress ELSE excluded.progress END,
         progress_seq = coalesce(excluded.progress_seq, t.progress_seq),
         progress_at = coalesce(excluded.progress_at, t.progress_at),
         log_bytes = t.log_bytes + v_log_bytes,
         chunk_bytes = t.chunk_bytes + v_chunk_bytes,
         entries = excluded.entries,
         updated_at = excluded.updated_at
  RETURNING t.* INTO p;

  s := awp._settings();
  IF p.log_bytes > s.progress_log_bytes THEN
    PERFORM awp._truncate_output(p, 'log', p.log_bytes - s.progress_log_bytes);
  END IF;
  IF p.chunk_bytes > s.progress_chunk_bytes THEN
    PERFORM awp._truncate_output(p, 'chunk', p.chunk_bytes - s.progress_chunk_bytes);
  END IF;
  RETURN jsonb_build_object('seq', v_last, 'run_id', d.run_id, 'truncated',
    p.logs_dropped + p.chunks_dropped > 0 OR p.log_bytes > s.progress_log_bytes OR p.chunk_bytes > s.progress_chunk_bytes);
END $$;
COMMENT ON FUNCTION awp._write_progress(text, text, text, jsonb, text[], text[], bigint) IS 'One progress write of a lease (progress, log lines, chunks), fenced (a refusal answered as {"error"}), bounded per attempt, applied once with its offset.';

-- awp._write_progress_batch(items): several progress writes in one call (awp.report_progress_many), each answered
-- as awp._write_progress would answer it alone (a refusal as {"error"}, nothing of it written), the answers a JSON
-- array in the order given. items: an array of {"worker_id", "dispatch_id", "lease_token", "progress"?, "logs"?: [...],
-- "chunks"?: [...], "offset"?} (their shape checked by the caller; an element of logs or chunks is taken as its text).
-- One statement checks them all and reads their leases and runs by key. A write is plain when it carries lines or
-- chunks only, is its lease's only write in the call and passes every check of awp._write_progress. Per run, in
-- run_id order: the run's awp.run_outputs row is locked and the numbers of its plain writes taken in one statement;
-- one statement reads what their attempts have, and one stores those that need no awp.task_progress row (the
-- condition of awp._write_progress: none yet, no gap or repeat, within 1 KiB per kind), numbered in the order given;
-- the numbers of the others are given back. Those others, and every write that is not plain, then go through
-- awp._write_progress one by one, in the order given (so within a run a plain write may be numbered before a write
-- given earlier; a lease's own writes keep their order). A call carrying many short tasks' last lines (the batch
-- route, POST .../progress with many leases) costs a few statements instead of several per write (docs/progress.md,
-- Cost on the hot path). Locks: as awp._write_progress, the runs' awp.run_outputs rows in run_id order.
CREATE OR REPLACE FUNCTION awp._write_progress_batch(p_items jsonb)
RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_now    timestamptz := awp._now();
  v_ans    jsonb[] := array_fill(NULL::jsonb, ARRAY[coalesce(jsonb_array_length(p_items), 0)]);
  b_o      integer[];   -- the items, in (run_id NULLS FIRST, position) order
  b_run    text[];
  b_plain  boolean[];
  b_n      integer[];
  b_did    text[];
  b_key    text[];
  b_att    integer[];
  v_ids    text[];
  v_distinct integer;
  v_run    text;
  v_n      bigint;
  v_last   bigint;
  v_seq    bigint;
  v_done   integer[];
  v_seqscan text := current_setting('enable_seqscan');   -- restored after the reads of a run's counter and attempts
  a_o      integer[];   -- a run's plain writes (in the order given) and what their attempts have
  a_key    text[];
  a_att    integer[];
  a_ok     boolean[];
  a_nl     integer[];
  a_nc     integer[];
  a_lb     bigint[];
  a_cb     bigint[];
  e        jsonb;
  i        integer;
  j        integer;
BEGIN
  IF jsonb_array_length(p_items) = 1 THEN   -- one write goes through awp._write_progress (cheaper for one)
    b_o := '{1}';
    b_run := '{NULL}';
    b_plain := '{false}';
    b_n := '{0}';
  ELSE
    v_ids := ARRAY(SELECT x->>'dispatch_id' FROM jsonb_array_elements(p_items) x);
    v_distinct := (SELECT count(DISTINCT u) FROM unnest(v_ids) u);
    -- Each write checked and its lease and run read by key, in one statement; the items in (run_id, position) order
    -- (the ordered subquery feeds the aggregates in that order).
    SELECT array_agg(c.o), array_agg(c.run_id), array_agg(c.plain), array_agg(c.n), array_agg(c.dispatch_id),
           array_agg(c.task_key), array_agg(c.attempt)
      INTO b_o, b_run, b_plain, b_n, b_did, b_key, b_att
      FROM (SELECT x.o::integer AS o, d.run_id, d.dispatch_id, d.task_key, d.attempt, x.n,
                   -- every check of awp._write_progress passed (a copy that may only be stricter: anything else goes
                   -- there, which answers it): lines or chunks only, none null, not too many, none too large (an item
                   -- whose JSON text is within the limit has no entry over it), the lease held and live, its run
                   -- running, and the lease's only write in this call
                   coalesce(x.e->'progress' IS NULL AND x.n BETWEEN 1 AND awp._limit_progress_entries()
                            AND NOT (x.logs @> '[null]' OR x.chunks @> '[null]')
                            AND octet_length(x.e::text) <= awp._limit_progress_entry_bytes()
                            AND d.holds AND d.status = 'leased' AND v_now < d.attempt_deadline
                            AND v_now < d.lease_expires_at AND r.status = 'running' AND r.cancel_requested_at IS NULL
                            AND (cardinality(v_ids) = v_distinct
                                 OR (SELECT count(*) FROM unnest(v_ids) u WHERE u = x.e->>'dispatch_id') = 1), false) AS plain
              FROM (SELECT x.e, x.o, w.logs, w.chunks, jsonb_array_length(w.logs) + jsonb_array_length(w.chunks) AS n
                      FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, o)
                     CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(x.e->'logs') = 'array' THEN x.e->'logs' ELSE '[]' END,
                                                CASE WHEN jsonb_typeof(x.e->'chunks') = 'array' THEN x.e->'chunks' ELSE '[]' END)
                                        AS w(logs, chunks)) x
              LEFT JOIN LATERAL (SELECT y.run_id, y.dispatch_id, y.task_key, y.attempt, y.status, y.attempt_deadline,
                                        y.lease_expires_at, awp._holds_lease(y, x.e->>'worker_id', x.e->>'lease_token') AS holds
                                   FROM awp.dispatches y
                                  WHERE y.dispatch_id = x.e->>'dispatch_id' LIMIT 1) d ON true
              LEFT JOIN LATERAL (SELECT z.status, z.cancel_requested_at FROM awp.runs z WHERE z.run_id = d.run_id
                                  LIMIT 1) r ON true   -- by key (a join could read every dispatch and run)
             ORDER BY d.run_id NULLS FIRST, x.o) c;
  END IF;
  i := 1;
  WHILE i <= cardinality(b_o) LOOP
    v_run := b_run[i];
    j := i;   -- the run's items are b_o[i .. j]
    WHILE j < cardinality(b_o) AND b_run[j + 1] IS NOT DISTINCT FROM v_run LOOP
      j := j + 1;
    END LOOP;
    v_done := '{}';
    v_n := (SELECT sum(b_n[g]) FROM generate_series(i, j) g WHERE b_plain[g]);
    IF v_n > 0 THEN
      -- The run's counter row first (as awp._write_progress): the numbers of all its plain writes at once. It and
      -- the attempts are read by key, planned with enable_seqscan off (set around these statements, as in
      -- awp._write_progress).
      PERFORM set_config('enable_seqscan', 'off', true);
      UPDATE awp.run_outputs o SET last_seq = o.last_seq + v_n WHERE o.run_id = v_run RETURNING o.last_seq INTO v_last;
      IF NOT FOUND THEN
        INSERT INTO awp.run_outputs AS o (run_id, last_seq) VALUES (v_run, v_n)
        ON CONFLICT (run_id) DO UPDATE SET last_seq = o.last_seq + excluded.last_seq
        RETURNING o.last_seq INTO v_last;
      END IF;
      -- What their attempts have, read under that lock, and which of the writes need no counters row.
      SELECT array_agg(b.o), array_agg(b.task_key), array_agg(b.attempt), array_agg(h.ok), array_agg(l.n), array_agg(c.n),
             array_agg(l.bytes), array_agg(c.bytes)
        INTO a_o, a_key, a_att, a_ok, a_nl, a_nc, a_lb, a_cb
        FROM (SELECT * FROM unnest(b_o[i:j], b_plain[i:j], b_did[i:j], b_key[i:j], b_att[i:j])
                              AS b(o, plain, dispatch_id, task_key, attempt)
               WHERE b.plain ORDER BY b.o) b
        CROSS JOIN LATERAL (SELECT count(*)::integer AS n, coalesce(sum(octet_length(t)), 0) AS bytes
                              FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(p_items->(b.o - 1)->'logs') = 'array'
                                                                  THEN p_items->(b.o - 1)->'logs' ELSE '[]' END) t) l
        CROSS JOIN LATERAL (SELECT count(*)::integer AS n, coalesce(sum(octet_length(t)), 0) AS bytes
                              FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(p_items->(b.o - 1)->'chunks') = 'array'
                                                                  THEN p_items->(b.o - 1)->'chunks' ELSE '[]' END) t) c
        CROSS JOIN LATERAL (SELECT NOT EXISTS (SELECT 1 FROM awp.task_progress p WHERE p.dispatch_id = b.dispatch_id)
                                   AND coalesce((p_items->(b.o - 1)->>'offset')::bigint, t.have) = t.have
                                   AND t.log_bytes + l.bytes <= 1024 AND t.chunk_bytes + c.bytes <= 1024 AS ok
                              FROM (SELECT coalesce(sum(cardinality(o.entries)), 0) AS have,
                                           coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'log'), 0) AS log_bytes,
                                           coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'chunk'), 0) AS chunk_bytes
                                      FROM awp.task_output o
                                     WHERE o.run_id = v_run AND o.task_key = b.task_key AND o.attempt = b.attempt) t) h;
      PERFORM set_config('enable_seqscan', v_seqscan, true);
      -- Those writes take the numbers after v_last - v_n in the order given: each its lines, then its chunks (one
      -- awp.task_output row each); the answers say each write's last number.
      v_seq := v_last - v_n;
      FOR k IN 1 .. coalesce(cardinality(a_o), 0) LOOP
        CONTINUE WHEN NOT a_ok[k];
        v_seq := v_seq + a_nl[k] + a_nc[k];
        v_ans[a_o[k]] := jsonb_build_object('seq', v_seq, 'run_id', v_run, 'truncated', false);
        v_done := v_done || a_o[k];
      END LOOP;
      INSERT INTO awp.task_output (run_id, seq, first_seq, task_key, attempt, kind, entries, bytes, created_at)
      SELECT v_run, r.seq, r.seq - r.n + 1, w.task_key, w.attempt, r.kind,
             ARRAY(SELECT jsonb_array_elements_text(p_items->(w.o - 1)->r.field)), r.bytes, v_now
        FROM (SELECT a.*, v_last - v_n + sum(a.nl + a.nc) OVER (ORDER BY a.o) AS last
                FROM unnest(a_o, a_key, a_att, a_ok, a_nl, a_nc, a_lb, a_cb)
                       AS a(o, task_key, attempt, ok, nl, nc, lb, cb)
               WHERE a.ok) w
       CROSS JOIN LATERAL (VALUES ('logs', 'log', w.last - w.nc, w.nl, w.lb),
                                  ('chunks', 'chunk', w.last, w.nc, w.cb)) AS r(field, kind, seq, n, bytes)
       WHERE r.n > 0;
      IF v_seq < v_last THEN   -- the numbers of the writes left to awp._write_progress, given back under the lock
        UPDATE awp.run_outputs o SET last_seq = o.last_seq - (v_last - v_seq) WHERE o.run_id = v_run;
      END IF;
    END IF;
    FOR k IN i .. j LOOP   -- the rest, in the order given
      CONTINUE WHEN b_o[k] = ANY (v_done);
      e := p_items->(b_o[k] - 1);
      v_ans[b_o[k]] := awp._write_progress(
        e->>'worker_id', e->>'dispatch_id', e->>'lease_token', e->'progress',
        CASE WHEN jsonb_typeof(e->'logs') = 'array' AND jsonb_array_length(e->'logs') > 0
             THEN ARRAY(SELECT jsonb_array_elements_text(e->'logs')) END,
        CASE WHEN jsonb_typeof(e->'chunks') = 'array' AND jsonb_array_length(e->'chunks') > 0
             THEN ARRAY(SELECT jsonb_array_elements_text(e->'chunks')) END,
        (e->>'offset')::bigint);
    END LOOP;
    i := j + 1;
  END LOOP;
  RETURN to_jsonb(v_ans);
END $$;
COMMENT ON FUNCTION awp._write_progress_batch(jsonb) IS 'Several progress writes in one call, each answered as awp._write_progress would answer it (in the order given); the plain ones stored a run at a time.';

-- awp.report_progress(worker_id, session_token, dispatch_id, lease_token, progress, logs, chunks, offset): a running task's
-- latest progress value (any JSON, latest wins, at most awp._limit_progress_bytes() bytes), log lines and output
-- chunks (appended in order), any of the three (docs/progress.md). Fenced like awp.complete_task: AWSES (checked
-- first), AWREQ (nothing given, a null line), AWBIG (a value over its limit), AWLST (unknown dispatch, another
-- worker's, a wrong lease token, not leased any more, expired, past its attempt deadline, run canceled or not
-- running); nothing is written when it raises. offset: see awp._write_progress (a repeated write is applied once). Returns {"seq", "truncated", "run_id"} (awp._write_progress).
-- Locks: as awp._write_progress (no worker, run, dispatch or task lock).
CREATE OR REPLACE FUNCTION awp.report_progress(p_worker_id text, p_session_token text, p_dispatch_id text,
                                               p_lease_token text, p_progress jsonb DEFAULT NULL,
                                               p_logs text[] DEFAULT NULL, p_chunks text[] DEFAULT NULL,
                                               p_offset bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_ans jsonb;
BEGIN
  PERFORM awp._session(p_worker_id, p_session_token, false);
  v_ans := awp._write_progress(p_worker_id, p_dispatch_id, p_lease_token, p_progress, p_logs, p_chunks, p_offset);
  CASE v_ans->'error'->>'sqlstate'
    WHEN 'AWREQ' THEN PERFORM awp._raise_invalid_request(v_ans->'error'->>'message', v_ans->'error'->>'detail');
    WHEN 'AWBIG' THEN PERFORM awp._raise_too_large(v_ans->'error'->>'message', v_ans->'error'->>'detail');
    WHEN 'AWLST' THEN PERFORM awp._raise_lease_lost(v_ans->'error'->>'detail');
    ELSE NULL;
  END CASE;
  RETURN v_ans;
END $$;
COMMENT ON FUNCTION awp.report_progress(text, text, text, text, jsonb, text[], text[], bigint) IS 'A lease''s progress value, log lines and output chunks (fenced like complete; bounded per attempt); AWSES/AWREQ/AWBIG/AWLST.';

-- awp.report_progress_many(worker_id, session_token, items): several leases' writes in one call, each on its own
-- (a refused item writes nothing and does not spoil the others). items: an array of at most
-- awp._limit_batch_results() objects {"dispatch_id", "lease_token", "progress"?, "logs"?: [text], "chunks"?: [text],
-- "offset"?: integer}.
-- One row per item, in order: dispatch_id, and either seq, truncated and run_id (as awp.report_progress) or error
-- {sqlstate, message, detail} (AWLST, AWBIG, AWREQ). AWSES first; AWREQ for a malformed list.
-- The items are written by awp._write_progress_batch, which answers a refused item without raising (no item needs
-- a subtransaction). Locks: as awp._write_progress_batch (the runs' awp.run_outputs rows in run_id order: no lock
-- cycle between two batches).
CREATE OR REPLACE FUNCTION awp.report_progress_many(p_worker_id text, p_session_token text, p_items jsonb)
RETURNS TABLE (dispatch_id text, seq bigint, truncated boolean, run_id text, error jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_answers jsonb;
BEGIN
  PERFORM awp._session(p_worker_id, p_session_token, false);
  IF jsonb_typeof(p_items) IS DISTINCT FROM 'array' OR jsonb_array_length(p_items) > awp._limit_batch_results()
     OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_items) x
                 WHERE jsonb_typeof(x) <> 'object'
                    OR jsonb_typeof(x->'dispatch_id') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(x->'lease_token') IS DISTINCT FROM 'string'
                    OR jsonb_typeof(coalesce(x->'logs', '[]')) <> 'array'
                    OR jsonb_typeof(coalesce(x->'chunks', '[]')) <> 'array'
                    OR coalesce(x->>'offset', '0') !~ '^[0-9]{1,18}$'
                    OR x - '{dispatch_id,lease_token,progress,logs,chunks,offset}'::text[] <> '{}'::jsonb) THEN
    PERFORM awp._raise_invalid_request('invalid items',
      format('items must be an array of at most %s {"dispatch_id", "lease_token", "progress"?, "logs"?, "chunks"?, "offset"?} objects',
             awp._limit_batch_results()));
  END IF;
  v_answers := awp._write_progress_batch(coalesce(
    (SELECT jsonb_agg(x.e || jsonb_build_object('worker_id', p_worker_id) ORDER BY x.o)
       FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, o)), '[]'));
  RETURN QUERY
  SELECT p_items->(a.o::integer - 1)->>'dispatch_id', (a.a->>'seq')::bigint, (a.a->>'truncated')::boolean,
         a.a->>'run_id', a.a->'error'
    FROM jsonb_array_elements(v_answers) WITH ORDINALITY AS a(a, o) ORDER BY a.o;
END $$;
COMMENT ON FUNCTION awp.report_progress_many(text, text, jsonb) IS 'Several leases'' progress writes in one call, each fenced on its own; per item its seq or its error; AWSES/AWREQ.';

-- awp._write_lease_output(worker_id, session_token, dispatch_id, lease_token, live_output, what, session_checked):
-- the last progress writes that ride on one lease's completion (its result's "live_output", docs/progress.md), for
-- awp.complete_task and awp.complete_and_claim, and per item for awp._write_live_output (awp.complete_and_claim_many;
-- the batch route writes its leases' output by awp.report_progress_many instead): written in the completion's own
-- transaction, after the run's advisory lock and before anything else of it, so a task's output is stored before
-- its result, without a round trip and a commit of its own. live_output: NULL (nothing), or an array of at most
-- awp._limit_batch_results() writes {"progress"?, "logs"?: [string], "chunks"?: [string], "offset"?: integer}.
-- A malformed one raises AWREQ with the message `what` (the caller's, for its whole call: its statement fails, so
-- nothing of it stays). Each write is fenced as awp.report_progress fences it (the session, unless the caller checked
-- it already: session_checked, then awp._write_progress); a refused write is dropped (the completion's result then
-- answers for the lease).
-- Locks: as awp._write_progress per write (the run's awp.run_outputs row, then the attempt's awp.task_progress row);
-- never a run, dispatch, task or worker row: the callers hold the run's advisory lock (taken before, as every
-- completion takes it before the counter row) and take those after.
CREATE OR REPLACE FUNCTION awp._write_lease_output(p_worker_id text, p_session_token text, p_dispatch_id text,
                                                   p_lease_token text, p_live_output jsonb, p_what text,
                                                   p_session_checked boolean)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w        jsonb;
  v_logs   text[];
  v_chunks text[];
  v_live   boolean;
BEGIN
  IF p_live_output IS NULL THEN
    RETURN;
  ELSIF jsonb_typeof(p_live_output) <> 'array' OR jsonb_array_length(p_live_output) > awp._limit_batch_results() THEN
    PERFORM awp._raise_invalid_request(p_what, format('live_output must be an array of at most %s progress writes '
                                                      '{"progress"?, "logs"?, "chunks"?, "offset"?}',
                                                      awp._limit_batch_results()));
  END IF;
  v_live := p_session_checked
            OR EXISTS (SELECT 1 FROM awp.workers k   -- the session, as awp._session checks it
                        WHERE k.worker_id = p_worker_id AND k.status IN ('active', 'draining')
                          AND k.session_token_hash = awp._hash(p_session_token));
  FOR i IN 0 .. jsonb_array_length(p_live_output) - 1 LOOP   -- in order, without a query
    w := p_live_output->i;
    IF jsonb_typeof(w) <> 'object' OR w - '{progress,logs,chunks,offset}'::text[] <> '{}'::jsonb
       OR jsonb_typeof(coalesce(w->'logs', '[]')) <> 'array' OR jsonb_typeof(coalesce(w->'chunks', '[]')) <> 'array'
       OR (w ? 'logs' AND jsonb_path_exists(w, 'strict $.logs[*] ? (@.type() != "string")'))
       OR (w ? 'chunks' AND jsonb_path_exists(w, 'strict $.chunks[*] ? (@.type() != "string")'))
       OR coalesce(w->>'offset', '0') !~ '^[0-9]{1,18}$' THEN
      PERFORM awp._raise_invalid_request(p_what, 'a live_output write is {"progress"?, "logs"?: [string], '
                                                 '"chunks"?: [string], "offset"?: integer >= 0}');
    END IF;
    CONTINUE WHEN NOT v_live;
    v_logs := CASE WHEN jsonb_array_length(coalesce(w->'logs', '[]')) > 0
                   THEN ARRAY(SELECT jsonb_array_elements_text(w->'logs')) END;
    v_chunks := CASE WHEN jsonb_array_length(coalesce(w->'chunks', '[]')) > 0
                     THEN ARRAY(SELECT jsonb_array_elements_text(w->'chunks')) END;
    PERFORM awp._write_progress(p_worker_id, p_dispatch_id, p_lease_token, w->'progress', v_logs, v_chunks,
                                (w->>'offset')::bigint);   -- a refused write answers its refusal: dropped
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._write_lease_output(text, text, text, text, jsonb, text, boolean) IS 'The progress writes riding on one lease''s completion (live_output), fenced per write, written after the run''s advisory lock and before the completion''s other locks; AWREQ (with the caller''s message) when malformed.';

-- awp._write_live_output(items, what): the live output of the completion items of awp.complete_and_claim_many
-- (objects with "worker_id", "session_token", "dispatch_id", "lease_token" and optionally "live_output"), each item's by
-- awp._write_lease_output (its session checked there), the items taken in run_id order, as
-- awp.report_progress_many takes them (the runs' awp.run_outputs rows in that order: no lock cycle between two
-- calls). Locks: as awp._write_lease_output per item.
CREATE OR REPLACE FUNCTION awp._write_live_output(p_items jsonb, p_what text)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  e jsonb;
BEGIN
  FOR e IN SELECT x.e FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, o)
             LEFT JOIN LATERAL (SELECT y.run_id FROM awp.dispatches y WHERE y.dispatch_id = x.e->>'dispatch_id'
                                 LIMIT 1) d ON true   -- by key (a join could read every dispatch)
            WHERE x.e ? 'live_output'
            ORDER BY d.run_id NULLS FIRST, x.o
  LOOP
    PERFORM awp._write_lease_output(e->>'worker_id', e->>'session_token', e->>'dispatch_id', e->>'lease_token',
                                    e->'live_output', p_what, false);
  END LOOP;
END $$;
COMMENT ON FUNCTION awp._write_live_output(jsonb, text) IS 'The live output of several completions (complete_and_claim_many), each fenced per write, in run_id order; AWREQ (with the caller''s message) when malformed.';

-- awp._write_group_output(runs, keys, attempts, dispatch_ids, live_outputs, now): the live output of the items the
-- group path settles (awp._complete_and_refill_group), written after its MERGE completed their leases: two writes
-- for the whole group and a read per item instead of a call per write (docs/progress.md, Cost on the hot path).
-- Per item (arrays in the group's item order; live_outputs[i] NULL or '[]' when it carries none) at most one write,
-- of lines and chunks only ({"logs"?, "chunks"?, "offset"?}): the common form, a task's last lines riding on its
-- completion.
-- Its fencing is the group path's: session, lease held, leased, current (deadline, expiry, attempt) and the run
-- running without a cancellation request, checked before and in the MERGE. Stored only when awp._write_progress
-- would store it by its one-statement write: the attempt has no counters row (awp.task_progress), the offset is what
-- its rows hold (or none is given), and each kind stays within 1 KiB. Anything else (another form, a repeat, a
-- malformed write) raises AWGRP: the group is rolled back and its items go one by one, where
-- awp._write_live_output writes (or refuses) each write exactly.
-- Numbers: the runs' counters in run_id order in one statement (one per run, for all its items at once), given to
-- the items in order (each item's lines, then its chunks); then each attempt read by key after those locks (a
-- concurrent write of the same attempt queued there is seen), then the rows in one statement.
-- Locks: the runs' awp.run_outputs rows in run_id order. The caller holds the runs' advisory locks (a completion
-- takes the run's advisory lock before its run's counter row: every completion path does, so no cycle).
CREATE OR REPLACE FUNCTION awp._write_group_output(p_runs text[], p_keys text[], p_atts integer[], p_dids text[],
                                                   p_live jsonb[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  w       jsonb;
  v_nl    integer;
  v_nc    integer;
  v_j     integer;
  i_k     integer[] := '{}';   -- per write: its item, its entries
  i_n     integer[] := '{}';
  i_first bigint[] := '{}';
  i_off   bigint[] := '{}';
  i_lb    bigint[] := '{}';    --   the bytes of lines and of chunks its attempt has
  i_cb    bigint[] := '{}';
  r_i     integer[] := '{}';   -- per row (a write's lines, its chunks): its write, kind, last number, entries
  r_kind  text[] := '{}';
  r_seq   bigint[] := '{}';
  r_j     jsonb[] := '{}';
  v_run   text;
  v_key   text;
  v_att   integer;
  v_did   text;
  v_have  bigint;
  v_lb    bigint;
  v_cb    bigint;
  v_row   boolean;
  c_runs  text[];
  c_next  bigint[];
  v_seqscan text := current_setting('enable_seqscan');
BEGIN
  FOR v_k IN 1 .. cardinality(p_live) LOOP   -- the checks as expressions (no query per write)
    CONTINUE WHEN p_live[v_k] IS NULL OR p_live[v_k] = '[]'::jsonb;
    w := CASE WHEN jsonb_typeof(p_live[v_k]) = 'array' AND jsonb_array_length(p_live[v_k]) = 1 THEN p_live[v_k]->0 END;
    IF w IS NULL OR jsonb_typeof(w) <> 'object' OR w - '{logs,chunks,offset}'::text[] <> '{}'::jsonb
       OR jsonb_typeof(coalesce(w->'logs', '[]')) <> 'array' OR jsonb_typeof(coalesce(w->'chunks', '[]')) <> 'array'
       OR coalesce(w->>'offset', '0') !~ '^[0-9]{1,18}$' THEN   -- (lines and chunks strings: checked as stored)
      PERFORM awp._raise_group_not_applicable('a live_output not of the common form');
    END IF;
    v_nl := jsonb_array_length(coalesce(w->'logs', '[]'));
    v_nc := jsonb_array_length(coalesce(w->'chunks', '[]'));
    IF v_nl + v_nc NOT BETWEEN 1 AND awp._limit_progress_entries() THEN
      PERFORM awp._raise_group_not_applicable('a live_output not of the common form');
    END IF;
    i_k := i_k || v_k;
    i_n := i_n || (v_nl + v_nc);
    i_off := i_off || (w->>'offset')::bigint;
    IF v_nl > 0 THEN
      r_i := r_i || cardinality(i_k);
      r_kind := r_kind || 'log'::text;
      r_seq := r_seq || v_nl::bigint;   -- relative to the write's first number, made absolute below
      r_j := r_j || (w->'logs');
    END IF;
    IF v_nc > 0 THEN
      r_i := r_i || cardinality(i_k);
      r_kind := r_kind || 'chunk'::text;
      r_seq := r_seq || (v_nl + v_nc)::bigint;
      r_j := r_j || (w->'chunks');
    END IF;
  END LOOP;
  IF cardinality(i_k) = 0 THEN
    RETURN;
  END IF;
  PERFORM set_config('enable_seqscan', 'off', true);   -- the counters and the attempts' rows read by key
  WITH c AS (
    INSERT INTO awp.run_outputs AS o (run_id, last_seq)
    SELECT p_runs[u.k], sum(u.n) FROM unnest(i_k, i_n) AS u(k, n) GROUP BY 1 ORDER BY 1
    ON CONFLICT (run_id) DO UPDATE SET last_seq = o.last_seq + excluded.last_seq
    RETURNING o.run_id, o.last_seq)
  SELECT array_agg(c.run_id), array_agg(c.last_seq) INTO c_runs, c_next FROM c;
  FOR v_k IN REVERSE cardinality(i_k) .. 1 LOOP   -- each run's numbers to its items in order, from its last
    v_j := array_position(c_runs, p_runs[i_k[v_k]]);
    i_first := (c_next[v_j] - i_n[v_k] + 1) || i_first;
    c_next[v_j] := c_next[v_j] - i_n[v_k];
  END LOOP;
  FOR v_k IN 1 .. cardinality(r_i) LOOP
    r_seq[v_k] := i_first[r_i[v_k]] + r_seq[v_k] - 1;
  END LOOP;
  -- What each attempt has, read after the counters' locks, by key (one pruned read per write): none of its rows or
  -- exactly its offset's worth, no counters row, and within 1 KiB of each kind with the write.
  FOR v_k IN 1 .. cardinality(i_k) LOOP
    v_run := p_runs[i_k[v_k]];
    v_key := p_keys[i_k[v_k]];
    v_att := p_atts[i_k[v_k]];
    v_did := p_dids[i_k[v_k]];
    SELECT coalesce(sum(cardinality(o.entries)), 0), coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'log'), 0),
           coalesce(sum(o.bytes) FILTER (WHERE o.kind = 'chunk'), 0),
           EXISTS (SELECT 1 FROM awp.task_progress t WHERE t.dispatch_id = v_did)
      INTO v_have, v_lb, v_cb, v_row
      FROM awp.task_output o
     WHERE o.run_id = v_run AND o.task_key = v_key AND o.attempt = v_att;
    IF v_row OR v_have <> coalesce(i_off[v_k], v_have) THEN
      PERFORM awp._raise_group_not_applicable('a live_output the group path does not write');
    END IF;
    i_lb := i_lb || v_lb;
    i_cb := i_cb || v_cb;
  END LOOP;
  INSERT INTO awp.task_output (run_id, seq, first_seq, task_key, attempt, kind, entries, bytes, created_at)
  SELECT p_runs[i_k[u.i]], u.seq, u.seq - cardinality(e.t) + 1, p_keys[i_k[u.i]], p_atts[i_k[u.i]], u.kind, e.t,
         e.bytes, p_now
    FROM unnest(r_i, r_kind, r_seq, r_j) AS u(i, kind, seq, j)
   CROSS JOIN LATERAL (SELECT x.t, coalesce(octet_length(array_to_string(x.t, '')), 0) AS bytes
                         FROM (SELECT ARRAY(SELECT jsonb_array_elements_text(u.j)) AS t) x) e
   WHERE to_jsonb(e.t) = u.j   -- strings only
     AND e.bytes + CASE u.kind WHEN 'log' THEN i_lb[u.i] ELSE i_cb[u.i] END <= 1024;
  GET DIAGNOSTICS v_j = ROW_COUNT;
  PERFORM set_config('enable_seqscan', v_seqscan, true);
  IF v_j <> cardinality(r_i) THEN   -- a line or chunk not a string, or over 1 KiB: the items one by one
    PERFORM awp._raise_group_not_applicable('a live_output the group path does not write');
  END IF;
END $$;
COMMENT ON FUNCTION awp._write_group_output(text[], text[], integer[], text[], jsonb[], timestamptz) IS 'The common live output of the group path''s items (lines and chunks, no counters row needed), numbered and stored by two writes for the group; AWGRP otherwise.';

-- awp.task_logs(run_id, task_key, attempt, after_seq, limit): the log lines and output chunks one attempt kept (the
-- task's latest attempt when attempt is NULL), after the run sequence number after_seq, oldest first, at most limit
-- (1 to awp._limit_page_rows(), default that). Returns {"run_id", "task_key", "attempt", "task_status", "progress",
-- "progress_at", "truncated" (entries were dropped: the oldest first), "logs_dropped", "chunks_dropped", "items":
-- [{"seq", "kind": "log"|"chunk", "text", "at"}], "logs" and "chunks" (the texts of the items of each kind, in order),
-- "next_after" (pass it as after_seq to read on), "more"}. AWNTF for
-- an unknown run or task; AWREQ for a bad attempt, after_seq or limit. Locks: none.
CREATE OR REPLACE FUNCTION awp.task_logs(p_run_id text, p_task_key text, p_attempt integer DEFAULT NULL,
                                         p_after_seq bigint DEFAULT 0, p_limit integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  t         awp.tasks;
  p         awp.task_progress;
  v_attempt integer;
  v_limit   integer := coalesce(p_limit, awp._limit_page_rows());
  v_items   jsonb;
BEGIN
  PERFORM awp._check_page(p_limit);
  SELECT * INTO t FROM awp.tasks x WHERE x.run_id = p_run_id AND x.task_key = p_task_key;
  IF NOT FOUND THEN
    PERFORM awp._require_run(p_run_id);
    PERFORM awp._raise_not_found('task not found', format('run %s has no task %s', p_run_id, p_task_key));
  END IF;
  IF p_attempt IS NOT NULL AND p_attempt < 1 OR p_after_seq < 0 THEN
    PERFORM awp._raise_invalid_request('invalid attempt or after', 'attempt must be 1 or more and after 0 or more');
  END IF;
  v_attempt := coalesce(p_attempt, t.attempts);
  SELECT * INTO p FROM awp.task_progress x
   WHERE x.run_id = p_run_id AND x.task_key = p_task_key AND x.attempt = v_attempt;
  SELECT coalesce(jsonb_agg(jsonb_build_object('seq', e.seq, 'kind', e.kind, 'text', e.t, 'at', e.created_at)
                            ORDER BY e.seq), '[]'::jsonb)
    INTO v_items
    FROM (SELECT o.first_seq + u.i - 1 AS seq, o.kind, u.t, o.created_at
            FROM (SELECT * FROM awp.task_output x   -- each row has an entry at least: limit rows hold limit entries
                   WHERE x.run_id = p_run_id AND x.task_key = p_task_key AND x.attempt = v_attempt
                     AND x.seq > coalesce(p_after_seq, 0)
                   ORDER BY x.seq LIMIT v_limit) o
            CROSS JOIN LATERAL unnest(o.entries) WITH ORDINALITY AS u(t, i)
           WHERE o.first_seq + u.i - 1 > coalesce(p_after_seq, 0)
           ORDER BY 1 LIMIT v_limit) e;
  RETURN jsonb_build_object(
    'run_id', p_run_id, 'task_key', p_task_key, 'attempt', nullif(v_attempt, 0), 'task_status', t.status,
    'progress', p.progress, 'progress_at', p.progress_at,
    'truncated', coalesce(p.logs_dropped + p.chunks_dropped > 0, false),
    'logs_dropped', coalesce(p.logs_dropped, 0), 'chunks_dropped', coalesce(p.chunks_dropped, 0),
    'items', v_items,
    'logs', coalesce((SELECT jsonb_agg(i->'text') FROM jsonb_array_elements(v_items) i WHERE i->>'kind' = 'log'), '[]'),
    'chunks', coalesce((SELECT jsonb_agg(i->'text') FROM jsonb_array_elements(v_items) i WHERE i->>'kind' = 'chunk'), '[]'),
    'next_after', coalesce((v_items->-1->>'seq')::bigint, coalesce(p_after_seq, 0)),
    'more', jsonb_array_length(v_items) = v_limit);
END $$;
COMMENT ON FUNCTION awp.task_logs(text, text, integer, bigint, integer) IS 'The log lines and output chunks an attempt kept, after a sequence number, with its latest progress and whether it was truncated; AWNTF when unknown.';

-- awp.run_stream(run_id, after_event, after_output, limit): what GET /runs/{id}/stream sends next, in one call:
-- {"status": the run's status, "events": [the run's events after the sequence after_event, each {"sequence",
-- "entity_type", "entity_key", "from_status", "to_status", "reason", "at"}], "outputs": [log lines, chunks and
-- progress values after the run sequence number after_output, each {"seq", "kind": "log"|"chunk"|"progress",
-- "task_key", "attempt", "value", "at"}; a progress value appears once, at the sequence number of its latest
-- write]}, each list in order and at most limit long (1 to awp._limit_page_rows(), default that). AWNTF for an
-- unknown run. Locks: none.
CREATE OR REPLACE FUNCTION awp.run_stream(p_run_id text, p_after_event bigint DEFAULT 0, p_after_output bigint DEFAULT 0,
                                          p_limit integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_status  text;
  v_limit   integer := coalesce(p_limit, awp._limit_page_rows());
  v_events  jsonb;
  v_outputs jsonb;
BEGIN
  PERFORM awp._check_page(p_limit);
  SELECT r.status INTO v_status FROM awp.runs r WHERE r.run_id = p_run_id;
  IF NOT FOUND THEN
    PERFORM awp._raise_not_found('run not found', format('no run %s', p_run_id));
  END IF;
  SELECT coalesce(jsonb_agg(jsonb_build_object('sequence', e.sequence, 'entity_type', e.entity_type,
                                               'entity_key', e.entity_key, 'from_status', e.from_status,
                                               'to_status', e.to_status, 'reason', e.reason, 'at', e.occurred_at)
                            ORDER BY e.sequence), '[]'::jsonb)
    INTO v_events
    FROM (SELECT * FROM awp.events x WHERE x.run_id = p_run_id AND x.sequence > coalesce(p_after_event, 0)
           ORDER BY x.sequence LIMIT v_limit) e;
  SELECT coalesce(jsonb_agg(jsonb_build_object('seq', o.seq, 'kind', o.kind, 'task_key', o.task_key,
                                               'attempt', o.attempt, 'value', o.value, 'at', o.at)
                            ORDER BY o.seq), '[]'::jsonb)
    INTO v_outputs
    FROM (SELECT x.* FROM (
            SELECT t.first_seq + u.i - 1 AS seq, t.kind, t.task_key, t.attempt, to_jsonb(u.e) AS value,
                   t.created_at AS at
              FROM (SELECT * FROM awp.task_output y WHERE y.run_id = p_run_id AND y.seq > coalesce(p_after_output, 0)
                     ORDER BY y.seq LIMIT v_limit) t
             CROSS JOIN LATERAL unnest(t.entries) WITH ORDINALITY AS u(e, i)
             WHERE t.first_seq + u.i - 1 > coalesce(p_after_output, 0)
            UNION ALL
            SELECT g.progress_seq, 'progress', g.task_key, g.attempt, g.progress, g.progress_at
              FROM awp.task_progress g WHERE g.run_id = p_run_id AND g.progress_seq > coalesce(p_after_output, 0)) x
           ORDER BY x.seq LIMIT v_limit) o;
  RETURN jsonb_build_object('status', v_status, 'events', v_events, 'outputs', v_outputs);
END $$;
COMMENT ON FUNCTION awp.run_stream(text, bigint, bigint, integer) IS 'A run''s status, events and task outputs (log lines, chunks, progress) after two cursors, for its event stream; AWNTF when unknown.';
