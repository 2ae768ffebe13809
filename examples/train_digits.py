"""Train a small CNN on scikit-learn's handwritten digits with hpcddp, end to end.

    mpiexec -n 2 python examples/train_digits.py
    srun --mpi=pmi2 python examples/train_digits.py      # inside an allocation

The digits ship with scikit-learn (no download); rank 0 packs them into HDF5 with
``hpcddp pack``'s code. Training is a DistributedDataParallel CNN fed by ShardedLoader,
checkpointed every epoch and resumed automatically: run the same command again after an
interruption and it continues where it stopped.
"""

import argparse
import hashlib
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import hpcddp
import hpcddp.checkpoint as checkpoint
from hpcddp.data import ShardedLoader, progress
from hpcddp.data.pack import pack_arrays


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x.unsqueeze(1)))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def prepare_data(folder):
    """Pack the digits into train and test HDF5 files (rank 0 only, once)."""
    from sklearn.datasets import load_digits

    train, test = os.path.join(folder, "digits-train.h5"), os.path.join(folder, "digits-test.h5")
    if not (os.path.exists(train) and os.path.exists(test)):
        os.makedirs(folder, exist_ok=True)
        digits = load_digits()
        images = (digits.images / 16.0).astype(np.float32)
        labels = digits.target.astype(np.int64)
        order = np.random.default_rng(0).permutation(len(labels))
        cut = int(0.8 * len(labels))
        pack_arrays(train, {"x": images[order[:cut]], "y": labels[order[:cut]]}, progress=False)
        pack_arrays(test, {"x": images[order[cut:]], "y": labels[order[cut:]]}, progress=False)
    return train, test


def evaluate(model, loader, world):
    """Accuracy over the test set, every sample counted once across ranks (exact mode)."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for x, y in loader:
            counts[0] += (model(x).argmax(1) == y).sum().item()  # batches are on the device
            counts[1] += len(y)
    dist.all_reduce(counts)  # torch.distributed, on hpcddp's MPI-backed group
    model.train()
    return (counts[0] / counts[1]).item(), int(counts[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--run-dir", default="runs/digits")
    args = parser.parse_args()

    world = hpcddp.init()
    folder = args.run_dir
    paths = prepare_data(folder) if world.is_main else None
    train_path, test_path = world.comm.bcast(paths, root=0)

    torch.manual_seed(0)
    # Small buckets, so that even this small model has two: the first (the linear layers)
    # is reduced while the convolutions' gradients are computed (``hpcddp timeline``).
    model = hpcddp.DistributedDataParallel(DigitsCNN().to(world.device), bucket_cap_mb=0.02)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = ShardedLoader(train_path, ["x", "y"], batch_size=args.batch_size, seed=0,
                          device=world.device)
    test = ShardedLoader(test_path, ["x", "y"], batch_size=256, shuffle=False, exact=True,
                         device=world.device)
    ckpt = os.path.join(folder, "checkpoints")
    start, step = 0, 0
    resumed = checkpoint.load(ckpt, model, optimizer, loader=train)
    if resumed is not None:
        # A checkpoint taken at preemption is mid-epoch: the loader resumes inside it.
        start = resumed.epoch + 1 if resumed.extra["epoch_complete"] else resumed.epoch
        step = resumed.step
        if world.is_main:
            restart = os.environ.get("SLURM_RESTART_COUNT")
            print(f"resumed from {resumed.path}"
                  + (f" (Slurm restart {restart})" if restart else "")
                  + (f": continuing at epoch {start}, step {step}" if start < args.epochs else
                     f": all {args.epochs} epochs are already trained, so this run only "
                     f"evaluates. Train further with --epochs {args.epochs + 4}, or start "
                     f"afresh with --run-dir elsewhere (or rm -r {ckpt})"), flush=True)
    preemption = hpcddp.Preemption()
    if world.is_main:
        print(f"world_size={world.size} backend={train.backend} train_samples={train.length} "
              f"test_samples={test.length} threads_per_rank={world.num_threads} "
              f"nodes={world.num_nodes}", flush=True)

    for epoch in range(start, args.epochs):
        train.set_epoch(epoch)
        began, seen, total_loss = time.perf_counter(), 0, torch.zeros(2, dtype=torch.float64)
        # A bar on a terminal; in a batch log, a line every 30 s and at the epoch's end.
        batches = progress(train, desc=f"epoch {epoch}", disable=not world.is_main, leave=False)
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            total_loss += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
            seen += len(y)
            if preemption.requested():  # every rank agrees at this step boundary
                if not preemption.was_interrupt:  # Ctrl-C says so once, below
                    print(f"rank {world.rank}: preemption requested (signal received here: "
                          f"{preemption.received})", flush=True)
                checkpoint.save(ckpt, model, optimizer, loader=train, step=step, epoch=epoch,
                                extra={"epoch_complete": False}, keep_last=2)
                if world.is_main:
                    print(f"checkpointed at epoch {epoch} step {step}", flush=True)
                preemption.requeue_and_exit()
        dist.all_reduce(total_loss)
        rate = world.comm.allreduce(seen) / (time.perf_counter() - began)
        accuracy, counted = evaluate(model, test, world)
        checkpoint.save(ckpt, model, optimizer, loader=train, step=step, epoch=epoch,
                        extra={"epoch_complete": True}, keep_last=2)
        if world.is_main:
            tqdm.write(f"epoch {epoch}: train_loss={(total_loss[0] / total_loss[1]).item():.4f} "
                       f"test_accuracy={accuracy:.3f} ({counted} samples) "
                       f"samples/s={rate:.0f}")

    accuracy, counted = evaluate(model, test, world)
    assert counted == test.length, f"evaluated {counted} of {test.length} test samples"
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes()
                                     for p in model.parameters())).hexdigest()[:16]
    if world.is_main:
        print(f"parameters_sha256={digest}", flush=True)
        print(f"world_size={world.size} test_accuracy={accuracy:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
