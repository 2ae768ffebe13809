"""``dist.init_process_group(backend="hpcddp")`` as torch users and frameworks call it,
under mpiexec with no RANK, WORLD_SIZE, MASTER_ADDR or MASTER_PORT. argv[1] says how:

- ``torch-first``: init_process_group (the name bound before ``import hpcddp``, as
  scripts written for torchrun do), then hpcddp.init();
- ``hpcddp-first``: hpcddp.init(), then ``dist.init_process_group``;
- ``import-order``: ``import hpcddp`` before torch is imported at all;
- ``framework``: rank and world_size passed, MASTER_ADDR/MASTER_PORT pointing nowhere
  (Lightning's MPIEnvironment passes both): no TCP store may be built;
- ``wrong-rank``: rank=0 passed on every rank.

Prints the world as torch and hpcddp see it, and an all_reduce against MPI's own.
"""

import os
import sys

how = sys.argv[1]
if how == "import-order":
    import hpcddp  # noqa: E402  (before torch)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import init_process_group  # noqa: E402

import hpcddp  # noqa: E402,F811

if how in ("torch-first", "import-order"):
    init_process_group(backend="hpcddp")
    world = hpcddp.init()
elif how == "hpcddp-first":
    world = hpcddp.init()
    dist.init_process_group(backend="hpcddp")
elif how == "framework":
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "192.0.2.1", "9"
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    dist.init_process_group("hpcddp", rank=comm.rank, world_size=comm.size)
    world = hpcddp.init()
elif how == "wrong-rank":
    size = os.environ.get("PMI_SIZE") or os.environ["OMPI_COMM_WORLD_SIZE"]  # Hydra, Open MPI
    dist.init_process_group("hpcddp", rank=0, world_size=int(size))
    world = hpcddp.get_world()

value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
expected = world.comm.allreduce(world.rank + 1)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} hpcddp {world.rank}/{world.size} "
      f"backend {dist.get_backend()} sum {value.item():g} mpi {expected} "
      f"same-comm {dist.get_world_size() == world.comm.size}", flush=True)
dist.destroy_process_group()
hpcddp.shutdown()
