"""Lightning as a real client of the hpcddp backend: ``Trainer(accelerator="cpu",
devices=N, strategy=DDPStrategy(process_group_backend="hpcddp"))`` under mpiexec, with
``hpcddp.init()`` first and with Lightning initializing the group itself, ends with the
same parameters on every rank as the same run on gloo."""

import pytest
import torch

SCRIPT = "tests/jobs/scripts/lightning_train.py"


def _train(run_job, tmp_path, n, backend, how):
    job = run_job([SCRIPT, backend, how, tmp_path], n=n, timeout=180)
    assert job.returncode == 0, job.output[-3000:]
    for rank in range(n):
        assert (f"rank {rank}: backend {backend} world {n} cluster MPIEnvironment steps"
                in job.stdout), job.stdout[-2000:]
    return [torch.load(tmp_path / f"{backend}-{how}-rank{rank}.pt") for rank in range(n)]


@pytest.mark.parametrize("n", [2, 3])
def test_lightning_on_hpcddp_ends_as_on_gloo(run_job, tmp_path, n):
    reference = [saved["final"] for saved in _train(run_job, tmp_path, n, "gloo",
                                                    "lightning-init")]
    for how in ("hpcddp-init", "lightning-init"):
        ours = _train(run_job, tmp_path, n, "hpcddp", how)
        # Training moved the weights: the match below is not of untouched ones.
        assert not torch.allclose(ours[0]["initial"]["2.weight"], ours[0]["final"]["2.weight"],
                                  atol=1e-2)
        for rank_state in (saved["final"] for saved in ours):
            for key, value in reference[0].items():
                torch.testing.assert_close(rank_state[key], value, rtol=1e-6, atol=1e-7,
                                           msg=f"{how}: {key}")
    # gloo itself kept every rank alike.
    for rank_state in reference[1:]:
        assert all(torch.equal(rank_state[k], reference[0][k]) for k in rank_state)
