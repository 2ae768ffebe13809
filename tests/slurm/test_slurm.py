"""slurm/train.sbatch on a real single-node Slurm: a plain run, a preemption with requeue,
and the launch mistakes the singleton guard catches."""

import re
import sys
import time

import pytest
import torch

from jobs_util import ROOT
from train_output import final_result as _final, read_log


def test_submit_trains_to_accuracy(slurm, submit, tmp_path):
    job, log = submit("--run-dir", tmp_path / "run", "--epochs", "12")
    info = slurm.wait(job, timeout=300)
    text = read_log(log)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    (size, accuracy), _ = _final(text)
    assert size == 2 and accuracy >= 0.95, text[-2000:]
    assert "srun --mpi=pmi2" in text


def test_preemption_checkpoints_requeues_once_and_resumes_identically(slurm, submit,
                                                                     tmp_path):
    epochs = ["--epochs", "16"]  # the signal comes at epoch 3, well before the end
    job, log = submit("--run-dir", tmp_path / "preempted", *epochs, log="preempted.out")
    deadline = time.monotonic() + 120
    while "epoch 3:" not in read_log(log):
        assert time.monotonic() < deadline, read_log(log)[-2000:]
        time.sleep(0.1)
    # As the scheduler's warning does with --signal=B:USR1: only the batch shell.
    slurm.run("scancel", "--batch", "--signal=USR1", str(job))
    # The uninterrupted reference runs while the requeued job waits out its credential's
    # lifetime (cred_expire) before it may start again.
    reference, ref_log = submit("--run-dir", tmp_path / "uninterrupted", *epochs,
                                log="uninterrupted.out")
    info = slurm.wait(job, timeout=600)
    text = read_log(log)
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert info["Restarts"] == "1"
    assert "batch shell got SIGUSR1, forwarding it to the ranks" in text
    for rank in (0, 1):
        assert f"rank {rank}: preemption requested (signal received here: True)" in text
    assert text.count("hpcddp: preempted; requeueing Slurm job") == 1
    assert re.search(r"checkpointed at epoch \d+ step \d+", text)
    assert re.search(r"resumed from .* \(Slurm restart 1\): continuing at epoch", text)

    assert slurm.wait(reference, timeout=300)["JobState"] == "COMPLETED"
    assert _final(text) == _final(read_log(ref_log))
    assert _final(text)[1] is not None


@pytest.mark.parametrize("setting,message", [
    ("HPCDDP_MAX_RESTARTS=three", "HPCDDP_MAX_RESTARTS=three is not a number of restarts; "
                                  "e.g. 3, or 0 for none"),
    ("HPCDDP_SPARE_NODES=1", "HPCDDP_SPARE_NODES=1 leaves no node to train on in an "
                             "allocation of 1: ask for more nodes"),
    ("HPCDDP_MIN_NODES=0", "HPCDDP_MIN_NODES=0 is not a number of nodes a successor may "
                           "train on: use one from 1 to 1"),
    ("HPCDDP_MIN_NODES=all", "HPCDDP_MIN_NODES=all is not a number of nodes")])
def test_a_bad_healing_setting_is_refused_with_the_fix(slurm, tmp_path, setting, message):
    log = tmp_path / "bad.out"
    name, value = setting.split("=")
    job = slurm.sbatch("--chdir", ROOT, "--output", log, ROOT / "slurm" / "train.sbatch",
                       "--run-dir", tmp_path / "run",
                       env={"PYTHON": sys.executable, name: value,
                            "HPCDDP_HEAL_DIR": str(tmp_path / "heal")})
    assert slurm.wait(job, timeout=120)["JobState"] == "FAILED"
    assert message in read_log(log), read_log(log)
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_srun_without_pmi_is_refused_on_every_task(slurm, tmp_path):
    log = tmp_path / "none.out"
    job = slurm.sbatch("-n", "2", "--chdir", ROOT, "--output", log, "--wrap",
                       f"srun --mpi=none {sys.executable} tests/jobs/scripts/show_world.py")
    info = slurm.wait(job, timeout=120)
    text = read_log(log)
    assert info["JobState"] == "FAILED"
    assert text.count("MPI world size is 1 but SLURM_STEP_NUM_TASKS=2") == 2, text
    assert "srun --mpi=pmi2" in text


def test_serial_command_inside_a_multitask_job_runs(slurm, tmp_path):
    log = tmp_path / "serial.out"
    job = slurm.sbatch("-n", "2", "--chdir", ROOT, "--output", log, "--wrap",
                       f"{sys.executable} tests/jobs/scripts/show_world.py")
    assert slurm.wait(job, timeout=120)["JobState"] == "COMPLETED", read_log(log)
    assert "rank=0 size=1" in read_log(log)


def test_lightning_under_srun_on_hpcddp_ends_as_on_gloo(slurm, tmp_path):
    """Lightning's SLURMEnvironment passes rank, world size and its own MASTER_ADDR to
    init_process_group("hpcddp"): the job trains as the same job does on gloo."""
    finals = {}
    for backend in ("gloo", "hpcddp"):
        log = tmp_path / f"lightning-{backend}.out"
        job = slurm.sbatch("-N", "1", "--ntasks-per-node", "2", "--chdir", ROOT, "--output",
                           log, "--wrap", f"srun --mpi=pmi2 {sys.executable} "
                           f"tests/jobs/scripts/lightning_train.py {backend} lightning-init "
                           f"{tmp_path}")
        info = slurm.wait(job, timeout=240)
        text = read_log(log)
        assert info["JobState"] == "COMPLETED", text[-3000:]
        assert text.count(f"backend {backend} world 2 cluster SLURMEnvironment") == 2, text
        finals[backend] = [torch.load(tmp_path / f"{backend}-lightning-init-rank{r}.pt")
                           ["final"] for r in (0, 1)]
    for ours in finals["hpcddp"]:
        for key, value in finals["gloo"][0].items():
            torch.testing.assert_close(ours[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_a_horovod_program_runs_unchanged_under_horovodrun_in_a_batch_job(slurm, tmp_path):
    """``import horovod.torch as hvd`` resolving to hpcddp (the alias's path), started by
    ``horovodrun`` inside the allocation, which starts the ranks with srun (as a batch
    script's own ``srun`` would): it trains as one process on the global batch."""
    script = ROOT / "tests/jobs/scripts/horovod_train.py"
    alias = ROOT / "hpcddp/horovod/alias"
    runs = {"horovodrun": f"{sys.executable} -m hpcddp.commands.horovodrun -np 2 --verbose "
                          f"--fusion-threshold-mb 1 {sys.executable} {script}"}
    for how, command in runs.items():
        log = tmp_path / f"{how}.out"
        job = slurm.sbatch("-N", "1", "-n", "2", "--chdir", ROOT, "--output", log, "--wrap",
                           command, env={"PYTHONPATH": str(alias), "HPCDDP_SRUN_MPI": "pmi2"})
        info = slurm.wait(job, timeout=240)
        text = read_log(log)
        assert info["JobState"] == "COMPLETED", (how, text[-3000:])
        for rank in range(2):
            assert f"rank {rank} of 2: horovod 0.28.1+hpcddp." in text, (how, text[-3000:])
        assert text.count("agrees with one process on the global batch") == 2, (how, text)
        assert text.count("fusion threshold 1048576") == 2, text
        assert "horovodrun: HOROVOD_FUSION_THRESHOLD=1048576 srun -n 2 " in text, text
