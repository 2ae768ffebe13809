"""Clusters to test hpcddp on, built on this one machine (root only).

- ``EmulatedCluster`` (``nodes``, ``network``): network namespaces as nodes on one
  bridge, links shaped by ``tc tbf``, and the ``mpiexec`` arguments that start ranks on
  them;
- ``SlurmCluster`` (``slurm``): munge, slurmctld and slurmd, on this machine or one
  slurmd inside each emulated node.

Both raise ``Unavailable`` with the reason when this machine cannot provide them. From
the repository's root: ``python -m testbed up --nodes 2 --rate 1gbit`` (see
``__main__``). The tests reach it through pytest's ``pythonpath``, the benchmarks by
putting the repository's root on ``sys.path``. Standard library only; none of it ships
in the hpcddp package.
"""

from testbed.errors import Unavailable
from testbed.nodes import EmulatedCluster
from testbed.slurm import SlurmCluster

__all__ = ["EmulatedCluster", "SlurmCluster", "Unavailable"]
