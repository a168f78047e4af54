-- Routing by action (AWP issue 41; docs/protocol.md, Routing by action): a worker registers, per executor kind, the
-- actions it can run (workers.actions, migration 0021: {"python": ["a", "b"]}; a kind not named, or no object at
-- all, means every action of that kind). A dispatch is created only for a task whose executor kind and action some
-- active worker offers (awp._action_served, in the task-pick queries of awp._dispatch_one and awp._dispatch_many),
-- so a pending dispatch nobody can claim never takes its kind's budget; a claim leases only what its worker offers
-- (awp._takes, in the candidate queries of awp._claim), and a refill leased straight to a worker takes only a task
-- it offers (awp._offers, in awp._first_ready). A task whose action no active worker offers waits with reason
-- no_worker_for_action (db/functions/waits.sql); a pending dispatch whose action nobody offers any more is
-- withdrawn like one whose kind nobody offers (awp.withdraw_orphan_dispatches).

-- awp._offers(actions, kind, action): whether a worker whose registered action lists are `actions` runs `action` of
-- executor `kind` (of its kinds): yes without lists (NULL: an older worker) or without a list for that kind (mock),
-- else when the list names it. Locks: none.
CREATE OR REPLACE FUNCTION awp._offers(p_actions jsonb, p_kind text, p_action text) RETURNS boolean
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT p_actions IS NULL OR NOT p_actions ? p_kind OR coalesce((p_actions->p_kind) ? p_action, false)
$$;
COMMENT ON FUNCTION awp._offers(jsonb, text, text) IS 'Whether a worker with these action lists runs this action of this executor kind.';

-- awp._action_served(kind, action): whether some active worker offers executor `kind` and runs `action` of it: the
-- check at dispatch creation. Locks: none.
CREATE OR REPLACE FUNCTION awp._action_served(p_kind text, p_action text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM awp.workers w
                  WHERE w.status = 'active' AND p_kind = ANY (w.executor_kinds) AND awp._offers(w.actions, p_kind, p_action))
$$;
COMMENT ON FUNCTION awp._action_served(text, text) IS 'Whether an active worker offers this executor kind and action (dispatch creation).';

-- awp._takes(actions, dispatch): whether a worker whose action lists are `actions` may claim that pending dispatch
-- (its executor kind is the claim's concern): always without lists, else when it runs the dispatch's task's action.
-- Locks: none.
CREATE OR REPLACE FUNCTION awp._takes(p_actions jsonb, p_dispatch_id text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  IF p_actions IS NULL THEN
    RETURN true;
  END IF;
  RETURN (SELECT awp._offers(p_actions, d.executor_kind, t.action)
            FROM awp.dispatches d JOIN awp.tasks t ON t.run_id = d.run_id AND t.task_key = d.task_key
           WHERE d.dispatch_id = p_dispatch_id);
END $$;
COMMENT ON FUNCTION awp._takes(jsonb, text) IS 'Whether a worker with these action lists may claim this pending dispatch.';

-- awp._check_actions(actions, kinds): AWREQ unless `actions` is NULL or an object whose keys are among the
-- worker's executor `kinds`, each an array of at most awp._limit_worker_actions() distinct action names (strings
-- of 1-256 characters, as a task's action). Locks: none.
CREATE OR REPLACE FUNCTION awp._check_actions(p_actions jsonb, p_kinds text[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  v_bad text;
BEGIN
  IF p_actions IS NULL THEN
    RETURN;
  END IF;
  IF jsonb_typeof(p_actions) <> 'object' THEN
    v_bad := 'actions must be an object {executor kind: [action, ...]}';
  ELSE
    SELECT string_agg(e.key, ', ' ORDER BY e.key) INTO v_bad FROM jsonb_each(p_actions) e WHERE e.key <> ALL (p_kinds);
    IF v_bad IS NOT NULL THEN
      v_bad := format('actions names executor kinds this worker does not offer: %s', v_bad);
    ELSIF EXISTS (SELECT 1 FROM jsonb_each(p_actions) e
                   WHERE jsonb_typeof(e.value) <> 'array' OR jsonb_array_length(e.value) > awp._limit_worker_actions()
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(e.value) a
                                  WHERE jsonb_typeof(a) <> 'string' OR length(a #>> '{}') NOT BETWEEN 1 AND 256)) THEN
      v_bad := format('each list of actions must be an array of at most %s action names (strings of 1-256 characters)',
                      awp._limit_worker_actions());
    END IF;
  END IF;
  IF v_bad IS NOT NULL THEN
    PERFORM awp._raise_invalid_request('invalid actions', v_bad);
  END IF;
END $$;
COMMENT ON FUNCTION awp._check_actions(jsonb, text[]) IS 'Validates a worker''s action lists (AWREQ).';
