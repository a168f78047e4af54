-- Grants, applied last: every function in schema awp belongs to awp_owner (SECURITY DEFINER
-- functions run as it), nobody but awp_gateway may execute the public ones (names not starting
-- with "_"), and awp_gateway gets no table privilege at all.
-- The caller's settings: every SECURITY DEFINER function also sets the transaction-local settings that AWP's
-- functions keep state in, awp.log_state (a call's run counters, db/functions/00_helpers.sql) and
-- awp.new_dispatches (the dispatches to notify, db/functions/_dispatching.sql), empty on entry; PostgreSQL gives
-- the caller its own value back on exit. A value the caller set before the call is never read, and nothing a
-- function wrote outlives it (a caller could otherwise have written another run's counters: migration 0012).
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
      EXECUTE format('ALTER FUNCTION %s SET awp.log_state = '''' SET awp.new_dispatches = ''''', f.sig);
    END IF;
    IF left(f.proname, 1) <> '_' THEN
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO awp_gateway', f.sig);
    ELSE
      EXECUTE format('REVOKE ALL ON FUNCTION %s FROM awp_gateway', f.sig);
    END IF;
  END LOOP;
END $$;
REVOKE ALL ON ALL TABLES IN SCHEMA awp FROM PUBLIC, awp_gateway;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA awp FROM PUBLIC, awp_gateway;
