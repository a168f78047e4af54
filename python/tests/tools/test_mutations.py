"""`make mutate` in small (the full run takes a few minutes, see python -m awp_testing.mutate): the list of mutations
stays in step with db/functions, and a random sample of its mutants is killed by pgTAP.

The sample is printed with its seed; AWP_MUTATE_SEED=<seed> repeats it, AWP_MUTATE_SAMPLE=<n> sizes it."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest

from awp.dev.localdb import Server
from awp.dev.migrate import default_sql_dir
from awp_testing import mutate


def test_every_mutation_applies_to_the_code_as_it_is():
    """Each snippet occurs exactly once in its file (when a function changes, its mutations must follow)."""
    mutations = mutate.load()
    assert len(mutations) >= 40
    assert mutate.problems(mutations, default_sql_dir()) == []


@pytest.mark.slow
def test_a_sample_of_mutants_is_killed_by_pgtap(pg_cluster: Server):
    seed = int(os.environ.get("AWP_MUTATE_SEED") or random.randrange(1 << 30))
    size = int(os.environ.get("AWP_MUTATE_SAMPLE") or 3)
    candidates = [m for m in mutate.load() if m.equivalent is None and not m.pytest]
    sample = random.Random(seed).sample(candidates, min(size, len(candidates)))
    print(f"\nmutation sample (AWP_MUTATE_SEED={seed}): {', '.join(m.name for m in sample)}")
    with tempfile.TemporaryDirectory(prefix="awp-mutate-") as snap:
        sql_dir = mutate.mutated_copy(default_sql_dir(), None, Path(snap))
        template = mutate.make_template(pg_cluster, sql_dir)
        try:
            runner = mutate.Runner(pg_cluster, sql_dir, template, use_pytest=False)
            baseline = runner.run(None)
            assert baseline.status == "survived", f"pgTAP fails without any mutation: {baseline.by}"
            outcomes = [runner.run(m) for m in sample]
        finally:
            pg_cluster.drop_database(template)
    lived = [(o.mutation.name, o.status, o.by) for o in outcomes if o.status != "killed"]
    assert lived == [], f"mutants not killed (AWP_MUTATE_SEED={seed}): {lived}"
