-- The coordinator's work (docs/protocol.md, rule 12), one function per step plus awp.coordinator_tick(), one
-- full pass. The gateway's one active coordinator (db/functions/leadership.sql) runs the tick with its
-- term; every step is also safe to call by hand from psql.
-- Locks: the coordinator_leader row (a pass with a term), then the settings row, then worker rows
-- (offline marking, before any run lock), then due schedule rows (firing
-- schedules, db/functions/schedules.sql), then per run: Run, then its Dispatches, then its
-- Task rows. Runs busy in another transaction are skipped (SKIP LOCKED) and picked up by
-- the next pass.

-- awp.mark_offline_workers(): active/draining workers silent for offline_after_heartbeats
-- heartbeat intervals become offline. Silence counts only since the current coordinator took
-- over (settings.coordinator_since), so a restarted or failed-over coordinator gives every worker
-- a full window. Returns the number of workers marked.
CREATE OR REPLACE FUNCTION awp.mark_offline_workers() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  s        awp.settings := awp._settings();
  v_now    timestamptz := awp._now();
  v_cutoff timestamptz;
  v_n      integer;
BEGIN
  v_cutoff := v_now - make_interval(secs => s.heartbeat_interval_ms * s.offline_after_heartbeats / 1000.0);
  -- After a takeover, silence counts from coordinator_since (as if every worker had heartbeated then),
  -- with the same rule as below: offline only once it exceeds the window (>=, like last_heartbeat_at <).
  IF s.coordinator_since IS NOT NULL AND s.coordinator_since >= v_cutoff THEN
    RETURN 0;
  END IF;
  UPDATE awp.workers w SET status = 'offline', offline_at = v_now
   WHERE w.status IN ('active', 'draining') AND w.last_heartbeat_at < v_cutoff;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.mark_offline_workers() IS 'Marks silent workers offline (after a full window since the coordinator took over); returns the count.';

-- awp._pass_skip(step, run, sqlstate, message): a run whose step failed in a pass run run by run (awp.coordinator_tick
-- after its pass failed): a WARNING that the gateway's coordinator logs (the run is left as it was, retried by the
-- next pass); returns false (nothing done for it). Locks: none.
CREATE OR REPLACE FUNCTION awp._pass_skip(p_step text, p_run_id text, p_sqlstate text, p_message text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RAISE WARNING 'coordinator pass: run % skipped in %: % (SQLSTATE %)', p_run_id, p_step, p_message, p_sqlstate;
  RETURN false;
END $$;
COMMENT ON FUNCTION awp._pass_skip(text, text, text, text) IS 'Reports a run whose coordinator step failed (WARNING); returns false.';

-- awp.converge_cancellations(): converges every run whose cancellation was requested and that is
-- not terminal yet. Returns the number of runs canceled.
CREATE OR REPLACE FUNCTION awp.converge_cancellations() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN awp._converge_cancellations(false);
END $$;
COMMENT ON FUNCTION awp.converge_cancellations() IS 'Converges requested cancellations (dispatches, attempts, tasks, run canceled); returns the number of runs.';

-- awp._converge_cancellations(isolate): awp.converge_cancellations; with isolate, each run in a subtransaction of
-- its own (awp._pass_skip: a run whose step fails is left as it was, the others go on).
CREATE OR REPLACE FUNCTION awp._converge_cancellations(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run text;
  v_ok  boolean;
  v_n   integer := 0;
BEGIN
  FOR v_run IN
    SELECT r.run_id FROM awp.runs r
     WHERE r.cancel_requested_at IS NOT NULL AND r.status IN ('pending', 'running')
     ORDER BY r.cancel_requested_at
       FOR UPDATE SKIP LOCKED
  LOOP
    IF NOT p_isolate THEN
      v_ok := awp._converge_cancel(v_run);
    ELSE
      BEGIN
        v_ok := awp._converge_cancel(v_run);
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        v_ok := awp._pass_skip('cancel convergence', v_run, SQLSTATE, SQLERRM);
      END;
    END IF;
    v_n := v_n + coalesce(v_ok, false)::integer;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._converge_cancellations(boolean) IS 'awp.converge_cancellations, optionally one subtransaction per run.';

-- awp.reap_expired_leases(): settles leases that are no longer valid: the attempt deadline passed
-- -> attempt timed_out (also when the lease expired too); the lease expired or its worker is
-- offline -> attempt interrupted. Both consume the attempt and follow the retry rule; the dispatch
-- becomes expired. Lease recovery (docs/protocol.md): a lease its worker's heartbeat released as never
-- received (uncounted = not_received) ends as attempt not_received, and one that lived through an outage
-- (uncounted = outage) as above; neither counts against max_attempts (their retry is due at once).
-- Candidates are taken with SKIP LOCKED and re-checked under the lock against a
-- fresh clock (a lease renewed meanwhile is left alone). Returns the number reaped.
CREATE OR REPLACE FUNCTION awp.reap_expired_leases() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN awp._reap_expired_leases(false);
END $$;
COMMENT ON FUNCTION awp.reap_expired_leases() IS 'Expires invalid leases (attempt interrupted, timed_out or not_received, then retry or fail); returns the count.';

-- awp._reap_expired_leases(isolate): awp.reap_expired_leases; with isolate, each lease in a subtransaction of its
-- own (awp._pass_skip).
CREATE OR REPLACE FUNCTION awp._reap_expired_leases(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c    record;
  v_ok boolean;
  v_n  integer := 0;
BEGIN
  FOR c IN
    SELECT x.dispatch_id, x.run_id FROM awp.dispatches x
      JOIN awp.runs r ON r.run_id = x.run_id
      JOIN awp.workers w ON w.worker_id = x.worker_id
     WHERE x.status = 'leased' AND r.cancel_requested_at IS NULL
       AND (x.lease_expires_at <= awp._now() OR x.attempt_deadline <= awp._now()
            OR w.status IN ('offline', 'stopped'))
     ORDER BY x.lease_expires_at
     LIMIT 1000
       FOR UPDATE OF r, x SKIP LOCKED
  LOOP
    IF NOT p_isolate THEN
      v_ok := awp._reap_one(c.dispatch_id);
    ELSE
      BEGIN
        v_ok := awp._reap_one(c.dispatch_id);
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        v_ok := awp._pass_skip('reaping', c.run_id, SQLSTATE, SQLERRM);
      END;
    END IF;
    v_n := v_n + coalesce(v_ok, false)::integer;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._reap_expired_leases(boolean) IS 'awp.reap_expired_leases, optionally one subtransaction per lease.';

-- awp._reap_one(dispatch): settles one lease that awp._reap_expired_leases found invalid and locked (with its run),
-- re-checked against a fresh clock; false when it was renewed or settled meanwhile.
CREATE OR REPLACE FUNCTION awp._reap_one(p_dispatch_id text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  d      awp.dispatches;
  v_now  timestamptz;
  v_dead boolean;
  v_to   text;
BEGIN
  SELECT * INTO d FROM awp.dispatches x WHERE x.dispatch_id = p_dispatch_id;
  SELECT w.status IN ('offline', 'stopped') INTO v_dead FROM awp.workers w WHERE w.worker_id = d.worker_id;
  v_now := awp._now();
  IF d.status <> 'leased' THEN
    RETURN false;
  ELSIF v_now >= d.attempt_deadline THEN
    v_to := 'timed_out';
  ELSIF v_now >= d.lease_expires_at OR v_dead THEN
    v_to := 'interrupted';
  ELSE
    RETURN false;   -- renewed after the candidate was read
  END IF;
  IF d.uncounted = 'not_received' THEN
    v_to := 'not_received';
  END IF;
  PERFORM awp._append_event(d.run_id, 'dispatch', d.dispatch_id, 'leased', 'expired',
                            CASE v_to WHEN 'timed_out' THEN 'attempt deadline passed'
                                      WHEN 'not_received' THEN 'not received by its worker'
                                      ELSE CASE WHEN v_dead THEN 'worker offline' ELSE 'lease expired' END END
                            || CASE WHEN d.uncounted = 'outage' THEN ' after an outage' ELSE '' END);
  PERFORM awp._end_attempt(d.run_id, d.task_key, d.attempt, v_to, true, NULL,
                           CASE v_to WHEN 'timed_out' THEN 'attempt_timeout' WHEN 'not_received' THEN 'not_received'
                                     ELSE 'lease_expired' END,
                           CASE v_to WHEN 'timed_out' THEN 'the attempt deadline passed'
                                     WHEN 'not_received' THEN 'its worker never received the lease (the claim answer was lost)'
                                     ELSE 'the lease expired before the attempt completed' END,
                           CASE v_to WHEN 'timed_out' THEN 'attempt deadline passed'
                                     WHEN 'not_received' THEN 'not received by its worker' ELSE 'lease expired' END
                           || CASE WHEN d.uncounted = 'outage' THEN ' after an outage' ELSE '' END,
                           d.uncounted IS NULL, 'expired', NULL);   -- the dispatch expires with its attempt
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._reap_one(text) IS 'Settles one invalid lease (attempt interrupted, timed_out or not_received); false when renewed meanwhile.';

-- awp._resume_leases(last_pass): after an outage (docs/protocol.md, Lease recovery), every lease that was
-- live at the last coordinator pass (lease_expires_at > last_pass: no reaper has seen it end) gets one full
-- lease duration from now (capped at its attempt deadline), as if its holder had renewed it, and is marked
-- uncounted = outage: if it still ends without a result its attempt does not count against max_attempts.
-- A lease its worker reported dropped ends now instead (its worker is not coming back for it); one released
-- as not received keeps that. Returns the number of leases resumed.
-- Locks: the dispatches, first those nobody holds (SKIP LOCKED); then each one another transaction held at that
-- moment and that is still unmarked, in dispatch_id order, waited for at most 500 ms (awp._resume_rows; one marked
-- by an earlier outage keeps its lease as it is). That holder is, as the database
-- comes back, most often a heartbeat renewing or dropping the lease: skipped, the lease was left unmarked, its
-- worker's report of it as dropped then kept it to its expiry, and its attempt counted (a run with max_attempts 1
-- failed for the outage: python/tests/faults/test_outages.py on a busy machine, 2 runs in 13;
-- python/tests/sql/test_resume_leases.py). A lease still held after that wait is left as before: its holder is
-- completing it, or the wait would be part of a deadlock (a completion of several leases that waits for one this
-- pass holds), which the wait's end breaks before PostgreSQL's deadlock_timeout (1 s) would cancel the other side.
CREATE OR REPLACE FUNCTION awp._resume_leases(p_last_pass timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_free text[];
  v_id   text;
  v_n    integer;
BEGIN
  SELECT coalesce(array_agg(l.dispatch_id), '{}') INTO v_free
    FROM (SELECT d.dispatch_id FROM awp.dispatches d
           WHERE d.status = 'leased' AND d.lease_expires_at > p_last_pass
             AND d.uncounted IS DISTINCT FROM 'not_received'
           ORDER BY d.dispatch_id
             FOR UPDATE SKIP LOCKED) l;
  v_n := awp._resume_rows(v_free, p_last_pass);
  FOR v_id IN   -- the ones still unmarked (a lease resumed above is marked: this transaction sees its own writes)
    SELECT d.dispatch_id FROM awp.dispatches d
     WHERE d.status = 'leased' AND d.lease_expires_at > p_last_pass
       AND d.uncounted IS NULL
     ORDER BY d.dispatch_id
  LOOP
    BEGIN
      v_n := v_n + awp._resume_rows(ARRAY[v_id], p_last_pass);
    EXCEPTION WHEN lock_not_available THEN
      NULL;   -- still held after the wait: left as it is (see above)
    END;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._resume_leases(timestamptz) IS 'After an outage: gives every lease live at the last pass a full lease from now and marks it uncounted = outage; returns the count.';

-- awp._resume_rows(dispatch_ids, last_pass): awp._resume_leases's write of the listed leases that are still live
-- since last_pass; returns how many. Locks: the listed dispatches, each waited for at most lock_timeout (500 ms).
CREATE OR REPLACE FUNCTION awp._resume_rows(p_ids text[], p_last_pass timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET lock_timeout = '500ms' AS $$
DECLARE
  s     awp.settings := awp._settings();
  v_now timestamptz := awp._now();
  v_n   integer;
BEGIN
  UPDATE awp.dispatches d
     SET uncounted = 'outage',
         lease_expires_at = CASE WHEN d.dropped_at IS NOT NULL THEN least(d.lease_expires_at, v_now)
                                 ELSE greatest(d.lease_expires_at,
                                               least(v_now + make_interval(secs => s.lease_duration_ms / 1000.0),
                                                     d.attempt_deadline)) END
   WHERE d.dispatch_id = ANY (p_ids)
     AND d.status = 'leased' AND d.lease_expires_at > p_last_pass
     AND d.uncounted IS DISTINCT FROM 'not_received';
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._resume_rows(text[], timestamptz) IS 'After an outage: resumes the listed leases still live since the last pass (awp._resume_leases); returns the count.';

-- awp.promote_retries(): waiting_retry tasks whose ready_at has come become ready.
-- Returns the number promoted.
CREATE OR REPLACE FUNCTION awp.promote_retries() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN awp._promote_retries(false);
END $$;
COMMENT ON FUNCTION awp.promote_retries() IS 'Makes due waiting_retry tasks ready; returns the count.';

-- awp.next_due_ms(): milliseconds from now until the earliest time-driven change a coordinator pass makes: a
-- waiting_retry task's ready_at (awp.promote_retries) or a running signal or sleep task's wait_until
-- (awp._settle_waits), or the time the oldest start in a rate limit's window leaves it, for a limit a ready task
-- holds (docs/limits.md: its next start may be dispatched then); 0 when one is due already, NULL when none waits. The coordinator sleeps until then when that
-- is sooner than its interval, so a retry becomes ready (and is dispatched) close to its due time instead of at the
-- next regular pass (AWP issue 41: with the default 500 ms interval a 200 ms retry started up to 0.7 s late). Two
-- index probes (tasks_retry_due_idx, tasks_wait_until_idx) and a scan of the ready tasks with limits. Locks: none.
CREATE OR REPLACE FUNCTION awp.next_due_ms() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
  SELECT CASE WHEN x.due IS NOT NULL THEN awp._ms(x.due - awp._now()) END   -- awp._ms: never below 0
    FROM (SELECT least((SELECT min(t.ready_at) FROM awp.tasks t WHERE t.status = 'waiting_retry'),
                       (SELECT min(t.wait_until) FROM awp.tasks t
                         WHERE t.status = 'running' AND t.wait_until IS NOT NULL),
                       -- the oldest start in the window of a rate limit a ready task holds leaves it then
                       (SELECT min(f.first + make_interval(secs => l.window_ms / 1000.0))
                          FROM (SELECT DISTINCT u.b FROM awp.tasks t CROSS JOIN LATERAL unnest(t.limit_buckets) AS u(b)
                                 WHERE t.status = 'ready' AND t.limit_buckets IS NOT NULL) rb
                          JOIN awp.limits l ON l.name = awp._bucket_limit(rb.b) AND l.window_ms IS NOT NULL
                         CROSS JOIN LATERAL (
                           SELECT min(s.started_at) AS first FROM awp.limit_starts s
                            WHERE s.bucket = rb.b
                              AND s.started_at > awp._now() - make_interval(secs => l.window_ms / 1000.0)) f)) AS due) x
$$;
COMMENT ON FUNCTION awp.next_due_ms() IS 'Milliseconds until the earliest retry or wait falls due, or a rate limit''s window frees a start (0: due now; NULL: none): when the coordinator''s next pass is needed.';

-- awp._promote_retries(isolate): awp.promote_retries; with isolate, each run in a subtransaction of its own
-- (awp._pass_skip).
CREATE OR REPLACE FUNCTION awp._promote_retries(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_run  text;
  v_now  timestamptz := awp._now();
  v_k    integer;
  v_n    integer := 0;
BEGIN
  FOR v_run IN
    SELECT r.run_id FROM awp.runs r
     WHERE r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
       AND r.run_id IN (SELECT t.run_id FROM awp.tasks t             -- tasks_retry_due_idx
                         WHERE t.status = 'waiting_retry' AND t.ready_at <= v_now)
       FOR UPDATE OF r SKIP LOCKED
  LOOP
    IF NOT p_isolate THEN
      v_k := awp._promote_run(v_run, v_now);
    ELSE
      BEGIN
        v_k := awp._promote_run(v_run, v_now);
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        v_k := awp._pass_skip('retry promotion', v_run, SQLSTATE, SQLERRM)::integer;
      END;
    END IF;
    v_n := v_n + v_k;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._promote_retries(boolean) IS 'awp.promote_retries, optionally one subtransaction per run.';

-- awp._promote_run(run, now): makes the run's due waiting_retry tasks ready (the caller holds the run's lock);
-- returns how many.
CREATE OR REPLACE FUNCTION awp._promote_run(p_run_id text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_keys text[];
BEGIN
  WITH u AS (
    UPDATE awp.tasks t SET status = 'ready', ready_at = NULL, updated_at = p_now
     WHERE t.run_id = p_run_id AND t.status = 'waiting_retry' AND t.ready_at <= p_now
    RETURNING t.task_key, t.ordinal
  )
  SELECT array_agg(u.task_key ORDER BY u.ordinal) INTO v_keys FROM u;
  PERFORM awp._append_events_alike(p_run_id, 'task', v_keys,
                                   array_fill('waiting_retry'::text, ARRAY[coalesce(cardinality(v_keys), 0)]),
                                   'ready', 'retry interval elapsed');
  IF EXISTS (SELECT 1 FROM awp.ready_queue q WHERE q.run_id = p_run_id AND q.executor_kind = ANY (awp._database_kinds())) THEN
    PERFORM awp._start_database_tasks(p_run_id);   -- a retry of a task run by the database: a new child, a new wait (docs/dynamic.md, docs/waits.md)
  END IF;
  RETURN coalesce(cardinality(v_keys), 0);
END $$;
COMMENT ON FUNCTION awp._promote_run(text, timestamptz) IS 'Makes a run''s due waiting_retry tasks ready; returns the count.';

-- awp.withdraw_orphan_dispatches(): a pending dispatch whose executor kind no active worker
-- supports, or whose action none of them runs (routing by action, db/functions/_routing.sql: looked at only while
-- some active worker lists its actions), is canceled and its task goes back to ready (no attempt, no retry spent).
-- Returns the number withdrawn.
CREATE OR REPLACE FUNCTION awp.withdraw_orphan_dispatches() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN awp._withdraw_orphan_dispatches(false);
END $$;
COMMENT ON FUNCTION awp.withdraw_orphan_dispatches() IS 'Withdraws pending dispatches no active worker can take (task back to ready); returns the count.';

-- awp._withdraw_orphan_dispatches(isolate): awp.withdraw_orphan_dispatches; with isolate, each dispatch in a
-- subtransaction of its own (awp._pass_skip).
CREATE OR REPLACE FUNCTION awp._withdraw_orphan_dispatches(p_isolate boolean) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  c     record;
  v_now timestamptz := awp._now();
  v_ok  boolean;
  v_n   integer := 0;
  v_lists boolean := EXISTS (SELECT 1 FROM awp.workers w WHERE w.status = 'active' AND w.actions IS NOT NULL);
BEGIN
  FOR c IN
    SELECT d.dispatch_id, d.run_id, d.task_key FROM awp.dispatches d
      JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.status = 'pending'
       AND (NOT EXISTS (SELECT 1 FROM awp.workers w
                         WHERE w.status = 'active' AND d.executor_kind = ANY (w.executor_kinds))
            OR (v_lists AND NOT awp._action_served(d.executor_kind, (SELECT t.action FROM awp.tasks t
                                                                       WHERE t.run_id = d.run_id AND t.task_key = d.task_key))))
     ORDER BY d.dispatch_id
       FOR UPDATE OF r, d SKIP LOCKED
  LOOP
    IF NOT p_isolate THEN
      v_ok := awp._withdraw_one(c.dispatch_id, c.run_id, c.task_key, v_now);
    ELSE
      BEGIN
        v_ok := awp._withdraw_one(c.dispatch_id, c.run_id, c.task_key, v_now);
        PERFORM awp._log_flush();
      EXCEPTION WHEN OTHERS THEN
        v_ok := awp._pass_skip('orphan withdrawal', c.run_id, SQLSTATE, SQLERRM);
      END;
    END IF;
    v_n := v_n + coalesce(v_ok, false)::integer;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._withdraw_orphan_dispatches(boolean) IS 'awp.withdraw_orphan_dispatches, optionally one subtransaction per dispatch.';

-- awp._withdraw_one(dispatch, run, task, now): cancels one pending dispatch (locked by the caller, with its run)
-- and puts its task back to ready. Returns true.
CREATE OR REPLACE FUNCTION awp._withdraw_one(p_dispatch_id text, p_run_id text, p_task_key text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE awp.dispatches d SET status = 'canceled', finished_at = p_now WHERE d.dispatch_id = p_dispatch_id;
  UPDATE awp.tasks t SET status = 'ready', updated_at = p_now
   WHERE t.run_id = p_run_id AND t.task_key = p_task_key AND t.status = 'queued';
  PERFORM awp._append_event(p_run_id, 'dispatch', p_dispatch_id, 'pending', 'canceled', 'no compatible active worker');
  PERFORM awp._append_event(p_run_id, 'task', p_task_key, 'queued', 'ready', 'no compatible active worker');
  RETURN true;
END $$;
COMMENT ON FUNCTION awp._withdraw_one(text, text, text, timestamptz) IS 'Withdraws one orphan pending dispatch (task back to ready).';

-- awp.create_dispatches(): turns ready tasks into pending dispatches under the three limits of
-- docs/protocol.md, rule 8 (run concurrency over queued + running; free capacity of compatible active
-- workers, less the dispatches already pending for them; the global dispatch_limit over
-- pending + leased) and the fairness rule 9: runs that never got a dispatch first, then the run
-- whose latest dispatch is oldest (awp._fairness_order); one task per run per round; rounds repeat while
-- they progress.
-- Returns the number of dispatches created. awp._create_dispatches() does the work without the
-- NOTIFY, for callers that notify once at their end (awp._notify_pending).
-- Locks: a transaction-level advisory lock serialises every transaction that adds to pending +
-- leased (coordinator passes, run starts) so two of them cannot both spend the last unit of a limit;
-- it is taken before the budget is read. Runs are then locked with SKIP LOCKED.
CREATE OR REPLACE FUNCTION awp._create_dispatches(p_isolate boolean DEFAULT false) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  b       record;
  v_kinds jsonb;
  v_left  integer;
  v_round integer;
  v_n     integer := 0;
  v_kind  text;
  v_run   text;
  c       refcursor;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('awp.create_dispatches'));
  b := awp._dispatch_budget();
  v_kinds := b.kinds;
  v_left := least(b.global_free, b.worker_free);
  -- Ready tasks with rate limits that have room first (as a refill takes them: awp._refill_slot).
  IF NOT p_isolate THEN
    SELECT l.kinds, l.created INTO v_kinds, v_n FROM awp._dispatch_limited(v_kinds, v_left) l;
  ELSE
    BEGIN
      SELECT l.kinds, l.created INTO v_kinds, v_n FROM awp._dispatch_limited(v_kinds, v_left) l;
      PERFORM awp._log_flush();
    EXCEPTION WHEN OTHERS THEN
      v_n := 0;
      v_kinds := b.kinds;
      PERFORM awp._pass_skip('dispatch creation (rate limits)', NULL, SQLSTATE, SQLERRM);
    END;
  END IF;
  v_left := v_left - v_n;
  LOOP
    v_round := 0;
    -- Only runs with a ready task of a kind that has room: a backlog of a kind without a free slot costs nothing.
    c := awp._fairness_order(awp._kinds_with_room(v_kinds));
    LOOP
      EXIT WHEN v_left <= 0;
      FETCH c INTO v_run;
      EXIT WHEN NOT FOUND;
      PERFORM 1 FROM awp.runs x WHERE x.run_id = v_run FOR UPDATE SKIP LOCKED;
      CONTINUE WHEN NOT FOUND;
      IF NOT p_isolate THEN
        v_kind := awp._dispatch_one(v_run, v_kinds);
      ELSE
        BEGIN
          v_kind := awp._dispatch_one(v_run, v_kinds);
          PERFORM awp._log_flush();
        EXCEPTION WHEN OTHERS THEN
          v_kind := NULL;
          PERFORM awp._pass_skip('dispatch creation', v_run, SQLSTATE, SQLERRM);
        END;
      END IF;
      CONTINUE WHEN v_kind IS NULL;
      v_kinds := jsonb_set(v_kinds, ARRAY[v_kind], to_jsonb((v_kinds->>v_kind)::integer - 1));
      v_left := v_left - 1;
      v_round := v_round + 1;
      v_n := v_n + 1;
    END LOOP;
    CLOSE c;
    EXIT WHEN v_round = 0 OR v_left <= 0;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._create_dispatches(boolean) IS 'Creates pending dispatches for ready tasks under the backpressure limits and the fairness rule, without NOTIFY; returns the count.';

CREATE OR REPLACE FUNCTION awp.create_dispatches() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_n integer := awp._create_dispatches();
BEGIN
  PERFORM awp._notify_pending();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.create_dispatches() IS 'Creates pending dispatches for ready tasks under the backpressure limits and the fairness rule; returns the count.';

-- awp.coordinator_tick(takeover, term, limits): one full coordinator pass: offline marking, schedule firing, cancel
-- convergence, reaping, retry promotion, orphan withdrawal, child runs (awp._settle_children: the tasks whose child
-- ended, the ones that waited for room; docs/dynamic.md), waits (awp._settle_waits: sleeps whose time came, signal
-- waits past their timeout; docs/waits.md), dispatch creation. A coordinator that has
-- just taken over (p_takeover, or no pass for a full offline window) restarts the offline clock.
-- An outage (docs/protocol.md, Lease recovery): a pass with p_takeover more than a heartbeat interval after
-- the previous one resumes, before reaping, the leases live at that previous pass (awp._resume_leases): lease
-- time does not run while no coordinator can work, and such a lease's attempt will not count if it is lost.
-- p_term: the active coordinator's term (awp.take_leadership). The pass is then fenced: AWLDR, before any
-- write, unless this session still leads with that term (db/functions/leadership.sql); it renews the
-- leadership (coordinator_leader.last_seen_at) at its end. Without a term (a DBA's pass from psql) there is
-- no such check and no renewal.
-- A run whose step fails does not stop the pass: the per-run steps are then run again one run at a time, the
-- failing run is skipped with a WARNING (awp._pass_skip), and the result has "isolated": true.
-- Returns {canceled, reaped, offline, promoted, withdrawn, dispatched, schedules_fired, resumed, children, waits} (counts),
-- and "limited": the limits that still hold ready tasks back after the pass (awp._limits_held(), e.g.
-- ["workers_full"]; [] when none), which the gateway counts for /metrics (docs/limits.md). p_limits false leaves
-- "limited" out: it visits every live run with a ready task (80 ms at 10,000 runs on this machine, against 4 ms for
-- the rest of an idle pass), so the gateway asks for it once every few seconds, not on every pass.
-- jit off: a pass's statements are short; with 10,000 live runs PostgreSQL's cost estimates passed jit_above_cost
-- and compiling took 600 of a pass's 700 ms.
-- Locks: the coordinator_leader row first when p_term is given, then as the steps above.
CREATE OR REPLACE FUNCTION awp.coordinator_tick(p_takeover boolean, p_term bigint, p_limits boolean)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET jit = off AS $$
DECLARE
  s       awp.settings;
  v_now   timestamptz := awp._now();
  v_off   integer;
  v_can   integer;
  v_reap  integer;
  v_prom  integer;
  v_wd    integer;
  v_disp  integer;
  v_kids  integer;
  v_waits integer;
  v_fired integer;
  v_resumed integer := 0;
  v_isolated boolean := false;
BEGIN
  IF p_term IS NOT NULL THEN
    PERFORM awp._check_leader(p_term, true);
  END IF;
  SELECT * INTO s FROM awp.settings FOR UPDATE;
  UPDATE awp.settings x
     SET last_tick_at = v_now,
         coordinator_since = CASE
           WHEN p_takeover OR x.last_tick_at IS NULL OR x.coordinator_since IS NULL
                OR x.last_tick_at < v_now - make_interval(secs => x.heartbeat_interval_ms * x.offline_after_heartbeats / 1000.0)
           THEN v_now ELSE x.coordinator_since END;
  v_off  := awp.mark_offline_workers();
  v_fired := awp.fire_schedules();   -- schedule rows before any run lock
  -- Before reaping, after the worker rows (lock order). A takeover's pass marks nobody offline.
  IF p_takeover AND s.last_tick_at < v_now - make_interval(secs => s.heartbeat_interval_ms / 1000.0) THEN
    v_resumed := awp._resume_leases(s.last_tick_at);
  END IF;
  -- One bad run must not stop everyone's dispatch: when the per-run steps fail, they are undone and run again
  -- with each run in a subtransaction of its own (awp._pass_skip reports and skips the failing ones). Only the
  -- failing pass pays for the subtransactions.
  BEGIN
    v_can  := awp._converge_cancellations(false);
    v_reap := awp._reap_expired_leases(false);
    v_prom := awp._promote_retries(false);
    v_wd   := awp._withdraw_orphan_dispatches(false);
    v_kids := awp._settle_children(false);
    v_waits := awp._settle_waits(false);
    v_disp := awp._create_dispatches(false);
  EXCEPTION WHEN OTHERS THEN
    RAISE WARNING 'coordinator pass failed: % (SQLSTATE %); running it again run by run', SQLERRM, SQLSTATE;
    v_isolated := true;
    v_can  := awp._converge_cancellations(true);
    v_reap := awp._reap_expired_leases(true);
    v_prom := awp._promote_retries(true);
    v_wd   := awp._withdraw_orphan_dispatches(true);
    v_kids := awp._settle_children(true);
    v_waits := awp._settle_waits(true);
    v_disp := awp._create_dispatches(true);
  END;
  PERFORM awp._prune_limit_starts(v_now);   -- the rate limits' starts no window counts any more
  PERFORM awp._notify_pending();
  IF p_term IS NOT NULL THEN   -- at the end: a long pass counts as alive until it commits
    UPDATE awp.coordinator_leader x SET last_seen_at = awp._now();
  END IF;
  RETURN jsonb_build_object('canceled', v_can, 'reaped', v_reap, 'offline', v_off,
                            'promoted', v_prom, 'withdrawn', v_wd, 'dispatched', v_disp,
                            'schedules_fired', v_fired, 'resumed', v_resumed, 'children', v_kids, 'waits', v_waits,
                            'limited', CASE WHEN p_limits THEN to_jsonb(awp._limits_held()) END)
         - CASE WHEN p_limits THEN '' ELSE 'limited' END
         || CASE WHEN v_isolated THEN '{"isolated": true}'::jsonb ELSE '{}' END;
END $$;
COMMENT ON FUNCTION awp.coordinator_tick(boolean, bigint, boolean) IS 'One full coordinator pass (fenced by the active coordinator''s term when given: AWLDR, nothing written, once it no longer leads); returns counts {canceled, reaped, offline, promoted, withdrawn, dispatched, schedules_fired, resumed, children, waits} and, unless p_limits is false, the limits still holding ready tasks (limited).';

-- awp.coordinator_tick(takeover, term): the pass with "limited" (p_limits true): a DBA's pass from psql, tests.
CREATE OR REPLACE FUNCTION awp.coordinator_tick(p_takeover boolean DEFAULT false, p_term bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN awp.coordinator_tick(p_takeover, p_term, true);
END $$;
COMMENT ON FUNCTION awp.coordinator_tick(boolean, bigint) IS 'One full coordinator pass (fenced by the active coordinator''s term when given: AWLDR, nothing written, once it no longer leads); returns counts {canceled, reaped, offline, promoted, withdrawn, dispatched, schedules_fired, resumed, children, waits} and the limits still holding ready tasks (limited).';
