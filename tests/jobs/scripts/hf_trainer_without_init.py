"""The Hugging Face Trainer under mpiexec with hpcddp imported but ``hpcddp.init()``
forgotten. As written, each rank would train alone on all the data; with ``use_cpu``
(argument ``cpu``) Accelerate reads MPI's variables and asks gloo for a group, whose
rendezvous wants MASTER_ADDR."""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import hpcddp  # noqa: F401  (imported, never initialized)

torch.set_num_threads(1)
torch.manual_seed(0)
ids = torch.randint(0, 64, (32, 16))
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
training = TrainingArguments(output_dir="/tmp/hf-without-init", per_device_train_batch_size=4,
                             max_steps=4, report_to=[], save_strategy="no",
                             use_cpu=sys.argv[1:] == ["cpu"],
                             disable_tqdm=True)
trainer = Trainer(model=model, args=training,
                  train_dataset=[{"input_ids": row, "labels": row} for row in ids])
print(f"trainer world size {training.world_size}", flush=True)
trainer.train()
print("trained alone", flush=True)
