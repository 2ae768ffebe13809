"""Train with hpcddp, then make a gloo group: which TCP ports each rank listens on, before
and after (tests/jobs/test_store.py)."""
import json
import sys

import torch
import torch.distributed as dist

import hpcddp
from listening import listening_ports

world = hpcddp.init()
torch.manual_seed(0)
model = hpcddp.DistributedDataParallel(torch.nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(16, 8)).sum().backward()
    opt.step()
loss = torch.tensor([1.0])
dist.all_reduce(loss)
dist.barrier()
trained = listening_ports()
group = dist.new_group(backend="gloo")
dist.all_reduce(loss, group=group)
with_gloo = listening_ports()
# One write for the line: under PYTHONUNBUFFERED, print() writes its text and its newline
# apart, and another rank's line can land between them in mpiexec's output.
sys.stdout.write("ports " + json.dumps({"rank": world.rank, "trained": trained,
                                        "gloo": with_gloo}) + "\n")
sys.stdout.flush()
dist.destroy_process_group(group)
hpcddp.shutdown()
