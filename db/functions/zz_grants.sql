-- Grants, applied last: every function in schema awp belongs to awp_owner (SECURITY DEFINER
-- functions run as it), nobody but awp_gateway may execute the public ones (names not starting
-- with "_"), and awp_gateway gets no table privilege at all.
-- The caller's settings: every SECURITY DEFINER function also sets the transaction-local settings that AWP's
-- functions keep state in, awp.log_state (a call's run counters, db/functions/00_helpers.sql) and
-- awp.new_dispatches (the dispatches to notify, db/functions/_dispatching.sql), empty on entry; PostgreSQL gives
-- the caller its own value back on exit. A value the caller set before the call is never read, and nothing a
-- function wrote outlives it (a caller could otherwise have written another run's counters: migration 0012).
-- jit = off in every SECURITY DEFINER function: their queries are short, and a plan over the partitioned tables
-- (migration 0023) priced from default estimates can pass jit_above_cost: awp.check_invariants() once spent 6 s
-- compiling on an empty database (35 ms without).
-- Plans: the hot path's functions (the protocol's calls, run starts, the coordinator's passes) set plan_cache_mode
-- = force_generic_plan. Their statements read the run-scoped tables by key, and those are partitioned (migration
-- 0023): PostgreSQL prices a generic plan over every partition (it prunes them only when it runs it), finds it
-- dearer than a plan for the call's values, and so planned every statement again at every call: 3.2 x the backend
-- CPU per completion (benchmarks/ab.py sql, 1,110 -> 3,560 us). Generic, a plan is made once per session and
-- prunes the partitions as it starts (docs/performance.md, Partitions). Reads and the DBA's functions keep
-- PostgreSQL's choice (their optional filters want plans for the values given).
DO $$
DECLARE
  f record;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS sig, p.proname, p.prosecdef
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'awp'
       AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO awp_owner', f.sig);
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
    IF f.prosecdef THEN
      EXECUTE format('ALTER FUNCTION %s SET awp.log_state = '''' SET awp.new_dispatches = '''' SET jit = off', f.sig);
    END IF;
    IF f.proname IN ('claim_tasks', 'complete_task', 'complete_and_claim', 'complete_and_claim_many', 'complete_tasks',
                     'heartbeat', 'release_lease', 'report_progress', 'report_progress_many', 'start_run',
                     'start_run_idempotent', 'start_runs', 'start_runs_idempotent', 'coordinator_tick',
                     'create_dispatches', 'cancel_waiting_runs', 'converge_cancellations', 'promote_retries',
                     'reap_expired_leases', 'withdraw_orphan_dispatches', 'mark_offline_workers', 'fire_schedules',
                     'request_cancel', 'send_signal', 'retry_run', 'retry_run_idempotent', 'next_due_ms',
                     'run_revision') THEN
      EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_generic_plan', f.sig);
    END IF;
    IF left(f.proname, 1) <> '_' THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO awp_gateway', f.sig);
    ELSE
      EXECUTE format('REVOKE ALL ON FUNCTION %s FROM awp_gateway', f.sig);
    END IF;
  END LOOP;
END $$;
-- The router's login (a member of awp_router: docs/scale-out.md) copies worker sessions between shards.
GRANT EXECUTE ON FUNCTION awp._worker_record(text), awp._adopt_worker(text, text, text[], integer, integer, bytea, jsonb)
  TO awp_router;
REVOKE ALL ON ALL TABLES IN SCHEMA awp FROM PUBLIC, awp_gateway;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awp FROM PUBLIC, awp_gateway;

-- The current history range and the next exist from the first migration on (a database without a coordinator
-- too; db/functions/_partitions.sql), made here, once awp_owner owns awp.maintain_partitions: it owns the partitions.
SELECT awp.maintain_partitions();
