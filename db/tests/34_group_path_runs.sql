-- The group path over several runs (awp._complete_and_refill_group, AWP issue 11): the gateway groups the
-- completions of every run that arrive while one call is in flight, and each refill goes where fairness sends it.
-- Whatever the group, the group path must write what the item loop writes (one awp.complete_and_claim per item in
-- worker_id order, in one transaction): the same events of every run in the same order, the same task, dispatch,
-- attempt, run and worker rows, the same places in the fairness order and the same leases. Checked here on random
-- states: random runs (sizes, dependencies, concurrency), workers and groups, each group settled both ways from the
-- same state (each way in a subtransaction that is rolled back), then applied for real to reach the next state.
BEGIN;
\ir _fixtures.sql.inc
\ir _group_fixtures.sql.inc
SELECT plan(7);

SELECT tests.freeze('2026-01-01 00:00:00+00');
SELECT setseed(0.37);

-- pg_temp.lease_view(lease, runs): a lease without its random parts (ids, tokens, fencing token), its run by place.
CREATE FUNCTION pg_temp.lease_view(l awp.lease, p_runs text[]) RETURNS jsonb LANGUAGE sql AS $$
  SELECT to_jsonb(l) - '{dispatch_id,lease_token,fencing_token,run_id}'::text[]
         || jsonb_build_object('run', array_position(p_runs, l.run_id))
$$;

-- pg_temp.outcome(runs, workers, leases): everything a group writes, made comparable (ids by place or first use).
CREATE FUNCTION pg_temp.outcome(p_runs text[], p_workers text[], p_leases jsonb) RETURNS text LANGUAGE sql AS $$
  SELECT concat_ws(E'\n',
    (SELECT string_agg(concat_ws(' | ', array_to_string(tests.comparable_events(r, p_workers), ','),
                                 array_to_string(tests.task_rows(r), ','),
                                 (SELECT concat_ws('/', x.status, x.unfinished_tasks, x.last_sequence, x.revision,
                                                   x.started_at, x.finished_at, x.final_task_counts, x.output)
                                    FROM awp.runs x WHERE x.run_id = r)), E'\n' ORDER BY o)
       FROM unnest(p_runs) WITH ORDINALITY AS u(r, o)),
    'fairness ' || (SELECT string_agg(array_position(p_runs, x.run_id)::text, ','
                                      ORDER BY x.last_dispatch_seq NULLS FIRST, x.created_at, x.run_id)
                      FROM awp.runs x WHERE x.run_id = ANY (p_runs)),
    'dispatches ' || (SELECT string_agg(concat_ws('/', array_position(p_runs, d.run_id), d.task_key, d.attempt, d.status,
                                                  array_position(p_workers, d.worker_id), d.attempt_status, d.output,
                                                  d.leased_at, d.lease_expires_at, d.attempt_deadline, d.claim_seq,
                                                  d.finished_at, d.attempt_finished_at, d.counted, d.result_hash),
                                        ',' ORDER BY array_position(p_runs, d.run_id), d.task_key, d.attempt)
                        FROM awp.dispatches d WHERE d.run_id = ANY (p_runs)),
    'workers ' || (SELECT string_agg(concat_ws('/', w.status, w.last_heartbeat_at), ','
                                     ORDER BY array_position(p_workers, w.worker_id))
                     FROM awp.workers w WHERE w.worker_id = ANY (p_workers)),
    'leases ' || p_leases::text)
$$;

-- pg_temp.compare(items, runs, workers): {group path's outcome, item loop's outcome} from the same state (both rolled
-- back), or {'AWGRP ' || why, NULL} when the group path does not apply.
CREATE FUNCTION pg_temp.compare(p_items jsonb, p_runs text[], p_workers text[]) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
  a text;
  b text;
  l jsonb;
  x record;
  v_why text;
BEGIN
  BEGIN
    SELECT coalesce(jsonb_agg(pg_temp.lease_view(g.lease, p_runs) ORDER BY g.item), '[]') INTO l
      FROM awp._complete_and_refill_group(p_items) g;
    a := pg_temp.outcome(p_runs, p_workers, l);
    RAISE EXCEPTION 'undo' USING ERRCODE = 'ZZUND';
  EXCEPTION
    WHEN SQLSTATE 'ZZUND' THEN NULL;
    WHEN SQLSTATE 'AWGRP' THEN
      GET STACKED DIAGNOSTICS v_why = PG_EXCEPTION_DETAIL;
      RETURN ARRAY['AWGRP ' || v_why, NULL];
  END;
  BEGIN
    l := '[]';
    FOR x IN SELECT e, o FROM jsonb_array_elements(p_items) WITH ORDINALITY AS u(e, o) ORDER BY e->>'worker_id', o LOOP
      l := l || jsonb_build_object('item', x.o, 'lease',
             (SELECT pg_temp.lease_view(c, p_runs)
                FROM awp.complete_and_claim(x.e->>'worker_id', x.e->>'session_token', x.e->>'dispatch_id',
                                            x.e->>'lease_token', x.e->'result', 1) c));
    END LOOP;
    b := pg_temp.outcome(p_runs, p_workers,
                         (SELECT coalesce(jsonb_agg(y->'lease' ORDER BY (y->>'item')::integer), '[]')
                            FROM jsonb_array_elements(l) y));
    RAISE EXCEPTION 'undo' USING ERRCODE = 'ZZUND';
  EXCEPTION WHEN SQLSTATE 'ZZUND' THEN NULL;
  END;
  RETURN ARRAY[a, b];
END $$;

-- held: each worker's current lease.
CREATE TEMP TABLE held (worker_id text PRIMARY KEY, token text, dispatch_id text, lease_token text, run_id text);
CREATE TEMP TABLE seen (scenario integer, step integer, runs integer, items integer, outcome text, same boolean,
                        ended integer, started integer);   -- runs the group ended, pending runs it started

-- pg_temp.scenario(n): a random state of its own, then up to 8 random groups: each compared both ways, then applied
-- for real. At its end its runs are canceled and its workers drained, so that the next scenario starts alone.
CREATE FUNCTION pg_temp.scenario(p_n integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  v_kind  text := 'mock';
  v_runs  text[] := '{}';
  v_wids  text[];
  v_tasks jsonb;
  v_deps  text[];
  v_items jsonb;
  v_cmp   text[];
  v_nruns integer;
  v_live  text[];
  v_pend  text[];
  x       record;
  c       record;
BEGIN
  FOR r IN 1 .. 2 + floor(random() * 3)::integer LOOP
    v_tasks := '[]';
    FOR t IN 1 .. 3 + floor(random() * 8)::integer LOOP
      v_deps := ARRAY(SELECT 't' || d FROM generate_series(1, t - 1) d WHERE random() < 0.2 LIMIT 2);
      v_tasks := v_tasks || tests.task('t' || t, v_deps, jsonb_build_object('executor', v_kind));
    END LOOP;
    v_runs := v_runs || tests.make_run(format('wf_%s_%s', p_n, r), v_tasks, 1 + floor(random() * 3)::integer);
    PERFORM tests.advance('1 millisecond');
  END LOOP;
  DELETE FROM held;
  FOR w IN 1 .. 2 + floor(random() * 4)::integer LOOP
    INSERT INTO held (worker_id, token) SELECT r.* FROM tests.register_worker(format('s%s_w%s', p_n, w), ARRAY[v_kind], 1) r;
  END LOOP;
  v_wids := ARRAY(SELECT h.worker_id FROM held h ORDER BY h.worker_id);
  PERFORM awp.coordinator_tick();
  FOR x IN SELECT * FROM held ORDER BY worker_id LOOP
    SELECT * INTO c FROM awp.claim_tasks(x.worker_id, x.token, 1);
    UPDATE held SET dispatch_id = c.dispatch_id, lease_token = c.lease_token, run_id = c.run_id WHERE worker_id = x.worker_id;
  END LOOP;
  PERFORM tests.end_tx();
  <<steps>>
  FOR step IN 1 .. 8 LOOP
    -- a random group: >= 2 of the holders, in random positions
    v_items := (SELECT jsonb_agg(jsonb_build_object('worker_id', h.worker_id, 'session_token', h.token,
                                                    'dispatch_id', h.dispatch_id, 'lease_token', h.lease_token,
                                                    'result', tests.result('success', jsonb_build_object('v', floor(random() * 3))),
                                                    'slots', 1, 'claim_seq', NULL) ORDER BY random())
                  FROM held h WHERE h.dispatch_id IS NOT NULL AND random() < 0.8);
    EXIT WHEN (SELECT count(*) FROM held h WHERE h.dispatch_id IS NOT NULL) < 2;
    CONTINUE WHEN coalesce(jsonb_array_length(v_items), 0) < 2;
    v_cmp := pg_temp.compare(v_items, v_runs, v_wids);
    v_nruns := NULL;
    IF v_cmp[2] IS NOT NULL THEN   -- the runs the group touched (completed or refilled), from the item loop's leases
      v_nruns := (SELECT count(DISTINCT y) FROM (SELECT h.run_id FROM held h
                                                   WHERE h.worker_id IN (SELECT e->>'worker_id' FROM jsonb_array_elements(v_items) e)
                                                 UNION ALL
                                                 SELECT v_runs[(z->>'run')::integer]
                                                   FROM jsonb_array_elements(substring(v_cmp[2] FROM 'leases (.*)$')::jsonb) z) q(y));
    END IF;
    INSERT INTO seen VALUES (p_n, step, v_nruns, jsonb_array_length(v_items), CASE WHEN v_cmp[2] IS NULL THEN v_cmp[1] END,
                             CASE WHEN v_cmp[2] IS NOT NULL THEN v_cmp[1] = v_cmp[2] END);
    IF v_cmp[1] IS DISTINCT FROM v_cmp[2] AND v_cmp[2] IS NOT NULL THEN
      RAISE WARNING E'scenario % step %: group path\n%\nitem loop\n%', p_n, step, v_cmp[1], v_cmp[2];
    END IF;
    -- applied for real (whichever path complete_and_claim_many takes): the holders' next leases
    v_live := ARRAY(SELECT r.run_id FROM awp.runs r WHERE r.run_id = ANY (v_runs) AND r.status = 'running');
    v_pend := ARRAY(SELECT r.run_id FROM awp.runs r WHERE r.run_id = ANY (v_runs) AND r.status = 'pending');
    UPDATE held SET dispatch_id = NULL WHERE worker_id IN (SELECT e->>'worker_id' FROM jsonb_array_elements(v_items) e);
    FOR c IN SELECT (v_items->(m.item - 1)->>'worker_id') AS worker_id, (m.lease).* FROM awp.complete_and_claim_many(v_items) m
              WHERE (m.lease).dispatch_id IS NOT NULL LOOP
      UPDATE held SET dispatch_id = c.dispatch_id, lease_token = c.lease_token, run_id = c.run_id WHERE worker_id = c.worker_id;
    END LOOP;
    UPDATE seen SET ended = (SELECT count(*) FROM awp.runs r WHERE r.run_id = ANY (v_live) AND r.finished_at IS NOT NULL),
                    started = (SELECT count(*) FROM awp.runs r WHERE r.run_id = ANY (v_pend) AND r.status <> 'pending')
     WHERE scenario = p_n AND seen.step = steps.step;
    PERFORM tests.end_tx();
    PERFORM tests.advance((floor(random() * 900) + 1) * interval '1 millisecond');
  END LOOP;
  PERFORM awp.request_cancel(r) FROM unnest(v_runs) r;
  PERFORM awp.drain_worker(h.worker_id, h.token) FROM held h;
  PERFORM tests.end_tx();
END $$;

SELECT pg_temp.scenario(n) FROM generate_series(1, 40) n;

SELECT is((SELECT count(*) FROM seen WHERE same IS FALSE), 0::bigint,
          'every group the group path settles writes what the item loop writes (differences: WARNINGs above)');
SELECT cmp_ok((SELECT count(*) FROM seen WHERE same), '>=', 60::bigint, 'at least 60 random groups compared');
SELECT cmp_ok((SELECT count(*) FROM seen WHERE same AND runs >= 2), '>=', 30::bigint,
              'at least 30 of them touched two runs or more');
SELECT cmp_ok((SELECT count(*) FROM seen WHERE same AND runs >= 3), '>=', 10::bigint,
              'at least 10 of them touched three runs or more');
SELECT cmp_ok((SELECT count(*) FROM seen WHERE same AND ended > 0), '>=', 3::bigint,
              'at least 3 of them ended a run (the run settled with the group)');
SELECT cmp_ok((SELECT count(*) FROM seen WHERE same AND started > 0), '>=', 3::bigint,
              'at least 3 of them started a pending run');
SELECT is((SELECT count(*) FROM awp.check_invariants()), 0::bigint, 'invariants hold after every group applied');
SELECT diag(format('compared %s, ended a run %s, started a run %s, refused %s',
                   count(*) FILTER (WHERE same), count(*) FILTER (WHERE same AND ended > 0),
                   count(*) FILTER (WHERE same AND started > 0), count(*) FILTER (WHERE outcome IS NOT NULL))) FROM seen;
SELECT outcome, count(*) FROM seen WHERE outcome IS NOT NULL GROUP BY 1 ORDER BY 2 DESC;
SELECT count(*) FILTER (WHERE same) AS compared, count(*) FILTER (WHERE same AND runs >= 2) AS multi_run,
       count(*) FILTER (WHERE outcome IS NOT NULL) AS refused FROM seen;

SELECT * FROM finish();
ROLLBACK;
