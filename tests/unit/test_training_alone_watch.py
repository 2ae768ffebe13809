"""The first-step check beside other global optimizer hooks (the timeline registers two):
torch iterates over its global hooks while it runs them, so the check must not remove
itself there ("OrderedDict mutated during iteration" at the first step)."""

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from hpcddp.backend.torch_init import watch_for_training_alone


def test_two_steps_run_beside_another_global_hook():
    seen = []
    watch_for_training_alone()
    other = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(opt))
    try:
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.ones(1, 2)).sum().backward()
            optimizer.step()  # this process was started by no launcher: nothing to refuse
        assert seen == [optimizer, optimizer]
    finally:
        other.remove()
