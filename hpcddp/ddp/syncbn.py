"""``SyncBatchNorm``: batch normalization over the global batch, on CPU and CUDA, by MPI.

torch's ``SyncBatchNorm`` refuses CPU tensors and needs a backend with its own
collectives. This one takes statistics over every rank's batch with two small messages
per layer and step:

- forward: each rank's count, mean and biased variance per channel, allgathered and
  combined as parallel variances are (Chan et al.), so a rank with an empty batch, or
  ranks with different batch sizes, weigh exactly what they hold;
- backward: the per-channel sums of ``dy`` and ``dy * (x - mean)``, allreduced; the
  weight and bias gradients stay local (DDP averages them like any other).

All layers of a job share one private communicator per process group, on which every
rank issues them in the same order (forward order, then autograd's backward order).
"""

from typing import Dict, Optional

import torch
from mpi4py import MPI
from torch import nn

from hpcddp.comm import lifetime
from hpcddp.backend.groups import comm_of
from hpcddp.runtime import get_world
from hpcddp.torch_compat import batchnorm_base
from hpcddp.transport import Transport, reads, writes

__all__ = ["SyncBatchNorm"]

class _Shared(lifetime.Closable):
    """The private communicator and transport SyncBatchNorm layers over one group share."""

    _what = "hpcddp SyncBatchNorm communicator"

    def __init__(self, parent, world):
        self.comm = parent.Dup()
        self.comm.Set_name("hpcddp.syncbn")
        # The world's reduction: where MPI's Iallreduce of device buffers fails (Open
        # MPI's libnbc), the gradient sums go round hpcddp's ring as DDP's buckets do.
        self.transport = Transport(self.comm, world.cuda_aware, reduction=world.reduction)
        self._opened()

    def _release(self):
        self.transport.issue_all()
        lifetime.free_comm(self.comm)


_shared: Dict[int, _Shared] = {}  # by parent communicator, made on first use


def _transport_for(process_group) -> Transport:
    world = get_world()
    if process_group is None:
        parent = world.comm
    elif isinstance(process_group, MPI.Comm):
        parent = process_group
    else:
        parent = comm_of(process_group)
    key = MPI._handleof(parent)
    held = _shared.get(key)
    if held is None or held.closed:
        held = _shared[key] = _Shared(parent, world)
    return held.transport


def _allgather(transport, tensor: torch.Tensor) -> torch.Tensor:
    comm = transport.comm
    gathered = tensor.new_empty((comm.size,) + tuple(tensor.shape))
    return transport.submit(
        f"SyncBatchNorm statistics of {tensor.numel()} values",
        [reads(tensor), writes(gathered)],
        lambda src, dst: comm.Iallgather(src.buf, dst.buf), result=gathered).wait()


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, transport):
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // max(channels, 1)
        if count:
            wide = x.to(torch.promote_types(x.dtype, torch.float32))
            var, mean = torch.var_mean(wide, dim=dims, correction=0)
        else:
            var = mean = torch.zeros(channels, device=x.device)
        local = torch.cat([mean, var, torch.tensor([float(count)], device=x.device)])
        everyone = _allgather(transport, local.double())
        counts = everyone[:, -1]
        total = counts.sum()
        if total == 0:
            raise ValueError("SyncBatchNorm: every rank's batch is empty; there are no "
                             "statistics to normalize with")
        means, variances = everyone[:, :channels], everyone[:, channels:2 * channels]
        mean64 = (counts[:, None] * means).sum(0) / total
        var64 = (counts[:, None] * (variances + (means - mean64) ** 2)).sum(0) / total
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean64.to(running_mean.dtype), alpha=momentum)
                unbiased = var64 * (total / max(total.item() - 1, 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean, invstd = mean64.to(x.dtype), torch.rsqrt(var64 + eps).to(x.dtype)
        shape = [1, channels] + [1] * (x.dim() - 2)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        out = xhat if weight is None else xhat * weight.view(shape) + bias.view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total, ctx.transport, ctx.dims, ctx.shape = float(total), transport, dims, shape
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, mean, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        grad_out = grad_out.contiguous()
        xmu = x - mean.view(shape)
        sum_dy = grad_out.sum(dims)
        sum_dy_xmu = (grad_out * xmu).sum(dims)
        sums = torch.cat([sum_dy, sum_dy_xmu])
        summed = ctx.transport.allreduce(sums.clone(), name="SyncBatchNorm gradient sums").wait()
        channels = sum_dy.numel()
        mean_dy = (summed[:channels] / ctx.total).view(shape)
        mean_dy_xmu = (summed[channels:] / ctx.total).view(shape)
        scale = invstd.view(shape) if weight is None else (invstd * weight).view(shape)
        grad_x = (grad_out - mean_dy - xmu * invstd.view(shape) ** 2 * mean_dy_xmu) * scale
        grad_weight = grad_bias = None
        if weight is not None:
            grad_weight = sum_dy_xmu * invstd if ctx.needs_input_grad[1] else None
            grad_bias = sum_dy if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


_BatchNorm = batchnorm_base()


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics span every rank's batch.

    Arguments and state_dict keys are torch's ``SyncBatchNorm``'s; it also runs on the
    CPU, and ``process_group`` may be an mpi4py communicator. Eval mode normalizes with
    the running statistics, locally.

    Example::

        model = hpcddp.SyncBatchNorm.convert_sync_batchnorm(model)
        model = hpcddp.DistributedDataParallel(model)

    .. warning:: Every forward and backward in training mode is collective: all ranks of
       the group run them, in the same order (a rank with an empty batch included).
    """

    def __init__(self, num_features, eps=1e-5, momentum: Optional[float] = 0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expected at least 2-D input (got {input.dim()}-D)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch_stats = self.training or (self.running_mean is None and
                                            self.running_var is None)
        update = self.training and self.track_running_stats
        if not use_batch_stats:
            return nn.functional.batch_norm(input, self.running_mean, self.running_var,
                                            self.weight, self.bias, False, factor, self.eps)
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if update else None, self.running_var if update else None,
            self.eps, factor, _transport_for(self.process_group))

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group=None) -> nn.Module:
        """Return ``module`` with every BatchNorm*D layer replaced by a ``SyncBatchNorm``
        holding the same parameters and statistics (the module itself if it is one)."""
        converted = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group)
            if module.affine:
                with torch.no_grad():
                    converted.weight = module.weight
                    converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
            converted.training = module.training
            if hasattr(module, "qconfig"):
                converted.qconfig = module.qconfig
        for name, child in module.named_children():
            converted.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return converted
