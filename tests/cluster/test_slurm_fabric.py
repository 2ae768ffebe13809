"""A node's fabric link fails mid-training while the node stays up in Slurm's eyes: on a
Slurm of three emulated nodes with two networks (the management network that slurmd, the
hostnames and the launchers use; a fabric, ``eth1``, that carries MPI), slurm/train.sbatch,
unchanged, names the node from hpcddp's watchdog reports and goes on without it: on the
spare node of its allocation, or, with no spare, as a successor job that excludes it.
Both end with the parameters of the uninterrupted job (the same 2 x 2 layout) and reach
the demo's accuracy."""

import re

import pytest

from cluster_util import ROOT, SLURM_ENV, SLURM_EPOCHS, SLURM_NODES, wait_for_log
from jobs_util import mpi_flavour
from train_output import final_result, read_log

# The watchdog ends a job whose ranks fall silent after this many seconds (600 by default).
TIMEOUT = "10"


@pytest.fixture
def fabric_env(fabric_cluster):
    env = dict(SLURM_ENV, HPCDDP_TIMEOUT=TIMEOUT,
               **fabric_cluster.fabric_settings(mpi_flavour()))
    yield env
    for node in fabric_cluster.nodes:
        fabric_cluster.set_fabric_link(node, True)


def _fail_fabric_link_at_epoch_3(cluster, log, victim):
    wait_for_log(log, "epoch 3:")
    cluster.set_fabric_link(victim, False)


@pytest.mark.parametrize("mode", ["spare", "successor"])
def test_a_fabric_link_down_leaves_the_node_out(fabric_slurm, fabric_cluster, fabric_env,
                                                tmp_path, uninterrupted, mode):
    nodes, victim = fabric_cluster.nodes, fabric_cluster.nodes[1]
    log = tmp_path / "train.out"
    layout = ["--nodes=3", "--ntasks-per-node=2"] if mode == "spare" else SLURM_NODES
    env = dict(fabric_env, HPCDDP_HEAL_DIR=str(tmp_path / "heal"),
               **({"HPCDDP_SPARE_NODES": "1"} if mode == "spare" else {}))
    job = fabric_slurm.sbatch(*layout, "--chdir", ROOT, "--output", log,
                              ROOT / "slurm" / "train.sbatch", "--run-dir", tmp_path / "run",
                              *SLURM_EPOCHS, env=env)
    _fail_fabric_link_at_epoch_3(fabric_cluster, log, victim)
    if mode == "spare":
        info = fabric_slurm.wait(job, timeout=600)
        assert info["Restarts"] == "0"  # healed inside the allocation, not requeued
        assert f"hpcddp: training on {nodes[0]},{nodes[2]}" in read_log(log)
    else:
        assert fabric_slurm.wait(job, timeout=240)["JobState"] == "FAILED", \
            read_log(log)[-3000:]
        found = re.search(r"hpcddp: no spare node left; submitted job (\d+) to go on without "
                          rf"{victim}, from the last checkpoint", read_log(log))
        assert found, read_log(log)[-3000:]
        info = fabric_slurm.wait(int(found.group(1)), timeout=600)
        assert info["ExcNodeList"] == victim, info
        assert info["NodeList"] == f"{fabric_cluster.name}-n[1,3]", info
    text = read_log(log)
    assert info["JobState"] == "COMPLETED", text[-4000:]
    assert f"hpcddp: training on {nodes[0]},{victim}" in text, text[-3000:]
    # Named by the watchdog: the node's ranks lived on, silent behind the failed link.
    assert f"hpcddp: lost node {victim}: every rank on it silent to hpcddp's watchdog" in text, \
        text[-3000:]
    assert re.search(r"resumed from .*: continuing at epoch [1-9]", text), text[-3000:]
    assert (tmp_path / "heal" / "lost").read_text() == f"{victim}\n"
    assert final_result(text) == uninterrupted
    # Slurm never saw the node fail: its slurmd answered on the management network.
    state = fabric_slurm.run("sinfo", "-h", "-n", victim, "-o", "%T").split()
    assert state and state[0] in ("idle", "mixed", "allocated"), state
