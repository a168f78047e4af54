-- 0002_idempotency: the answers of the gateway's idempotent POST routes (POST /workflows and
-- POST /workflows/{id}/versions/{v}/runs), so a replayed Idempotency-Key gets the first answer and a
-- reused key with a different request is refused (AWIDM). Written and read only through
-- db/functions/idempotency.sql.

SET LOCAL ROLE awp_owner;

CREATE TABLE awp.idempotency_keys (
  scope           text NOT NULL,
  idempotency_key text NOT NULL,
  request_hash    text NOT NULL,
  response        jsonb,
  created_at      timestamptz NOT NULL,
  PRIMARY KEY (scope, idempotency_key),
  CONSTRAINT idempotency_scope_is_valid CHECK (scope IN ('workflows', 'runs')),
  CONSTRAINT idempotency_key_length CHECK (length(idempotency_key) BETWEEN 1 AND 255),
  CONSTRAINT idempotency_request_hash_length CHECK (length(request_hash) BETWEEN 1 AND 128)
);
CREATE INDEX idempotency_keys_created_idx ON awp.idempotency_keys (created_at);

RESET ROLE;
