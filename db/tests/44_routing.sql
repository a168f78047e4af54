-- Routing by action (AWP issue 41, db/functions/_routing.sql): workers register the actions they run per executor
-- kind; a dispatch is created only for a task some active worker runs, a claim (and a refill leased straight to a
-- worker) takes only what its worker runs, a task nobody runs waits with no_worker_for_action, and a pending
-- dispatch whose action nobody runs any more is withdrawn. Workers that send no list run every action.
BEGIN;
\ir _fixtures.sql.inc
SELECT plan(27);

SELECT tests.freeze('2030-01-01 00:00:00+00');
CREATE FUNCTION tests.reg(p_name text, p_kinds text[], p_actions jsonb) RETURNS TABLE (worker_id text, token text)
LANGUAGE sql AS $$
  SELECT r.worker_id, r.session_token FROM awp.register_worker(p_name, p_kinds, 4, 1, p_actions) r
$$;
CREATE FUNCTION tests.py(p_key text, p_action text) RETURNS jsonb LANGUAGE sql AS $$
  SELECT tests.task(p_key, '{}', jsonb_build_object('executor', 'python', 'action', p_action))
$$;
CREATE FUNCTION tests.reasons(p_run_id text) RETURNS text[] LANGUAGE sql AS $$
  SELECT array_agg(task_key || '=' || reason) FROM awp.run_waits(p_run_id)
$$;
-- tests.claimed(worker, token): the task keys a claim of all its free slots leases, sorted.
CREATE FUNCTION tests.claimed(p_worker text, p_token text) RETURNS text[] LANGUAGE sql AS $$
  SELECT coalesce(array_agg(c.task_key ORDER BY c.task_key), '{}')
    FROM awp.claim_tasks(p_worker, p_token, (SELECT awp._free_slots(w) FROM awp.workers w WHERE w.worker_id = p_worker)) c
$$;

-- Bad action lists: AWREQ, naming what is wrong.
SELECT throws_ok($$SELECT * FROM tests.reg('x', '{python}', '["a"]')$$, 'AWREQ', 'invalid actions', 'actions must be an object');
SELECT is(tests.error_detail($$SELECT * FROM tests.reg('x', '{python}', '{"mock": ["a"]}')$$),
          'actions names executor kinds this worker does not offer: mock', 'a kind the worker does not offer');
SELECT throws_ok($$SELECT * FROM tests.reg('x', '{python}', '{"python": "a"}')$$, 'AWREQ', 'invalid actions', 'a list that is not an array');
SELECT throws_ok($$SELECT * FROM tests.reg('x', '{python}', '{"python": [""]}')$$, 'AWREQ', 'invalid actions', 'an empty action name');
SELECT throws_ok(format($$SELECT * FROM tests.reg('x', '{python}', jsonb_build_object('python', (SELECT jsonb_agg(i::text) FROM generate_series(1, %s) i)))$$,
                        awp._limit_worker_actions() + 1), 'AWREQ', 'invalid actions', 'more actions than the limit');

SELECT * FROM tests.reg('wa', '{python}', '{"python": ["a"]}') \gset a_
SELECT * FROM tests.reg('wb', '{mock,python}', '{"python": ["b"]}') \gset b_
SELECT is((SELECT actions FROM awp.workers WHERE worker_id = :'a_worker_id'), '{"python": ["a"]}'::jsonb, 'the lists are stored');
SELECT tests.make_run('wf', jsonb_build_array(tests.py('ta', 'a'), tests.py('tb', 'b'), tests.py('tc', 'c'), tests.task('m'))) AS run \gset
SELECT is(tests.task_statuses(:'run'), '{ta=queued,tb=queued,tc=ready,m=queued}',
          'dispatched at the start: the tasks some worker runs (ta, tb, m)');
SELECT is(tests.task_status(:'run', 'tc'), 'ready', 'tc (action c, which nobody runs) gets no dispatch');
SELECT is(tests.reasons(:'run'), ARRAY['ta=waiting_for_claim', 'tb=waiting_for_claim', 'tc=no_worker_for_action', 'm=waiting_for_claim'],
          'tc waits with no_worker_for_action');
SELECT matches((SELECT detail FROM awp.run_waits(:'run') WHERE task_key = 'tc'), '^no active worker runs action c of executor python',
               '... and the detail names the action');
SELECT is(awp.coordinator_tick()->'limited', '["no_worker_for_action"]', 'the pass reports the limit that holds');
SELECT is(awp._run_wait_counts(:'run')->>'no_worker_for_action', '1', 'the run''s wait counts have it');

SELECT is(tests.claimed(:'a_worker_id', :'a_token'), '{ta}', 'the worker with handler a gets ta only');
SELECT is(tests.claimed(:'b_worker_id', :'b_token'), '{m,tb}', 'the mock+python worker with handler b gets tb and the mock task');

-- A worker that runs c registers: tc is dispatched and claimed by it.
SELECT * FROM tests.reg('wc', '{python}', '{"python": ["c"]}') \gset c_
SELECT is(tests.claimed(:'a_worker_id', :'a_token'), '{}', '(nothing more for wa)');
SELECT is((awp.coordinator_tick()->>'dispatched')::integer, 1, 'once a worker runs c, tc is dispatched');
SELECT is(tests.claimed(:'a_worker_id', :'a_token'), '{}', 'wa does not take it');
SELECT is(tests.claimed(:'c_worker_id', :'c_token'), '{tc}', 'wc does');

-- Workers without lists (older ones; mock) take every action.
SELECT * FROM tests.reg('wold', '{python}', NULL) \gset o_
SELECT tests.make_run('wf2', jsonb_build_array(tests.py('tz', 'z'))) AS run2 \gset
SELECT is(tests.task_status(:'run2', 'tz'), 'queued', 'a worker without a list runs every action: tz is dispatched');
SELECT is(tests.claimed(:'c_worker_id', :'c_token'), '{}', 'wc (only c) does not take it');
SELECT is(tests.claimed(:'o_worker_id', :'o_token'), '{tz}', 'the worker without a list does');

-- A refill leased straight to a worker takes only what it runs (awp._first_ready).
UPDATE awp.settings SET dispatch_limit = (SELECT count(*) FROM awp.dispatches WHERE status IN ('pending', 'leased'));
SELECT tests.make_run('wf3', jsonb_build_array(tests.py('xb', 'b'), tests.py('xa', 'a'))) AS run3 \gset
SELECT is((SELECT task_key FROM awp._first_ready(:'run3', '{python}', '{}', '{"python": ["a"]}')), 'xa',
          '_first_ready skips a task whose action the worker does not run');
SELECT is((SELECT task_key FROM awp._first_ready(:'run3', '{python}', '{}', NULL)), 'xb', '... and takes the first without lists');

-- A pending dispatch whose action nobody runs any more is withdrawn (its task back to ready, waiting for one).
UPDATE awp.settings SET dispatch_limit = 1000;
SELECT is((awp.coordinator_tick()->>'dispatched')::integer, 2, '(xb and xa dispatched)');
UPDATE awp.workers SET status = 'stopped', stopped_at = awp._now() WHERE worker_id IN (:'b_worker_id', :'o_worker_id');
SELECT is((awp.coordinator_tick()->>'withdrawn')::integer, 1, 'once wb (and wold) stopped, xb''s dispatch is withdrawn');
SELECT is(tests.reasons(:'run3'), ARRAY['xb=no_worker_for_action', 'xa=waiting_for_claim'], 'xb waits for a worker running b');
SELECT is(tests.ok_run(:'run3') AND tests.ok_run(:'run'), true, 'no invariant violated');

SELECT * FROM finish();
ROLLBACK;
