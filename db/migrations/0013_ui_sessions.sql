-- 0013_ui_sessions: signing out of the dashboard ends the session on every gateway replica (docs/operations.md,
-- "Dashboard sessions"; db/functions/ui_sessions.sql).
--   ui_revoked_sessions   the dashboard sessions signed out before their cookie expired: session_id (the random
--                         id the signed cookie carries; not a secret: without the signature key it forges
--                         nothing) and expires_at (when the session's last possible cookie expires, on the
--                         gateway's clock). Every dashboard request with a valid cookie looks its id up (the
--                         primary key); awp.revoke_ui_session deletes the rows an hour past expires_at.

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.ui_revoked_sessions (
  session_id text PRIMARY KEY,
  expires_at timestamptz NOT NULL,
  CONSTRAINT ui_revoked_session_id_length CHECK (length(session_id) BETWEEN 1 AND 64)
);
-- The expired rows, oldest first (awp.revoke_ui_session deletes them).
CREATE INDEX ui_revoked_sessions_expires_idx ON awp.ui_revoked_sessions (expires_at);

RESET ROLE;
