"""torch's own distributed test suite on hpcddp, against gloo on the same ranks.

``DistributedTest._DistTestBase`` (torch/testing/_internal/distributed/distributed_test.py,
285 tests on torch 2.13) is what gloo, NCCL and UCC are held to. ``driver.py`` runs every
test of it in lock-step on ranks started by ``mpiexec``, first with gloo (the reference),
then with hpcddp, gated as for gloo. Every test gloo passes here must pass on hpcddp,
but those listed in ``known.py`` with the reason. ``make test-torch-suite`` runs it at 2
and 3 ranks; ``HPCDDP_TORCH_SUITE_RANKS=8`` adds the tests that need 8
(``skip_if_small_worldsize``)."""

import json
import os

import pytest

import driver
from known import KNOWN

RANKS = [int(r) for r in os.environ.get("HPCDDP_TORCH_SUITE_RANKS", "2,3").split(",")]


@pytest.fixture(scope="module")
def tests():
    return driver.names()


@pytest.mark.parametrize("ranks", RANKS)
def test_every_test_gloo_passes_passes_on_hpcddp(tests, ranks, tmp_path):
    gloo = driver.run(ranks, "gloo", tests)
    passed_gloo = [n for n in tests if gloo[n]["outcome"] == "passed"]
    ours = driver.run(ranks, "hpcddp", passed_gloo)  # what gloo does not pass proves nothing
    outcome = {name: (gloo[name]["outcome"], ours[name]["outcome"]) for name in passed_gloo}
    failing = {n: ours[n] for n in passed_gloo if outcome[n][1] != "passed" and n not in KNOWN}
    gloo_counts = {o: sum(1 for r in gloo.values() if r["outcome"] == o)
                   for o in ("passed", "failed", "skipped", "crashed")}
    ours_counts = {o: sum(1 for v in outcome.values() if v[1] == o)
                   for o in ("passed", "failed", "skipped", "crashed")}
    print(f"\ntorch's suite at {ranks} ranks, {len(tests)} tests: gloo {gloo_counts}; of the "
          f"{len(passed_gloo)} gloo passes, hpcddp {ours_counts} ({len(KNOWN)} known)")
    (tmp_path / "outcomes.json").write_text(json.dumps(outcome, indent=1))
    assert not failing, json.dumps(
        {n: {"outcome": r["outcome"], "details": {k: v[-1500:] for k, v in
                                                  r["details"].items()}}
         for n, r in failing.items()}, indent=1)[:20000]
    # The list stays true: a known exception that now passes is taken off it.
    mended = [n for n in KNOWN if n in outcome and outcome[n] == ("passed", "passed")]
    assert not mended, f"these now pass on hpcddp; remove them from known.py: {mended}"
