"""Save one checkpoint of a model whose weights all equal STEP, as an MPI singleton.

    python save_once.py DIR STEP

Used under strace to kill the writer at chosen system calls.
"""

import sys

import torch
from mpi4py import MPI

import hpcddp.checkpoint as checkpoint

directory, step = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(256, 256)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(step)
checkpoint.save(directory, model, step=step, comm=MPI.COMM_SELF)
