"""A LightningModule trained by ``lightning.Trainer(accelerator="cpu", devices=N,
strategy=DDPStrategy(process_group_backend=...))`` under mpiexec or srun.

argv: BACKEND HOW OUT_DIR. HOW is ``hpcddp-init`` (``hpcddp.init()`` first, Lightning
finds the group made) or ``lightning-init`` (Lightning initializes the group itself,
through ``init_process_group``). Every rank saves its final parameters under OUT_DIR.
"""

import os
import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

import hpcddp

backend, how, out_dir = sys.argv[1:4]
if how == "hpcddp-init":
    hpcddp.init()


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch, _index):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


L.seed_everything(0, verbose=False)
world_size = int(os.environ.get("PMI_SIZE") or os.environ.get("SLURM_NTASKS"))
trainer = L.Trainer(accelerator="cpu", devices=world_size, max_epochs=2,
                    strategy=DDPStrategy(process_group_backend=backend), logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
model = Model()
initial = {k: v.clone() for k, v in model.net.state_dict().items()}
trainer.fit(model, data())
import torch.distributed as dist  # noqa: E402

rank = dist.get_rank()
print(f"rank {rank}: backend {dist.get_backend()} world {dist.get_world_size()} "
      f"cluster {type(trainer.strategy.cluster_environment).__name__} "
      f"steps {trainer.global_step}", flush=True)
torch.save({"initial": initial, "final": model.net.state_dict()},
           os.path.join(out_dir, f"{backend}-{how}-rank{rank}.pt"))
# As a training script should end: gloo's worker threads still running when the
# interpreter is torn down can abort the process ("terminate called without an active
# exception"), so the group is destroyed while Python is whole.
dist.destroy_process_group()
