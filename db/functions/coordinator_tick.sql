-- The coordinator's work (docs/protocol.md, rule 12), one function per step plus awp.coordinator_tick(), one
-- full pass. The gateway runs the tick under an advisory lock so one coordinator is active per
-- database; every step is also safe to call by hand from psql.
-- Locks: worker rows first (offline marking, before any run lock), then due schedule rows (firing
-- schedules, db/functions/schedules.sql), then per run: Run, then its Dispatches, then its
-- Task/Attempt rows. Runs busy in another transaction are skipped (SKIP LOCKED) and picked up by
-- the next pass.

-- awp.mark_offline_workers(): active/draining workers silent for offline_after_heartbeats
-- heartbeat intervals become offline. Silence counts only since the current coordinator took
-- over (settings.coordinator_since), so a restarted or failed-over coordinator gives every worker
-- a full window. Returns the number of workers marked.
CREATE OR REPLACE FUNCTION awp.mark_offline_workers() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
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

-- awp.converge_cancellations(): converges every run whose cancellation was requested and that is
-- not terminal yet. Returns the number of runs canceled.
CREATE OR REPLACE FUNCTION awp.converge_cancellations() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  v_run text;
  v_n   integer := 0;
BEGIN
  FOR v_run IN
    SELECT r.run_id FROM awp.runs r
     WHERE r.cancel_requested_at IS NOT NULL AND r.status IN ('pending', 'running')
     ORDER BY r.cancel_requested_at
       FOR UPDATE SKIP LOCKED
  LOOP
    IF awp._converge_cancel(v_run) THEN
      v_n := v_n + 1;
    END IF;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.converge_cancellations() IS 'Converges requested cancellations (dispatches, attempts, tasks, run canceled); returns the number of runs.';

-- awp.reap_expired_leases(): settles leases that are no longer valid: the attempt deadline passed
-- -> attempt timed_out (also when the lease expired too); the lease expired or its worker is
-- offline -> attempt interrupted. Both consume the attempt and follow the retry rule; the dispatch
-- becomes expired. Candidates are taken with SKIP LOCKED and re-checked under the lock against a
-- fresh clock (a lease renewed meanwhile is left alone). Returns the number reaped.
CREATE OR REPLACE FUNCTION awp.reap_expired_leases() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  c      record;
  d      awp.dispatches;
  v_now  timestamptz;
  v_dead boolean;
  v_to   text;
  v_n    integer := 0;
BEGIN
  FOR c IN
    SELECT x.dispatch_id FROM awp.dispatches x
      JOIN awp.runs r ON r.run_id = x.run_id
      JOIN awp.workers w ON w.worker_id = x.worker_id
     WHERE x.status = 'leased' AND r.cancel_requested_at IS NULL
       AND (x.lease_expires_at <= awp._now() OR x.attempt_deadline <= awp._now()
            OR w.status IN ('offline', 'stopped'))
     ORDER BY x.lease_expires_at
     LIMIT 1000
       FOR UPDATE OF r, x SKIP LOCKED
  LOOP
    SELECT * INTO d FROM awp.dispatches x WHERE x.dispatch_id = c.dispatch_id;
    SELECT w.status IN ('offline', 'stopped') INTO v_dead FROM awp.workers w WHERE w.worker_id = d.worker_id;
    v_now := awp._now();
    IF d.status <> 'leased' THEN
      CONTINUE;
    ELSIF v_now >= d.attempt_deadline THEN
      v_to := 'timed_out';
    ELSIF v_now >= d.lease_expires_at OR v_dead THEN
      v_to := 'interrupted';
    ELSE
      CONTINUE;   -- renewed after the candidate was read
    END IF;
    UPDATE awp.dispatches x SET status = 'expired', finished_at = v_now WHERE x.dispatch_id = d.dispatch_id;
    PERFORM awp._log1(d.run_id, 'dispatch', d.dispatch_id, 'leased', 'expired',
                      CASE v_to WHEN 'timed_out' THEN 'attempt deadline passed'
                                ELSE CASE WHEN v_dead THEN 'worker offline' ELSE 'lease expired' END END);
    PERFORM awp._end_attempt(d.run_id, d.task_key, d.attempt, v_to, true, NULL,
                             CASE v_to WHEN 'timed_out' THEN 'attempt_timeout' ELSE 'lease_expired' END,
                             CASE v_to WHEN 'timed_out' THEN 'the attempt deadline passed'
                                       ELSE 'the lease expired before the attempt completed' END,
                             CASE v_to WHEN 'timed_out' THEN 'attempt deadline passed' ELSE 'lease expired' END);
    v_n := v_n + 1;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.reap_expired_leases() IS 'Expires invalid leases (attempt interrupted or timed_out, then retry or fail); returns the count.';

-- awp.promote_retries(): waiting_retry tasks whose ready_at has come become ready.
-- Returns the number promoted.
CREATE OR REPLACE FUNCTION awp.promote_retries() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  v_run  text;
  v_now  timestamptz := awp._now();
  v_keys text[];
  v_n    integer := 0;
BEGIN
  FOR v_run IN
    SELECT r.run_id FROM awp.runs r
     WHERE r.status IN ('pending', 'running') AND r.cancel_requested_at IS NULL
       AND r.run_id IN (SELECT t.run_id FROM awp.tasks t             -- tasks_retry_due_idx
                         WHERE t.status = 'waiting_retry' AND t.ready_at <= v_now)
       FOR UPDATE OF r SKIP LOCKED
  LOOP
    WITH u AS (
      UPDATE awp.tasks t SET status = 'ready', ready_at = NULL, updated_at = v_now
       WHERE t.run_id = v_run AND t.status = 'waiting_retry' AND t.ready_at <= v_now
      RETURNING t.task_key, t.ordinal
    )
    SELECT array_agg(u.task_key ORDER BY u.ordinal) INTO v_keys FROM u;
    PERFORM awp._log(v_run, 'task', v_keys,
                     array_fill('waiting_retry'::text, ARRAY[coalesce(cardinality(v_keys), 0)]),
                     'ready', 'retry interval elapsed');
    v_n := v_n + coalesce(cardinality(v_keys), 0);
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.promote_retries() IS 'Makes due waiting_retry tasks ready; returns the count.';

-- awp.withdraw_orphan_dispatches(): a pending dispatch whose executor kind no active worker
-- supports is canceled and its task goes back to ready (no attempt, no retry spent).
-- Returns the number withdrawn.
CREATE OR REPLACE FUNCTION awp.withdraw_orphan_dispatches() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  c     record;
  v_now timestamptz := awp._now();
  v_n   integer := 0;
BEGIN
  FOR c IN
    SELECT d.dispatch_id, d.run_id, d.task_key FROM awp.dispatches d
      JOIN awp.runs r ON r.run_id = d.run_id
     WHERE d.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM awp.workers w
                        WHERE w.status = 'active' AND d.executor_kind = ANY (w.executor_kinds))
     ORDER BY d.dispatch_id
       FOR UPDATE OF r, d SKIP LOCKED
  LOOP
    UPDATE awp.dispatches d SET status = 'canceled', finished_at = v_now WHERE d.dispatch_id = c.dispatch_id;
    UPDATE awp.tasks t SET status = 'ready', updated_at = v_now
     WHERE t.run_id = c.run_id AND t.task_key = c.task_key AND t.status = 'queued';
    PERFORM awp._log1(c.run_id, 'dispatch', c.dispatch_id, 'pending', 'canceled', 'no compatible active worker');
    PERFORM awp._log1(c.run_id, 'task', c.task_key, 'queued', 'ready', 'no compatible active worker');
    v_n := v_n + 1;
  END LOOP;
  PERFORM awp._log_flush();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.withdraw_orphan_dispatches() IS 'Withdraws pending dispatches no active worker can take (task back to ready); returns the count.';

-- awp.create_dispatches(): turns ready tasks into pending dispatches under the three limits of
-- docs/protocol.md, rule 8 (run concurrency over queued + running; free capacity of compatible active
-- workers, less the dispatches already pending for them; the global dispatch_limit over
-- pending + leased) and the fairness rule 9: runs that never got a dispatch first, then the run
-- whose latest dispatch is oldest; one task per run per round; rounds repeat while they progress.
-- Returns the number of dispatches created. awp._create_dispatches() does the work without the
-- NOTIFY, for callers that notify once at their end (awp._notify_pending).
-- Locks: a transaction-level advisory lock serialises every transaction that adds to pending +
-- leased (coordinator passes, run starts) so two of them cannot both spend the last unit of a limit;
-- it is taken before the budget is read. Runs are then locked with SKIP LOCKED.
CREATE OR REPLACE FUNCTION awp._create_dispatches() RETURNS integer
LANGUAGE plpgsql SET search_path = '' AS $$
DECLARE
  b       record;
  v_kinds jsonb;
  v_left  integer;
  v_round integer;
  v_n     integer := 0;
  v_kind  text;
  v_run   text;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('awp.create_dispatches'));
  b := awp._dispatch_budget();
  v_kinds := b.kinds;
  v_left := least(b.global_free, b.worker_free);
  LOOP
    v_round := 0;
    FOR v_run IN
      SELECT x.run_id FROM awp.runs x
       WHERE x.status IN ('pending', 'running') AND x.cancel_requested_at IS NULL
         AND (SELECT y.ordinal FROM awp.tasks y WHERE y.run_id = x.run_id AND y.status = 'ready'
               ORDER BY y.ordinal LIMIT 1) IS NOT NULL
       ORDER BY x.last_dispatch_seq NULLS FIRST, x.created_at, x.run_id
    LOOP
      EXIT WHEN v_left <= 0;
      PERFORM 1 FROM awp.runs x WHERE x.run_id = v_run FOR UPDATE SKIP LOCKED;
      CONTINUE WHEN NOT FOUND;
      v_kind := awp._dispatch_one(v_run, v_kinds);
      CONTINUE WHEN v_kind IS NULL;
      v_kinds := jsonb_set(v_kinds, ARRAY[v_kind], to_jsonb((v_kinds->>v_kind)::integer - 1));
      v_left := v_left - 1;
      v_round := v_round + 1;
      v_n := v_n + 1;
    END LOOP;
    EXIT WHEN v_round = 0 OR v_left <= 0;
  END LOOP;
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp._create_dispatches() IS 'Creates pending dispatches for ready tasks under the backpressure limits and the fairness rule, without NOTIFY; returns the count.';

CREATE OR REPLACE FUNCTION awp.create_dispatches() RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  v_n integer := awp._create_dispatches();
BEGIN
  PERFORM awp._notify_pending();
  RETURN v_n;
END $$;
COMMENT ON FUNCTION awp.create_dispatches() IS 'Creates pending dispatches for ready tasks under the backpressure limits and the fairness rule; returns the count.';

-- awp.coordinator_tick(takeover): one full coordinator pass: offline marking, schedule firing, cancel
-- convergence, reaping, retry promotion, orphan withdrawal, dispatch creation. A coordinator that has
-- just taken over (p_takeover, or no pass for a full offline window) restarts the offline clock.
-- Returns {canceled, reaped, offline, promoted, withdrawn, dispatched, schedules_fired} (counts) and
-- "limited": the limits that still hold ready tasks back after the pass (awp._limits_held(), e.g.
-- ["workers_full"]; [] when none), which the gateway counts for /metrics (docs/limits.md).
CREATE OR REPLACE FUNCTION awp.coordinator_tick(p_takeover boolean DEFAULT false) RETURNS jsonb
LANGUAGE plpgsql SECURITY DEFINER SET search_path = '' AS $$
DECLARE
  s       awp.settings;
  v_now   timestamptz := awp._now();
  v_off   integer;
  v_can   integer;
  v_reap  integer;
  v_prom  integer;
  v_wd    integer;
  v_disp  integer;
  v_fired integer;
BEGIN
  SELECT * INTO s FROM awp.settings FOR UPDATE;
  UPDATE awp.settings x
     SET last_tick_at = v_now,
         coordinator_since = CASE
           WHEN p_takeover OR x.last_tick_at IS NULL OR x.coordinator_since IS NULL
                OR x.last_tick_at < v_now - make_interval(secs => x.heartbeat_interval_ms * x.offline_after_heartbeats / 1000.0)
           THEN v_now ELSE x.coordinator_since END;
  v_off  := awp.mark_offline_workers();
  v_fired := awp.fire_schedules();   -- schedule rows before any run lock
  v_can  := awp.converge_cancellations();
  v_reap := awp.reap_expired_leases();
  v_prom := awp.promote_retries();
  v_wd   := awp.withdraw_orphan_dispatches();
  v_disp := awp._create_dispatches();
  PERFORM awp._notify_pending();
  RETURN jsonb_build_object('canceled', v_can, 'reaped', v_reap, 'offline', v_off,
                            'promoted', v_prom, 'withdrawn', v_wd, 'dispatched', v_disp,
                            'schedules_fired', v_fired, 'limited', to_jsonb(awp._limits_held()));
END $$;
COMMENT ON FUNCTION awp.coordinator_tick(boolean) IS 'One full coordinator pass; returns counts {canceled, reaped, offline, promoted, withdrawn, dispatched, schedules_fired} and the limits still holding ready tasks (limited).';
