"""A Horovod program as its users write it (``import horovod.torch as hvd``; argv[1]
names another module to import as ``hvd``, e.g. ``hpcddp.horovod``), which also trains
the same model in one process on the global batch and says whether they agree."""

import importlib
import os
import sys

import torch
from torch import nn

hvd = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "horovod.torch")

STEPS, PER_RANK = 4, 3


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 2))


def main():
    torch.set_num_threads(1)
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(n * PER_RANK, 5, generator=g), torch.randn(n * PER_RANK, 2,
                                                                        generator=g))
               for _ in range(STEPS)]
    net = model(10 + me)  # unlike until broadcast
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(net(x[me::n]), y[me::n]).backward()
        opt.step()
    one = model(10)
    one_opt = torch.optim.SGD(one.parameters(), lr=0.05, momentum=0.9)
    for x, y in batches:
        one_opt.zero_grad()
        nn.functional.mse_loss(one(x), y).backward()
        one_opt.step()
    agree = all(torch.allclose(p, q, rtol=1e-5, atol=1e-6)
                for p, q in zip(net.parameters(), one.parameters()))
    version = getattr(sys.modules.get("horovod"), "__version__", "-")
    print(f"rank {me} of {n}: horovod {version}, "
          f"{'agrees' if agree else 'DIFFERS'} with one process on the global batch, "
          f"fusion threshold {os.environ.get('HOROVOD_FUSION_THRESHOLD')}", flush=True)


if __name__ == "__main__":
    main()
