"""One measurement job on the emulated cluster, started by ``bench_network.py``: prints
``RESULT <json>`` on rank 0.

    net_job.py allreduce --sizes-mib 1,16,64 --iters 5
    net_job.py ddp --steps 10 [--kinds no_communication,hpcddp]
    net_job.py pingpong --sizes-kib 4,64,1024,8192 --iters 5

allreduce: hpcddp's reductions (the automatic choice, the ring, node-aware where nodes
hold several ranks), MPI's blocking ``Allreduce`` and non-blocking ``Iallreduce``, and
gloo, interleaved on the same float32 buffers.
ddp: the step of ``bench_ddp``'s MLP (24 MiB of gradients) with no communication,
hpcddp's DDP and torch's DDP on gloo, in fp32, with fp16/bf16 compression and PowerSGD
(``--kinds``: some of them), and the bytes of hpcddp's buckets in the order they are
reduced.
pingpong: one message's seconds (half a round trip) between rank 0 and the last rank,
per size, and how fast rank 0 sums and copies float32 buffers (``bench_scale.py`` fits
its model of the fabric to them).
"""

import argparse
import copy
import json
import os

import numpy as np
import torch
from mpi4py import MPI
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
from bench_ddp import MODELS, _stepper
from common import interleaved_seconds, make_gloo_group, median_ms
from hpcddp.transport import Transport


def _spread(values):
    return {"median_ms": median_ms(values), "min_ms": float(np.min(values) * 1e3),
            "max_ms": float(np.max(values) * 1e3)}


def allreduce(world, gloo, args):
    transports = {"hpcddp_auto": Transport(world.comm, reduction=world.reduction),
                  "hpcddp_ring": Transport(world.comm, reduction="ring"),
                  "hpcddp_mpi": Transport(world.comm, reduction="mpi")}
    if world.local_size > 1 and world.num_nodes > 1:
        transports["hpcddp_node"] = Transport(world.comm, reduction="node")
    rows = []
    for mib in [float(s) for s in args.sizes_mib.split(",")]:
        count = int(mib * (1 << 20)) // 4
        tensor = torch.ones(count)
        array = np.ones(count, dtype=np.float32)
        runs = {name: (lambda t=t: t.allreduce(tensor).wait()) for name, t in transports.items()}
        runs["mpi_allreduce"] = lambda: world.comm.Allreduce(MPI.IN_PLACE, array)
        runs["mpi_iallreduce"] = lambda: world.comm.Iallreduce(MPI.IN_PLACE, array).Wait()
        runs["gloo"] = lambda: gloo.allreduce([tensor]).wait()
        samples = interleaved_seconds(world.comm, runs, args.iters)
        rows.append({"bytes": count * 4, **{k: _spread(v) for k, v in samples.items()}})
    return {"reduction": world.reduction, "reduction_reason": world.reduction_reason,
            "rows": rows}


def ddp(world, gloo, args):
    make, data = MODELS["mlp"]
    torch.manual_seed(0)
    base = make()
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())

    def ours(hook=None, state=None):
        model = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
        if hook is not None:
            model.register_comm_hook(state, hook)
        return _stepper(model)

    def theirs(hook=None, state=None):
        model = TorchDDP(copy.deepcopy(base), process_group=gloo, bucket_cap_mb=25)
        if hook is not None:
            model.register_comm_hook(state, hook)
        return _stepper(model)

    def powersgd(group):
        return psgd.PowerSGDState(group, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                  min_compression_rate=2)

    steppers = {
        "no_communication": _stepper(copy.deepcopy(base)),
        "hpcddp": ours(),
        "torch_ddp_gloo": theirs(),
        "hpcddp_fp16": ours(hpcddp.fp16_compress_hook),
        "hpcddp_bf16": ours(hpcddp.bf16_compress_hook),
        "torch_ddp_gloo_fp16_hook": theirs(default_hooks.fp16_compress_hook, gloo),
        "hpcddp_powerSGD_rank4": ours(psgd.powerSGD_hook, powersgd(None)),
        "torch_ddp_gloo_powerSGD_rank4": theirs(psgd.powerSGD_hook, powersgd(gloo)),
    }
    if args.kinds:
        steppers = {k: fn for k, fn in steppers.items() if k in args.kinds.split(",")}
    x, y = data()
    runs = {k: (lambda fn=fn: fn(x, y)) for k, fn in steppers.items()}
    for fn in runs.values():
        for _ in range(3):
            fn()  # warm-up: bucket rebuild, PowerSGD past its start
    samples = interleaved_seconds(world.comm, runs, args.steps)
    probe = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    params = list(probe.parameters())
    buckets = [sum(params[i].numel() * params[i].element_size() for i in layout.params)
               for layout in probe.reducer.layouts]
    return {"grad_bytes": grad_bytes, "reduction": world.reduction, "bucket_bytes": buckets,
            "steps": {k: _spread(v) for k, v in samples.items()}}


def pingpong(world, _gloo, args):
    """Half a round trip between rank 0 and the last rank, per size; sum and copy rates."""
    peer, rows = world.size - 1, []
    for kib in [int(s) for s in args.sizes_kib.split(",")]:
        buffer = np.zeros(kib * 256, dtype=np.float32)
        times = []
        for _ in range(args.iters + 1):  # the first one connects and warms up
            world.comm.Barrier()
            started = MPI.Wtime()
            if world.rank == 0:
                world.comm.Send(buffer, dest=peer)
                world.comm.Recv(buffer, source=peer)
            elif world.rank == peer:
                world.comm.Recv(buffer, source=0)
                world.comm.Send(buffer, dest=0)
            times.append((MPI.Wtime() - started) / 2)
        rows.append({"bytes": buffer.nbytes, "seconds": sorted(times[1:])})
    big = np.ones(4 << 20, dtype=np.float32)
    other = np.ones_like(big)
    sums = [_timed(lambda: np.add(big, other, out=big)) for _ in range(5)]
    copies = [_timed(lambda: np.copyto(big, other)) for _ in range(5)]
    return {"rows": rows, "sum_bytes_per_s": big.nbytes / float(np.median(sums)),
            "copy_bytes_per_s": big.nbytes / float(np.median(copies))}


def _timed(fn) -> float:
    started = MPI.Wtime()
    fn()
    return MPI.Wtime() - started


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["allreduce", "ddp", "pingpong"])
    parser.add_argument("--sizes-mib", default="1,16,64")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--kinds", default="")
    parser.add_argument("--sizes-kib", default="4,64,1024,8192")
    args = parser.parse_args()
    world = hpcddp.init()
    gloo, _backend, _store = make_gloo_group(world)
    result = {"allreduce": allreduce, "ddp": ddp, "pingpong": pingpong}[args.what](
        world, gloo, args)
    result.update(size=world.size, nodes=world.num_nodes, ranks_per_node=world.local_size,
                  threads_per_rank=torch.get_num_threads(), ucx_tls=os.environ.get("UCX_TLS"))
    if world.is_main:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
