-- 0021_worker_actions: routing by action (AWP issue 41; db/functions/_routing.sql). A worker registers the actions
-- it can run per executor kind:
--   workers.actions   {"<executor kind>": ["<action>", ...]}: for each kind named, the worker runs only those
--                     actions (a python worker: the handlers it loaded); a kind not named (mock), or no object at
--                     all (NULL: a worker that sent no list, as every worker before this migration), runs every
--                     action of its kinds.
-- Existing rows: NULL (today's behaviour: every action).

SET LOCAL ROLE awp_owner;

ALTER TABLE awp.workers
  ADD COLUMN actions jsonb,
  ADD CONSTRAINT worker_actions_is_object CHECK (actions IS NULL OR jsonb_typeof(actions) = 'object');

RESET ROLE;
