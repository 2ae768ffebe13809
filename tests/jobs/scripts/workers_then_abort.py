"""Each rank runs a DataLoader whose workers start by argv[1] (spawn or forkserver): its
queues hold POSIX semaphores named in /dev/shm. Each rank prints their names; then rank
1 raises, hpcddp aborts the job, and the launcher ends every rank with its process group
while the workers still run."""

import gc
import multiprocessing.synchronize
import sys

import torch

import hpcddp


def main():
    world = hpcddp.init()
    loader = torch.utils.data.DataLoader(list(range(64)), batch_size=2, num_workers=2,
                                         multiprocessing_context=sys.argv[1])
    batches = iter(loader)
    next(batches)
    names = sorted(o._semlock.name for o in gc.get_objects()
                   if isinstance(o, multiprocessing.synchronize.SemLock) and o._semlock.name)
    print(f"rank {world.rank} semaphores: {' '.join(names)}", flush=True)
    world.barrier()
    if world.rank == 1:
        raise RuntimeError("rank 1 fails while its DataLoader's workers run")
    world.barrier()  # rank 0 waits here until the launcher ends it


if __name__ == "__main__":
    main()
