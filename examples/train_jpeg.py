"""Train on JPEG-encoded images, decoded and randomly cropped in worker processes.

    mpiexec -n 2 python examples/train_jpeg.py --workers 2
    srun --mpi=pmi2 python examples/train_jpeg.py        # inside an allocation

Images are usually stored encoded, as variable-length bytes. Rank 0 writes scikit-learn's
digits, enlarged to 32x32, as JPEG bytes into HDF5 shards (``h5py.vlen_dtype(uint8)``).
Each rank's ShardedLoader reads its share of the global shuffle in batches and hands the
rows to ``--workers`` spawned processes, which decode each JPEG and crop a random 28x28
window (the centre one for evaluation). ``decode_jpeg`` decodes with simplejpeg, or with
Pillow where simplejpeg is not installed; Pillow writes the JPEGs. The workers never touch MPI, and the crops are
seeded per sample, so they are the same for any number of workers.

The training code sits under ``if __name__ == "__main__":``: a spawned worker imports this
script again (to find ``decode_train``), and must not start training or join the job.
"""

import argparse
import io
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import hpcddp
from hpcddp.data import ShardedLoader, decode_jpeg, jpeg_decoder
from hpcddp.data.pack import pack_arrays, pack_shards, shard_paths

SIZE, CROP = 32, 28


def _decode(image: torch.Tensor) -> np.ndarray:
    return decode_jpeg(image, gray=True).astype(np.float32) / 255.0


def decode_train(sample):
    """JPEG bytes to a random 28x28 crop (torch's generator, seeded per sample)."""
    image, label = sample
    pixels = _decode(image)
    top, left = (int(v) for v in torch.randint(0, SIZE - CROP + 1, (2,)))
    return torch.from_numpy(pixels[top:top + CROP, left:left + CROP].copy()), label


def decode_eval(sample):
    image, label = sample
    edge = (SIZE - CROP) // 2
    return torch.from_numpy(_decode(image)[edge:edge + CROP, edge:edge + CROP].copy()), label


class JpegCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x.unsqueeze(1))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def encode_digits(folder, shards=4):
    """Rank 0: the digits as 32x32 JPEGs in train shards and a test file, once."""
    from PIL import Image
    from sklearn.datasets import load_digits

    train, _ = shard_paths(os.path.join(folder, "jpeg-train.h5"), shards)
    test = os.path.join(folder, "jpeg-test.h5")
    if all(map(os.path.exists, train + [test])):
        return
    os.makedirs(folder, exist_ok=True)
    digits = load_digits()
    encoded = []
    for image in digits.images:
        picture = Image.fromarray((image * 255 / 16).astype(np.uint8)).resize(
            (SIZE, SIZE), Image.BILINEAR)
        buffer = io.BytesIO()
        picture.save(buffer, format="JPEG", quality=90)
        encoded.append(buffer.getvalue())
    order = np.random.default_rng(0).permutation(len(encoded))
    cut = int(0.8 * len(order))
    pick = lambda part: {"image": [encoded[i] for i in part],  # noqa: E731
                         "label": digits.target[part].astype(np.int64)}
    pack_shards(os.path.join(folder, "jpeg-train.h5"), pick(order[:cut]), shards,
                progress=False)
    pack_arrays(test, pick(order[cut:]), progress=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data", help="folder for the HDF5 files")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="decode processes per rank")
    args = parser.parse_args()

    world = hpcddp.init()
    torch.manual_seed(0)
    if world.rank == 0:
        encode_digits(args.data)
    world.comm.Barrier()
    train = ShardedLoader(os.path.join(args.data, "jpeg-train-*.h5"), ["image", "label"],
                          batch_size=args.batch_size, transform=decode_train,
                          num_workers=args.workers, device=world.device)
    test = ShardedLoader(os.path.join(args.data, "jpeg-test.h5"), ["image", "label"],
                         batch_size=128, shuffle=False, exact=True, transform=decode_eval,
                         num_workers=args.workers, device=world.device)
    model = hpcddp.DistributedDataParallel(JpegCNN().to(world.device))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        model.train()
        for x, y in train:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        counts = torch.zeros(2, device=world.device)
        with torch.no_grad():
            for x, y in test:
                counts += torch.stack([(model(x).argmax(1) == y).sum(),
                                      torch.tensor(len(y), device=world.device)])
        dist.all_reduce(counts)
        if world.rank == 0:
            print(f"epoch {epoch}: test_accuracy={counts[0] / counts[1]:.4f} "
                  f"({int(counts[1])} samples, {args.workers} {jpeg_decoder()} decode workers "
                  "per rank)",
                  flush=True)
    train.close()
    test.close()
    hpcddp.shutdown()


if __name__ == "__main__":
    main()
