"""An emulated cluster of three nodes (network namespaces, ``tools.testbed``) for the
tests in this folder, or a skip that says why. It is removed at the end of the session,
also when a test fails; ``make test-cluster`` removes it again should pytest be killed."""

import pytest

from tools.testbed import EmulatedCluster, SlurmCluster, Unavailable

NAME = "hdtest"  # also in the Makefile's test-cluster target


@pytest.fixture(scope="session")
def cluster():
    try:
        built = EmulatedCluster.up(nodes=3, name=NAME)
    except Unavailable as why:
        pytest.skip(f"no emulated cluster here: {why}")
    try:
        yield built
    finally:
        built.down()


@pytest.fixture
def healthy(cluster):
    """The cluster, its links restored after the test whatever it did to them."""
    yield cluster
    for node in cluster.nodes:
        cluster.set_link(node, True)
        cluster.shape(node, None)


@pytest.fixture(scope="session")
def slurm_nodes(cluster):
    """A real Slurm on the emulated nodes: slurmctld on the bridge, a slurmd in each node."""
    try:
        slurm = SlurmCluster.start(cpus=2, nodes=cluster)
    except Unavailable as why:
        pytest.skip(f"no Slurm on the emulated cluster: {why}")
    yield slurm
    slurm.stop()
