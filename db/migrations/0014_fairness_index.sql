-- 0014_fairness_index: runs_live_idx carries the whole fairness order (docs/protocol.md, rule 9):
-- last_dispatch_seq NULLS FIRST, created_at, then run_id, the tie-break awp._fairness_order sorts by. Without
-- run_id the order could not come from the index alone: the planner sorted (an incremental sort reading 33 runs
-- for the first one, or, with statistics taken while the table was small, a bitmap scan of every live run and a
-- full sort: measured 1.1-2.9 ms per open at 1,000 live runs; AWP issue 46).

SET LOCAL ROLE awp_owner;

DROP INDEX awp.runs_live_idx;
CREATE INDEX runs_live_idx ON awp.runs (last_dispatch_seq NULLS FIRST, created_at, run_id)
  WHERE status IN ('pending', 'running');

RESET ROLE;
