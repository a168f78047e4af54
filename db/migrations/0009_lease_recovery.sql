-- 0009_lease_recovery: no attempt is wasted on a lost claim answer or on an outage (docs/protocol.md,
-- Lease recovery).
--   dispatches.claim_seq        the worker's number of the claim request that leased it (claims, completes
--                               and completions that claim carry one); NULL when the worker sent none (an
--                               older worker: the heartbeat release rule never applies to its leases).
--   dispatches.dropped_at       when its worker reported (heartbeat `dropped`) that it gave the lease up
--                               without a result; such a lease is never renewed nor released as not received.
--   dispatches.uncounted        why the lease's attempt will not count against max_attempts if it ends
--                               without a result: not_received (its worker's heartbeat showed it never got
--                               the claim answer) or outage (the lease was live when the coordinator stopped
--                               for an outage). NULL: it counts, as before.
--   attempts.counted            false for an attempt that does not count against max_attempts (status
--                               not_received, or interrupted / timed_out after an outage; at most 100 per
--                               task, past that they count).
--   attempts.status             + not_received.
--   tasks.uncounted_attempts    how many of tasks.attempts do not count; the retry rule and the range check
--                               use attempts - uncounted_attempts.
-- Existing rows: every attempt counted, no lease marked.

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.dispatches
  ADD COLUMN claim_seq  bigint,
  ADD COLUMN dropped_at timestamptz,
  ADD COLUMN uncounted  text,
  ADD CONSTRAINT dispatch_claim_seq_positive CHECK (claim_seq >= 1),
  ADD CONSTRAINT dispatch_uncounted_is_valid CHECK (uncounted IN ('not_received', 'outage'));

ALTER TABLE awp.attempts
  ADD COLUMN counted boolean NOT NULL DEFAULT true,
  DROP CONSTRAINT attempt_status_is_valid,
  ADD CONSTRAINT attempt_status_is_valid CHECK (status IN
    ('running', 'succeeded', 'failed', 'timed_out', 'interrupted', 'canceled', 'not_received')),
  ADD CONSTRAINT attempt_uncounted_only_when_lost
    CHECK (counted OR status IN ('not_received', 'interrupted', 'timed_out'));

ALTER TABLE awp.tasks
  ADD COLUMN uncounted_attempts integer NOT NULL DEFAULT 0,
  DROP CONSTRAINT task_attempts_in_range,
  ADD CONSTRAINT task_attempts_in_range CHECK (attempts - uncounted_attempts BETWEEN 0 AND max_attempts),
  ADD CONSTRAINT task_uncounted_attempts_in_range CHECK (uncounted_attempts BETWEEN 0 AND attempts);

RESET ROLE;
