"""slurm/train.sbatch, unchanged, on a real Slurm whose nodes are emulated nodes: a job of
two nodes x two ranks trains, a preemption checkpoints and requeues once and ends with
the parameters of an uninterrupted run, and srun without PMI is refused on every task."""

import re
import sys
import time

import pytest

from cluster_util import ROOT
from slurm_util import final_result as _final, read_log

# The ranks' traffic crosses the links, not shared memory (see the README's Many nodes).
ENV = {"PYTHON": sys.executable, "UCX_TLS": "tcp,self"}
NODES = ["--nodes=2", "--ntasks-per-node=2"]


@pytest.fixture
def submit(slurm_nodes, tmp_path):
    def run(*args, log="train.out"):
        path = tmp_path / log
        job = slurm_nodes.sbatch(*NODES, "--chdir", ROOT, "--output", path,
                                 ROOT / "slurm" / "train.sbatch", *args, env=ENV)
        return job, path
    return run


def test_two_node_job_trains_across_nodes(slurm_nodes, submit, tmp_path):
    job, log = submit("--run-dir", tmp_path / "run", "--epochs", "12")
    info = slurm_nodes.wait(job, timeout=400)
    text = read_log(log)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert info["NodeList"] == "hdtest-n[1-2]", info
    (size, accuracy), _ = _final(text)
    assert size == 4 and accuracy >= 0.95, text[-2000:]
    assert "4 ranks, srun --mpi=pmi2" in text
    assert re.search(r"^world_size=4 .* nodes=2$", text, re.M), text[-3000:]


def test_preemption_requeues_once_and_resumes_identically(slurm_nodes, submit, tmp_path):
    epochs = ["--epochs", "40"]
    job, log = submit("--run-dir", tmp_path / "preempted", *epochs, log="preempted.out")
    deadline = time.monotonic() + 240
    while "epoch 3:" not in read_log(log):
        assert time.monotonic() < deadline, read_log(log)[-2000:]
        time.sleep(0.2)
    slurm_nodes.run("scancel", "--batch", "--signal=USR1", str(job))
    info = slurm_nodes.wait(job, timeout=600)
    text = read_log(log)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert info["Restarts"] == "1"
    for rank in range(4):  # ranks 2 and 3 sit on the other node
        assert f"rank {rank}: preemption requested" in text, text[-3000:]
    assert text.count("hpcddp: preempted; requeued Slurm job") == 1
    assert re.search(r"resumed from .* \(Slurm restart 1\): continuing at epoch", text)

    reference, ref_log = submit("--run-dir", tmp_path / "uninterrupted", *epochs,
                                log="uninterrupted.out")
    assert slurm_nodes.wait(reference, timeout=400)["JobState"] == "COMPLETED"
    assert _final(text) == _final(read_log(ref_log))
    assert _final(text)[1] is not None


def test_srun_without_pmi_is_refused_on_every_task(slurm_nodes, tmp_path):
    log = tmp_path / "none.out"
    job = slurm_nodes.sbatch("-N", "2", "-n", "4", "--chdir", ROOT, "--output", log, "--wrap",
                             f"srun --mpi=none -N 2 -n 4 {sys.executable} "
                             f"tests/jobs/scripts/show_world.py", env=ENV)
    info = slurm_nodes.wait(job, timeout=180)
    text = read_log(log)
    assert info["JobState"] == "FAILED", text
    assert text.count("MPI world size is 1 but SLURM_STEP_NUM_TASKS=4") == 4, text
    assert "srun --mpi=pmi2" in text
