"""Hugging Face ``Trainer`` on hpcddp: ``hpcddp.init()`` first, then the usual script.

    mpiexec -n 2 python examples/hf_trainer.py --out /tmp/hf       # any MPI launcher
    srun --mpi=pmi2 -n 8 python examples/hf_trainer.py --out /tmp/hf

``init()`` gives torch.distributed its MPI-backed default group and exports torchrun's
variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``), which is how
Accelerate, under the Trainer, learns that the run is distributed: it wraps the model in
torch's DDP over hpcddp's group, shards the data with its distributed sampler and keeps
``TrainingArguments(ddp_backend=...)`` unset. On a GPU node each rank is given the GPU
``init()`` chose (``LOCAL_RANK``); on a CPU, ``use_cpu=True`` as usual.

It trains a two-layer GPT-2 made from a config (no download: the machine may have no
network) on a synthetic corpus of token ids, and with ``--out`` rank 0 writes the loss
of every step, a digest of the final weights and the weights. ``--reference`` runs the same training
on torch's gloo backend, started the usual way (``MASTER_ADDR``/``RANK`` from the MPI
launcher's ranks, no hpcddp), for the comparison the tests make.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import torch

STEPS, BATCH, LENGTH, VOCAB = 8, 4, 32, 256


def _corpus(size: int = 256):
    """Token sequences with structure to learn: each is a run of a random stride."""
    generator = torch.Generator().manual_seed(1234)
    starts = torch.randint(0, VOCAB, (size, 1), generator=generator)
    strides = torch.randint(1, 7, (size, 1), generator=generator)
    ids = (starts + strides * torch.arange(LENGTH)) % VOCAB
    return [{"input_ids": row, "labels": row} for row in ids]


def _reference_group() -> None:
    """torch.distributed on gloo, from the MPI launcher's ranks: what a user without
    hpcddp writes (the first rank's address would come from the job's host list)."""
    import socket
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    port = None
    if comm.rank == 0:  # a port the kernel finds free (two jobs may run side by side)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(comm.rank),
                      WORLD_SIZE=str(comm.size), LOCAL_RANK=str(comm.rank),
                      LOCAL_WORLD_SIZE=str(comm.size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="rank 0 writes result.json here")
    parser.add_argument("--reference", action="store_true",
                        help="torch's gloo backend, no hpcddp (for comparison)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.reference:
        _reference_group()
        backend = "gloo"
    else:
        import hpcddp
        world = hpcddp.init()
        backend = None  # the default group is hpcddp's already
        if world.device.type == "cuda":
            torch.cuda.set_device(world.device)

    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB,
                                       n_positions=LENGTH))
    out = Path(args.out or "hf-trainer-out")
    training = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=BATCH, max_steps=STEPS,
        learning_rate=3e-3, logging_steps=1, report_to=[], save_strategy="no", seed=0,
        data_seed=0, dataloader_drop_last=True, use_cpu=not torch.cuda.is_available(),
        ddp_backend=backend, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=_corpus())
    trainer.train()

    import torch.distributed as dist
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    digest = hashlib.sha256()
    for name, tensor in sorted(trainer.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    result = {"world_size": world_size, "backend": dist.get_backend() if world_size > 1 else None,
              "trainer_world_size": training.world_size,
              "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
              "weights_sha256": digest.hexdigest()}
    if training.process_index == 0:
        print(json.dumps(result), flush=True)
        if args.out:
            out.mkdir(parents=True, exist_ok=True)
            (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
            torch.save({k: v.detach().cpu() for k, v in trainer.model.state_dict().items()},
                       out / "weights.pt")
    if args.reference:
        # torch's gloo group, torn down at exit, aborted a rank now and then ("terminate
        # called without an active exception"), and destroyed explicitly it deadlocked
        # now and then (~ProcessGroupGloo joining its run-loop thread, which waits for the
        # GIL the destructor holds). The reference's results are written: leave without it.
        from mpi4py import MPI
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Barrier()
        MPI.Finalize()
        os._exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
