"""Train a small DDP model on HDF5 data with checkpoints; write losses and parameters.

    python train_resume.py DATA CKPT OUT TOTAL [STOP]

Runs to step TOTAL, resuming from CKPT if it holds a checkpoint. With STOP, saves at
step STOP and ends the job there. Dropout, NumPy and Python randomness take part, so a
resume that loses any random state diverges.
"""

import json
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint
from hpcddp.data import ShardedLoader

data, ckpt, out, total = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
stop = int(sys.argv[5]) if len(sys.argv) > 5 else None

world = hpcddp.init()
torch.manual_seed(world.rank)  # ranks differ: dropout masks must come back per rank
np.random.seed(world.rank)
random.seed(world.rank)
model = hpcddp.DistributedDataParallel(
    nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3)),
    bucket_cap_mb=0.001)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
loader = ShardedLoader(data, ["x", "y"], batch_size=4, seed=7)

step, epoch = 0, 0
resumed = checkpoint.load(ckpt, model, optimizer, scheduler, loader=loader)
if resumed is not None:
    step, epoch = resumed.step, resumed.epoch
    print(f"rank {world.rank} resumed from {resumed.path} at step {step}", flush=True)
losses = []
while step < total:
    loader.set_epoch(epoch)
    for x, y in loader:
        noise = np.random.standard_normal() * 1e-3 + random.random() * 1e-3
        loss = F.mse_loss(model(x), y) + noise
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        losses.append(loss.item())
        if step == stop:
            checkpoint.save(ckpt, model, optimizer, scheduler, loader=loader, step=step,
                            epoch=epoch)
            break
        if step == total:
            break
    if step in (stop, total):
        break
    epoch += 1
params = [p.detach().numpy().tobytes().hex() for p in model.parameters()]
everyone = world.comm.gather({"losses": losses, "params": params}, root=0)
if world.is_main:
    with open(out, "w") as f:
        json.dump(everyone, f)
