"""A usual training script with no ``if __name__ == "__main__":`` guard: ``hpcddp.init()``
(or, with argv[2] "torch", ``dist.init_process_group("hpcddp")``) at module level, then a
DataLoader whose workers start by argv[1] (spawn, forkserver or fork). A spawn or
forkserver worker imports this script again and reaches init()."""

import sys

import torch
import torch.distributed as dist

import hpcddp

if sys.argv[2:] == ["torch"]:
    dist.init_process_group("hpcddp")
world = hpcddp.init()
loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=2,
                                     multiprocessing_context=sys.argv[1])
total = sum(int(batch.sum()) for batch in loader)
world.barrier()
print(f"rank {world.rank}: total={total}", flush=True)
