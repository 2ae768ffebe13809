"""Hugging Face ``Trainer`` on hpcddp (``examples/hf_trainer.py``): under mpiexec,
``hpcddp.init()`` first and nothing else changed, Accelerate sees the distributed run
from the variables init() exports, shards the data and reduces the gradients over
hpcddp's group; the losses of every step and the final weights are those of the same
script on torch's gloo backend, started as a gloo user would (MASTER_ADDR, RANK ...):
bit for bit at 2 ranks, to float rounding at 3."""

import json

import pytest
import torch

EXAMPLE = "examples/hf_trainer.py"


def _train(run_job, tmp_path, n, reference):
    out = tmp_path / ("gloo" if reference else "hpcddp")
    job = run_job([EXAMPLE, "--out", out] + (["--reference"] if reference else []), n=n,
                  timeout=240)
    assert job.returncode == 0, job.output[-3000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("n", [2, 3])
def test_trainer_on_hpcddp_trains_as_on_gloo(run_job, tmp_path, n):
    reference = _train(run_job, tmp_path, n, reference=True)
    ours = _train(run_job, tmp_path, n, reference=False)
    assert reference["backend"] == "gloo" and ours["backend"] == "hpcddp"
    # The Trainer itself saw every rank (not n copies of a one-process run).
    assert ours["trainer_world_size"] == reference["trainer_world_size"] == n
    assert len(ours["losses"]) == len(reference["losses"]) == 8
    assert ours["losses"][-1] < ours["losses"][0], "the model learned nothing"
    if n == 2:  # a + b is b + a: bit for bit
        assert ours["losses"] == reference["losses"]
        assert ours["weights_sha256"] == reference["weights_sha256"]
    else:  # three addends: MPI's and gloo's sums may differ in order (float rounding)
        torch.testing.assert_close(ours["losses"], reference["losses"], rtol=1e-5, atol=0)
        # AdamW moves every weight by about the learning rate (3e-3) a step whatever its
        # gradient's size, so where a gradient is near zero a rounding apart in its sum
        # can move a weight by a fraction of a step (2.5e-5 seen in 1 of 4096 weights of
        # a layer); a wrong sum, average or missing rank moves most weights by a whole
        # step or more. The bound is a tenth of one step, and almost every weight agrees
        # to float rounding.
        lr = 3e-3
        theirs = torch.load(tmp_path / "gloo" / "weights.pt")
        for key, value in torch.load(tmp_path / "hpcddp" / "weights.pt").items():
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=lr / 10)
            apart = ((value - theirs[key]).abs() > 2e-5).float().mean().item()
            assert apart < 0.01, f"{key}: {apart:.1%} of weights differ by more than 2e-5"


def test_a_forgotten_init_ends_the_job_at_the_first_step_instead_of_training_alone(run_job):
    job = run_job(["tests/jobs/scripts/hf_trainer_without_init.py"], n=2, timeout=240)
    assert job.returncode != 0 and not job.timed_out
    # The Trainer saw a world of one; hpcddp stopped the rank before its first step.
    assert "trainer world size 1" in job.stdout and "trained alone" not in job.stdout
    assert "TrainingAloneError: hpcddp: this process is one of 2" in job.stderr
    assert "Call hpcddp.init() at the start of the script" in job.stderr


def test_a_forgotten_init_with_use_cpu_names_the_fix_beside_torchs_missing_variable(run_job):
    job = run_job(["tests/jobs/scripts/hf_trainer_without_init.py", "cpu"], n=2, timeout=240)
    assert job.returncode != 0 and not job.timed_out and "trained alone" not in job.stdout
    assert "environment variable MASTER_ADDR expected, but not set. This process is one " \
           "of 2" in job.stderr
    assert "call hpcddp.init() at the start of the script" in job.stderr
