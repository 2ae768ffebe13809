"""What ``hpcddp.elastic`` costs a training loop: ``commit()`` (the model's and Adam's
state and each rank's random generators copied into kept buffers) against the DDP step
of bench_ddp's MLP, interleaved in one job, and the share of the step time a commit every
10 steps takes (the target: at most 2 %). ``sync()`` (every rank takes rank 0's state)
and a checkpoint written by ``commit`` (``checkpoint_every``) are timed beside them.

Run: ``mpiexec -n 2 python benchmarks/bench_elastic.py`` (1 torch thread per rank).
"""

import argparse
import shutil
import tempfile

import torch

import hpcddp
from hpcddp import elastic
from bench_ddp import MODELS
from common import interleaved_seconds, median_ms, write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--name", default="elastic", help="results/<name>.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = hpcddp.init()
    make, data = MODELS[args.model]
    torch.manual_seed(0)
    model = hpcddp.DistributedDataParallel(make(), bucket_cap_mb=25)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x, y = data()

    def adam_step():
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

    folder = world.comm.bcast(tempfile.mkdtemp(prefix="hpcddp-elastic-")
                              if world.is_main else None)
    state = elastic.State(model, optimizer, step=0, checkpoint=folder, checkpoint_every=0)
    adam_step()  # Adam's moments exist: the commit copies all of its state
    samples = interleaved_seconds(world.comm, {"step": adam_step, "commit": state.commit,
                                               "sync": state.sync}, args.steps)
    saves = interleaved_seconds(world.comm, {"checkpoint": state.save_checkpoint}, 3)
    world.comm.Barrier()
    if world.is_main:
        shutil.rmtree(folder, ignore_errors=True)
    ms = {k: median_ms(v) for k, v in {**samples, **saves}.items()}
    share = ms["commit"] / 10 / ms["step"]
    state_bytes = sum(t.numel() * t.element_size() for t in model.parameters()) * 3
    if world.is_main:
        print(f"{args.model}: DDP + Adam step {ms['step']:.2f} ms, commit {ms['commit']:.2f} "
              f"ms ({state_bytes / 2**20:.0f} MiB of model and Adam state), sync "
              f"{ms['sync']:.2f} ms, checkpoint {ms['checkpoint']:.1f} ms; a commit every "
              f"10 steps: {100 * share:.2f} % of the step time", flush=True)
    path = write(args.name, {"benchmark": "hpcddp.elastic's commit against a DDP step",
                             "model": args.model, "steps": args.steps,
                             "state_bytes": state_bytes, "median_ms": ms,
                             "commit_every_10_share": share,
                             "threads_per_rank": torch.get_num_threads()}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
