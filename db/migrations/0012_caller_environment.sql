-- 0012_caller_environment: nothing a caller's session holds may change what AWP's functions do (docs/operations.md,
-- "The database logins").
-- 1. TEMPORARY on AWP's database is revoked from PUBLIC (PostgreSQL grants it to every role by default). A login
--    that can create temporary objects can shadow a type name in its pg_temp schema (a domain `pg_temp.jsonb` whose
--    CHECK calls its own function): a SECURITY DEFINER function that looks the name up there runs that code as
--    awp_owner. Every function now also pins `search_path = pg_catalog, pg_temp` (pg_temp named last, so it is
--    searched after pg_catalog for types and relations; PostgreSQL never searches it for functions and
--    operators); this revoke is the second wall. Neither awp_owner (NOLOGIN) nor awp_gateway needs temporary
--    objects. Idempotent; a migrating user without the grant option gets a WARNING, not an error (as 0007).
-- 2. The deferred constraint trigger events_flush_log_state goes: it flushed the transaction-local setting
--    awp.log_state at commit, and a caller could set that setting after a call and commit, so the trigger wrote
--    the caller's numbers into another run's row. The setting now lives only inside the SECURITY DEFINER call
--    that writes it (each public function sets it empty on entry and PostgreSQL restores the caller's value on
--    exit: db/functions/zz_grants.sql), so nothing at commit could see a function's state any more.
DO $$
BEGIN
  EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
END $$;

DROP TRIGGER IF EXISTS events_flush_log_state ON awp.events;
DROP FUNCTION IF EXISTS awp._log_flush_at_commit();
