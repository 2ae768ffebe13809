"""The decode pipeline: JPEG bytes in HDF5 decoded and randomly cropped in worker processes,
ShardedLoader against torch's DataLoader doing the same decode.

Run: ``mpiexec -n 1 python benchmarks/bench_decode.py [--dir /tmp]``. Rank 0 writes
``--images`` 256x256 RGB JPEGs (quality 90, smooth random content) once as a
variable-length uint8 dataset. Both sides decode every image, crop a random 224x224
window, flip half of them, and collate batches of 64: ShardedLoader with ``transform=``
and ``num_workers`` spawned workers, and ``DataLoader(Decoded(H5Dataset), sampler=
DistributedSampler, num_workers, multiprocessing_context="spawn",
persistent_workers=True)``. Workers are started before timing (a warm-up epoch), runs
are interleaved and repeated, median reported, in images/s and images/s per worker.

Both sides decode with ``--decoder`` (simplejpeg when installed, else Pillow). Before the
pipelines, each installed decoder decodes every image in this process, timed alone
(``decoders_images_per_s``): the measurement behind hpcddp's choice of decoder.
"""

import argparse
import functools
import importlib.util
import io
import os

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import hpcddp
from common import interleaved_seconds, write
from decode_transforms import Decoded, decode_crop_flip
from hpcddp.data import H5Dataset, ShardedLoader, decode_jpeg, jpeg_decoder
from hpcddp.data.pack import pack_arrays

SIDE, BATCH = 256, 64


def make_images(world, folder, count):
    path = os.path.join(folder, f"hpcddp-bench-jpeg-{count}.h5")
    if world.rank == 0 and not os.path.exists(path):
        rng = np.random.default_rng(0)
        encoded = []
        for _ in range(count):
            small = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            picture = Image.fromarray(small).resize((SIDE, SIDE), Image.BICUBIC)
            buffer = io.BytesIO()
            picture.save(buffer, format="JPEG", quality=90)
            encoded.append(buffer.getvalue())
        pack_arrays(path, {"image": encoded, "label": np.arange(count) % 1000},
                    progress=False)
    world.comm.Barrier()
    return path


def time_decoders(world, path, count, repeats):
    """Each installed decoder over every image, in this process: images/s, median."""
    rows = H5Dataset(path, ["image"])
    images = [rows[i][0].numpy() for i in range(count)]
    names = [n for n, module in (("pillow", "PIL"), ("simplejpeg", "simplejpeg"))
             if importlib.util.find_spec(module)]
    runs = {name: (lambda n=name: [decode_jpeg(i, decoder=n) for i in images]) for name in names}
    times = interleaved_seconds(world.comm, runs, repeats)
    return {name: count / float(np.median(v)) for name, v in times.items()}


def _count(iterable):
    return sum(len(label) for _, label in iterable)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decoder", default="auto", choices=["auto", "simplejpeg", "pillow"])
    args = parser.parse_args()
    world = hpcddp.init()
    decoder = jpeg_decoder(args.decoder)
    path = make_images(world, args.dir, args.images)
    decoders = time_decoders(world, path, args.images, args.repeats)
    mean_bytes = os.path.getsize(path) / args.images
    epoch = iter(range(1, 10**6))
    # The peer's spawned workers import this script again, and with it mpi4py: tell
    # mpi4py not to initialize MPI there (hpcddp's own workers get the same setting).
    os.environ["MPI4PY_RC_INITIALIZE"] = "false"

    loaders, peers, runs = {}, {}, {}
    for workers in args.workers:
        loaders[workers] = ShardedLoader(path, ["image", "label"], batch_size=BATCH, seed=1,
                                         transform=functools.partial(decode_crop_flip, decoder=decoder),
                                         num_workers=workers)
        dataset = Decoded(H5Dataset(path, ["image", "label"]), decoder)
        sampler = TorchSampler(dataset, world.size, world.rank, seed=1)
        peers[workers] = (sampler, DataLoader(
            dataset, batch_size=BATCH, sampler=sampler, num_workers=workers,
            multiprocessing_context="spawn", persistent_workers=True))

        def ours(loader=loaders[workers]):
            loader.set_epoch(next(epoch))
            return _count(loader)

        def theirs(peer=peers[workers]):
            peer[0].set_epoch(next(epoch))
            return _count(peer[1])

        runs[f"sharded_loader_workers{workers}"] = ours
        runs[f"dataloader_workers{workers}"] = theirs
    times = interleaved_seconds(world.comm, runs, args.repeats)
    rate = {k: args.images / float(np.median(v)) for k, v in times.items()}
    result = {
        "images": args.images, "jpeg_bytes_mean": mean_bytes, "side": SIDE, "crop": 224,
        "batch": BATCH, "repeats": args.repeats, "cpus": len(os.sched_getaffinity(0)),
        "backend": loaders[args.workers[0]].backend, "decoder": decoder,
        "decoders_images_per_s": decoders,
        "images_per_s": rate,
        "images_per_s_per_worker": {k: v / int(k.rsplit("workers", 1)[1])
                                    for k, v in rate.items()},
        "ratio_vs_dataloader": {w: rate[f"sharded_loader_workers{w}"]
                                / rate[f"dataloader_workers{w}"] for w in args.workers},
    }
    for loader in loaders.values():
        loader.close()
    if world.is_main:
        for key, value in decoders.items():
            print(f"  {key + ' alone, one process':28} {value:9,.0f} images/s")
        for key, value in rate.items():
            print(f"  {key:28} {value:9,.0f} images/s")
        for w, ratio in result["ratio_vs_dataloader"].items():
            print(f"  {w} worker(s): ShardedLoader / DataLoader = {ratio:.2f}x")
    write("decode", {"benchmark": "JPEG decode pipeline", "result": result}, world)


if __name__ == "__main__":
    main()
