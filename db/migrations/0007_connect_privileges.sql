-- 0007_connect_privileges: only AWP's roles may connect to AWP's database. PostgreSQL grants CONNECT on
-- every database to PUBLIC, so any login of the server (also a member of awp_gateway made for another
-- database) could open a session here; now only members of awp_gateway and awp_owner (and superusers)
-- can. Idempotent (REVOKE and GRANT of a privilege already revoked or granted change nothing); a
-- migrating user that neither owns the database nor holds the grant option gets a WARNING, not an error.
DO $$
BEGIN
  EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO awp_gateway, awp_owner', current_database());
END $$;
