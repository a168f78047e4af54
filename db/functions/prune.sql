-- Retention (docs/retention.md): delete what is older than a cutoff, in bounded batches.
--   runs              terminal (finished_at set) and finished before the cutoff, with no pending or leased
--                     dispatch: the run with its tasks, dispatches, attempts, events, progress, log lines and
--                     output chunks (awp.task_progress, awp.task_output, awp.run_outputs: docs/progress.md), and the
--                     idempotency record that started it. Pending and running runs are never touched.
--   workers           stopped or offline sessions that ended (stopped_at / offline_at) before the cutoff and
--                     that nothing references any more (no dispatch, no attempt: their runs were pruned
--                     first). Active and draining workers are never touched.
--   idempotency_keys  records created before the cutoff. A replay of such a key is a new request: for
--                     POST .../runs it still returns the same run while that run exists (runs keep their
--                     idempotency_key and start_run deduplicates on it), and starts a new run once the run
--                     was pruned; for POST /workflows it stores the definition again, which is a no-op when
--                     unchanged (the same version, 200).
-- Nothing else points at pruned rows: events have no foreign key (deleted by run id), a schedule's
-- last_run_id may name a pruned run (it answers 404 like any unknown id), runs.schedule_id is kept.
--
-- Locks, in this order, each batch in the caller's transaction: the transaction-level advisory lock
-- hashtext('awp.prune') (concurrent prunes run one after the other), then idempotency records and run
-- rows with FOR UPDATE SKIP LOCKED (a run that another transaction holds is left for the next batch),
-- then the run's dispatches, tasks, attempts, events and outputs (nobody else locks them once the run is
-- terminal), then worker rows with FOR UPDATE SKIP LOCKED. Nothing here ever waits for a worker or run
-- lock, so the project's order (settings, worker, schedule, run, dispatch, task) cannot deadlock
-- with it, and a batch holds its locks only for its own short duration.

-- awp._prune_batch(cutoff, max_runs, max_tasks, max_workers, max_keys): one bounded batch: at most
-- max_runs runs (and, past the first run, at most max_tasks of their tasks), max_workers workers and
-- max_keys idempotency records older than cutoff. Also folds the status count deltas
-- (awp._compact_status_counts). First, when a time range of history may go whole, drops its partitions instead and
-- returns (awp._drop_history_range: its counts are estimates; `partitions` 1, `range` its bounds). p_by_range: the
-- background's batch (awp.apply_retention), whose runs in a time range wait for its drop (see below).
-- Returns {runs, tasks, dispatches, attempts, events, workers, idempotency_keys, more, cutoff}, plus
-- {partitions: 1, range: [lower, upper]} after a drop; `more` is true when a limit was reached or a range was dropped
-- (call again).
CREATE OR REPLACE FUNCTION awp._prune_batch(p_cutoff timestamptz, p_max_runs integer DEFAULT 200,
                                            p_max_tasks integer DEFAULT 5000, p_max_workers integer DEFAULT 200,
                                            p_max_keys integer DEFAULT 2000, p_by_range boolean DEFAULT false)
RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cand    text[];
  v_found   integer;
  v_runs    text[];
  v_more    boolean;
  n_keys    integer;
  n_keys2   integer;
  n_att     integer := 0;
  n_disp    integer := 0;
  n_tasks   integer := 0;
  n_events  integer := 0;
  n_runs    integer := 0;
  n_workers integer;
  v_drop    jsonb;
  v_from    text;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('awp.prune'));

  -- A whole time range of history first, when all of it may go (db/functions/_partitions.sql): its counts are the
  -- batch's, and the batch ends there, so that the ACCESS EXCLUSIVE locks of the drop end with the caller's
  -- transaction right after it.
  v_drop := awp._drop_history_range(p_cutoff);
  IF v_drop IS NOT NULL THEN
    RETURN v_drop || jsonb_build_object('workers', 0, 'idempotency_keys', 0, 'more', true, 'cutoff', p_cutoff);
  END IF;

  -- Idempotency records older than the cutoff (every pruned run's record is among them: it was written
  -- in the transaction that created the run; the run step below deletes those of its runs anyway).
  WITH k AS (
    SELECT x.scope, x.idempotency_key FROM awp.idempotency_keys x
     WHERE x.created_at < p_cutoff
     ORDER BY x.created_at
     LIMIT p_max_keys
       FOR UPDATE SKIP LOCKED
  )
  DELETE FROM awp.idempotency_keys x USING k
   WHERE x.scope = k.scope AND x.idempotency_key = k.idempotency_key;
  GET DIAGNOSTICS n_keys = ROW_COUNT;
  v_more := n_keys >= p_max_keys;

  -- Runs: the oldest finished ones, cut at the task budget (runs_finished_idx). By range (the background), a run of a
  -- time range waits for its range to go whole (or every run would be deleted row by row the moment it passed the
  -- cutoff, before its range could be dropped) when that is at most D away, D = awp._partition_ms() (half the
  -- retention by default): the range ends less than D after the cutoff (it goes once the cutoff passes its end) and
  -- not more than D before it (then something pins it, a long run: its other runs go row by row). Runs outside the
  -- time ranges (_legacy, _default) and of a range that ends far after the cutoff (say, retention_ms was just
  -- lowered) go row by row at once.
  IF p_by_range THEN
    SELECT string_agg(format('SELECT * FROM awp.%I', x.p), ' UNION ALL ') INTO v_from
      FROM (SELECT c.relname AS p FROM pg_class c
             WHERE c.oid IN (to_regclass('awp.runs_legacy'), to_regclass('awp.runs_default'))
            UNION ALL
            SELECT 'runs_p' || h.suffix
              FROM awp.history_partitions h, (SELECT floor(extract(epoch FROM p_cutoff) * 1000)::bigint AS ms,
                                                     awp._partition_ms() AS d) k
             WHERE NOT (h.upper_ms > k.ms - k.d AND h.upper_ms <= k.ms + k.d)) x;
  ELSE
    v_from := 'SELECT * FROM awp.runs';
  END IF;
  EXECUTE format(
   'SELECT array_agg(b.run_id ORDER BY b.finished_at, b.run_id) FILTER (WHERE b.before < $2), count(*)
      FROM (SELECT c.run_id, c.finished_at,
                   sum(c.task_count) OVER (ORDER BY c.finished_at, c.run_id) - c.task_count AS before
              FROM (SELECT r.run_id, r.finished_at, v.task_count
                      FROM (%s) r
                      JOIN awp.workflow_versions v ON v.workflow_id = r.workflow_id AND v.version = r.workflow_version
                     WHERE r.finished_at < $1
                       AND NOT EXISTS (SELECT 1 FROM awp.dispatches d
                                        WHERE d.run_id = r.run_id AND d.status IN (''pending'', ''leased''))
                     ORDER BY r.finished_at, r.run_id
                     LIMIT $3) c) b', v_from)
    INTO v_cand, v_found USING p_cutoff, p_max_tasks, p_max_runs;
  v_more := v_more OR v_found >= p_max_runs OR cardinality(v_cand) < v_found;
  IF v_cand IS NOT NULL THEN
    SELECT array_agg(x.run_id) INTO v_runs
      FROM (SELECT r.run_id FROM awp.runs r
             WHERE r.run_id = ANY (v_cand) AND r.finished_at < p_cutoff
               AND r.status IN ('succeeded', 'failed', 'canceled')
               FOR UPDATE SKIP LOCKED) x;
  END IF;
  IF v_runs IS NOT NULL THEN
    WITH x AS (DELETE FROM awp.dispatches d WHERE d.run_id = ANY (v_runs) RETURNING d.attempt_status)
    SELECT count(*), count(x.attempt_status) INTO n_disp, n_att FROM x;   -- attempts: the leased dispatches
    DELETE FROM awp.tasks t WHERE t.run_id = ANY (v_runs);
    GET DIAGNOSTICS n_tasks = ROW_COUNT;
    DELETE FROM awp.events e WHERE e.run_id = ANY (v_runs);
    GET DIAGNOSTICS n_events = ROW_COUNT;
    DELETE FROM awp.task_output o WHERE o.run_id = ANY (v_runs);
    DELETE FROM awp.task_progress g WHERE g.run_id = ANY (v_runs);
    DELETE FROM awp.run_outputs o WHERE o.run_id = ANY (v_runs);
    DELETE FROM awp.idempotency_keys k USING awp.runs r
     WHERE r.run_id = ANY (v_runs) AND k.scope = 'runs' AND k.idempotency_key = r.idempotency_key
       AND k.response->>'run_id' = r.run_id;
    GET DIAGNOSTICS n_keys2 = ROW_COUNT;
    n_keys := n_keys + n_keys2;
    DELETE FROM awp.runs r WHERE r.run_id = ANY (v_runs);
    GET DIAGNOSTICS n_runs = ROW_COUNT;
  END IF;

  -- Workers that ended before the cutoff and that no dispatch (nor so its attempt) references any more
  -- (workers_ended_idx, dispatches_worker_idx).
  WITH w AS (
    SELECT x.worker_id FROM awp.workers x
     WHERE x.status IN ('stopped', 'offline') AND coalesce(x.stopped_at, x.offline_at) < p_cutoff
       AND NOT EXISTS (SELECT 1 FROM awp.dispatches d WHERE d.worker_id = x.worker_id)
     ORDER BY coalesce(x.stopped_at, x.offline_at)
     LIMIT p_max_workers
       FOR UPDATE SKIP LOCKED
  )
  DELETE FROM awp.workers x USING w WHERE x.worker_id = w.worker_id;
  GET DIAGNOSTICS n_workers = ROW_COUNT;
  v_more := v_more OR n_workers >= p_max_workers;

  PERFORM awp._compact_status_counts();
  RETURN jsonb_build_object('runs', n_runs, 'tasks', n_tasks, 'dispatches', n_disp, 'attempts', n_att,
                            'events', n_events, 'workers', n_workers, 'idempotency_keys', n_keys,
                            'more', v_more, 'cutoff', p_cutoff);
END $$;
COMMENT ON FUNCTION awp._prune_batch(timestamptz, integer, integer, integer, integer, boolean) IS 'One bounded prune batch (runs with their rows, workers, idempotency records older than a cutoff); returns counts and whether more is left.';

-- awp.prune(older_than): deletes what finished (runs), ended (workers) or was recorded (idempotency
-- records) more than older_than ago, by the rules at the top of this file, in batches of at most 500
-- runs / 20,000 of their tasks / 500 workers / 5,000 records, for at most about 2 seconds per call.
-- Returns {runs, tasks, dispatches, attempts, events, workers, idempotency_keys, batches, more, cutoff}:
-- the totals deleted (the rows of a time range of history dropped whole are PostgreSQL's estimates:
-- awp._drop_history_range; a call ends after such a drop, with `more` true); `more` true when the time budget
-- ended the call with work left (call it again: `awp prune` does). older_than NULL or negative: AWREQ. Safe on a live system at any time.
-- Locks: as awp._prune_batch, for the whole call (one transaction).
CREATE OR REPLACE FUNCTION awp.prune(older_than interval)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_cutoff  timestamptz;
  v_started timestamptz := clock_timestamp();
  v_keys    text[] := ARRAY['runs', 'tasks', 'dispatches', 'attempts', 'events', 'workers', 'idempotency_keys'];
  v_total   jsonb;
  b         jsonb;
  v_batches integer := 0;
  v_more    boolean := false;
BEGIN
  IF prune.older_than IS NULL OR prune.older_than < interval '0' THEN
    PERFORM awp._raise_invalid_request('invalid older_than', 'older_than must be an interval of 0 or more (e.g. ''7 days'')');
  END IF;
  v_cutoff := awp._now() - prune.older_than;
  SELECT jsonb_object_agg(k, 0) INTO v_total FROM unnest(v_keys) k;
  LOOP
    b := awp._prune_batch(v_cutoff, 500, 20000, 500, 5000);
    v_batches := v_batches + 1;
    SELECT jsonb_object_agg(k, (v_total->>k)::bigint + (b->>k)::bigint) INTO v_total FROM unnest(v_keys) k;
    v_more := (b->>'more')::boolean
              AND (b ? 'partitions' OR (SELECT bool_or((b->>k)::bigint > 0) FROM unnest(v_keys) k));
    -- After a dropped range at once: its locks end with this transaction (the next call goes on).
    EXIT WHEN NOT v_more OR b ? 'partitions' OR clock_timestamp() - v_started > interval '2 seconds';
  END LOOP;
  RETURN v_total || jsonb_build_object('batches', v_batches, 'more', v_more, 'cutoff', v_cutoff);
END $$;
COMMENT ON FUNCTION awp.prune(interval) IS 'Deletes finished runs (with tasks, dispatches, attempts, events), ended unreferenced workers and idempotency records older than older_than, in bounded batches; returns counts; AWREQ for a null or negative interval.';

-- awp.apply_retention(term): one bounded batch of awp.prune with older_than = settings.retention_ms (the
-- active coordinator calls it every few seconds, and again at once while `more`), at most 200 runs /
-- 5,000 of their tasks / 200 workers / 2,000 records (or one time range of history dropped whole). retention_ms 0
-- (keep forever) deletes nothing. Last it makes the history partitions that are due (awp.maintain_partitions).
-- By range: a run in a time range waits for its range to be dropped whole, when that is at most a range length
-- (awp._partition_ms()) away, else it goes row by row (see awp._prune_batch); awp.prune does not wait (what it
-- deletes is exactly what is older than its cutoff).
-- Either way it folds the status count deltas that /metrics reads. Returns the batch's counts plus
-- retention_ms. p_term: the active coordinator's term; AWLDR, before any write, once that term is over
-- (db/functions/leadership.sql). Without it (by hand) there is no such check.
-- Locks: the coordinator_leader row (FOR KEY SHARE, when p_term is given), then as awp._prune_batch and
-- awp.maintain_partitions.
CREATE OR REPLACE FUNCTION awp.apply_retention(p_term bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s       awp.settings := awp._settings();
  v_batch jsonb;
BEGIN
  IF p_term IS NOT NULL THEN
    PERFORM awp._check_leader(p_term, false);
  END IF;
  IF s.retention_ms = 0 THEN
    PERFORM awp.maintain_partitions();   -- the next time ranges of history, when due (db/functions/_partitions.sql)
    PERFORM awp._compact_status_counts();
    RETURN jsonb_build_object('runs', 0, 'tasks', 0, 'dispatches', 0, 'attempts', 0, 'events', 0, 'workers', 0,
                              'idempotency_keys', 0, 'more', false, 'cutoff', NULL, 'retention_ms', 0);
  END IF;
  v_batch := awp._prune_batch(awp._now() - make_interval(secs => s.retention_ms / 1000.0), p_by_range => true);
  -- The next time ranges of history, when due (db/functions/_partitions.sql): last, so that the locks it takes to
  -- add them are held only until this batch's transaction ends, right after.
  PERFORM awp.maintain_partitions();
  RETURN v_batch || jsonb_build_object('retention_ms', s.retention_ms);
END $$;
COMMENT ON FUNCTION awp.apply_retention(bigint) IS 'One bounded prune batch with the configured retention_ms (nothing when 0), fenced by the active coordinator''s term when given (AWLDR); returns its counts.';
