"""Shuffled reading over 64 HDF5 shards: ShardedLoader against the per-sample h5py DataLoader.

Run: ``mpiexec -n 2 python benchmarks/bench_shards.py [--dir /tmp]``. The shards are
written once by ``hpcddp pack --shards`` (contiguous, 4 KiB float32 rows, 256 MiB in all)
and read from the page cache. Both sides read the same global shuffle
(``DistributedSampler`` over the concatenation); the peer is ``DataLoader`` over
``ConcatDataset`` of one ``H5Dataset`` per shard, with the same number of workers for
each run, and the loader is measured with and without its prefetch thread. Each run reads
``--batches`` batches of 64 per rank; runs are interleaved and repeated, median reported.
"""

import argparse
import glob
import os

import numpy as np
from torch.utils.data import ConcatDataset, DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import hpcddp
from common import interleaved_seconds, write
from hpcddp.data import H5Dataset, ShardedLoader
from hpcddp.data.pack import pack_shards

ROW, SHARDS, BATCH = 1024, 64, 64


def make_shards(world, folder, rows):
    root = os.path.join(folder, f"hpcddp-bench-shards-{rows}.h5")
    pattern = root[:-3] + "-*.h5"
    if world.rank == 0 and len(glob.glob(pattern)) != SHARDS:
        data = np.arange(rows, dtype=np.float32)[:, None] * np.ones(ROW, np.float32)
        pack_shards(root, {"x": data, "y": np.arange(rows)}, SHARDS, progress=False)
    world.comm.Barrier()
    return pattern, sorted(glob.glob(pattern))


def _take(iterable, batches):
    count = 0
    for n, (x, _) in enumerate(iterable):
        count += len(x)
        if n + 1 == batches:
            break
    return count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--batches", type=int, default=200, help="per rank and run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    world = hpcddp.init()
    pattern, paths = make_shards(world, args.dir, args.rows)
    for path in paths:  # into the page cache
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass
    epoch = iter(range(1, 10**6))

    loaders = {p: ShardedLoader(pattern, ["x", "y"], batch_size=BATCH, seed=1, prefetch=p)
               for p in (0, 2)}

    def sharded(prefetch):
        def run():
            loader = loaders[prefetch]
            loader.set_epoch(next(epoch))  # a new shuffle each time: no cached order
            return _take(loader, args.batches)
        return run

    def theirs(workers):
        dataset = ConcatDataset([H5Dataset(p, ["x", "y"]) for p in paths])

        def run():
            sampler = TorchSampler(dataset, world.size, world.rank, seed=1)
            sampler.set_epoch(next(epoch))
            # The default (fork) context, as bench_loader.py: this script imports mpi4py
            # at the top, which a spawned worker would import again.
            return _take(DataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                    num_workers=workers), args.batches)
        return run

    runs = {"sharded_loader_prefetch0": sharded(0), "sharded_loader_prefetch2": sharded(2),
            "dataloader_h5py_workers0": theirs(0), "dataloader_h5py_workers2": theirs(2)}
    times = interleaved_seconds(world.comm, runs, args.repeats)
    samples = BATCH * args.batches * world.size
    rate = {k: samples / float(np.median(v)) for k, v in times.items()}
    result = {
        "shards": len(paths), "rows": args.rows, "row_bytes": ROW * 4,
        "batches_per_rank": args.batches, "repeats": args.repeats,
        "backend": loaders[0].backend,
        "samples_per_s": rate,
        "files_opened_per_run": loaders[0]._reader.opened / (args.repeats + 1),
        "ratio_prefetch0_vs_workers0": rate["sharded_loader_prefetch0"]
        / rate["dataloader_h5py_workers0"],
        "ratio_prefetch2_vs_workers2": rate["sharded_loader_prefetch2"]
        / rate["dataloader_h5py_workers2"],
    }
    for loader in loaders.values():
        loader.close()
    if world.is_main:
        for key, value in rate.items():
            print(f"  {key:28} {value:12,.0f} samples/s")
        print(f"  loader / DataLoader: {result['ratio_prefetch0_vs_workers0']:.1f}x "
              f"(no workers, no prefetch), {result['ratio_prefetch2_vs_workers2']:.1f}x "
              f"(2 workers, prefetch 2)")
    write("shards", {"benchmark": "shuffled reading over 64 shards", "result": result}, world)


if __name__ == "__main__":
    main()
