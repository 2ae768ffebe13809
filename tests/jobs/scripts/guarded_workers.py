"""A guarded training script whose module level imports every public hpcddp package,
and a DataLoader whose workers start by argv[1] (spawn or forkserver): each worker
imports the script again, so it imports them all, and must start no MPI in doing so."""

import sys

import torch

import hpcddp
import hpcddp.horovod as hvd  # noqa: F401
from hpcddp import checkpoint, elastic  # noqa: F401
from hpcddp.data import ShardedLoader  # noqa: F401
from hpcddp.ddp import DistributedDataParallel  # noqa: F401


def main():
    world = hpcddp.init()
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=2,
                                         multiprocessing_context=sys.argv[1])
    total = sum(int(batch.sum()) for batch in loader)
    world.barrier()
    print(f"rank {world.rank}: total={total}", flush=True)


if __name__ == "__main__":
    main()
