"""``GradBucket``: one bucket of gradients, as the reducer fills it and a hook sees it.

A bucket is one flat buffer of one dtype on one device, with a view per parameter. A
``solo`` bucket (one large parameter in host memory, ``buckets.py``) instead adopts the
gradient autograd produced and is reduced in it: no copy in, no copy back, and no
buffer of its own unless a gradient cannot be adopted (one that needs autograd, or is
not contiguous). The reducer fills a bucket as gradients arrive; once full, the bucket
hook (``hooks.py``) decides what is done to it and returns a handle whose result is the
reduced buffer. The methods a hook uses are those of torch's ``GradBucket``:
``index()``, ``buffer()``, ``set_buffer()``, ``is_last()``, ``parameters()``,
``gradients()``.
"""

from typing import List, Optional

import torch

__all__ = ["GradBucket", "is_view_of"]


def is_view_of(grad: Optional[torch.Tensor], view: torch.Tensor) -> bool:
    """Whether ``grad`` is ``view`` (a ``.grad`` made a view of its bucket)."""
    return grad is not None and grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


class GradBucket:
    """One bucket of gradients.

    Args:
        index: the bucket's position in launch order.
        count: how many buckets there are.
        layout: its ``BucketLayout`` (parameter indices and offsets).
        params: every parameter of the model, indexed as in ``layout``.
    """

    __slots__ = ("_index", "_count", "layout", "_storage", "_views", "owned", "_owned_views",
                 "_params", "_buffer", "pending", "route", "handle")

    def __init__(self, index: int, count: int, layout, params: List[torch.Tensor]):
        self._index, self._count, self.layout = index, count, layout
        self._params = [params[i] for i in layout.params]
        self.owned: Optional[torch.Tensor] = None  # the bucket's own buffer, once made
        self._owned_views: Optional[List[torch.Tensor]] = None
        if not layout.solo:
            self._own()
        self.release()  # storage: the own buffer, made on first use for a solo bucket
        self.pending = set()
        self.route = None   # how this buffer reaches MPI, chosen once by the reducer
        self.handle = None  # the hook's handle during a synchronized backward

    def _own(self) -> None:
        first = self._params[0]
        self.owned = torch.zeros(self.layout.numel, dtype=first.dtype, device=first.device)
        self._owned_views = [self.owned[o:o + p.numel()].view_as(p)
                             for p, o in zip(self._params, self.layout.offsets)]

    @property
    def storage(self) -> torch.Tensor:
        """The flat buffer the reduction works in: the bucket's own, or a solo bucket's
        adopted gradient."""
        if self._storage is None:
            if self.owned is None:
                self._own()
            self._storage, self._views = self.owned, self._owned_views
        return self._storage

    @property
    def views(self) -> List[torch.Tensor]:
        """One view of ``storage`` per parameter, shaped like it."""
        self.storage  # noqa: B018 - makes the buffer if there is none yet
        return self._views

    # -- torch's GradBucket ----------------------------------------------------------------

    def index(self) -> int:
        """The bucket's index; bucket 0 is launched first."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The flat tensor holding this bucket's gradients (or what ``set_buffer`` gave)."""
        return self.storage if self._buffer is None else self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        """Replace what ``buffer()`` returns for the rest of this bucket's reduction
        (e.g. a compressed copy that an inner hook then reduces)."""
        self._buffer = tensor

    def is_last(self) -> bool:
        """Whether this is the last bucket to be launched in a backward."""
        return self._index == self._count - 1

    def parameters(self) -> List[torch.Tensor]:
        """The bucket's parameters, in bucket order."""
        return list(self._params)

    def gradients(self) -> List[torch.Tensor]:
        """One view of ``buffer()`` per parameter, shaped like it."""
        if self._buffer is None or self._buffer is self.storage:
            return list(self.views)
        return [self._buffer[o:o + p.numel()].view_as(p)
                for p, o in zip(self._params, self.layout.offsets)]

    # -- the reducer's side -----------------------------------------------------------------

    def fill(self, position: int, grad: torch.Tensor, divisor: int) -> None:
        """Put parameter ``position``'s gradient into the bucket, divided by ``divisor``.

        This is the one place gradients are divided: the copy into the bucket costs the
        division nothing (torch's reducer fuses it the same way). A gradient that already
        is the bucket's view (``gradient_as_bucket_view``), or that a solo bucket adopts,
        is divided where it stands.
        """
        if self.layout.solo and _adoptable(grad, self._params[0]):
            self._storage, self._views = grad.view(-1), [grad]
            if divisor != 1:
                grad.div_(divisor)
            return
        view = self.views[position]
        if grad.data_ptr() == view.data_ptr() and grad.shape == view.shape:
            if divisor != 1:
                view.div_(divisor)
        elif divisor != 1:
            torch.div(grad, divisor, out=view)
        else:
            view.copy_(grad)

    def start(self, hook) -> None:
        """Hand the full bucket to ``hook``; keep its handle."""
        self._buffer = self.storage
        self.handle = hook(self)

    def finish(self) -> torch.Tensor:
        """Wait for the hook's handle; the reduced values end up in ``storage``."""
        result: Optional[torch.Tensor] = self.handle.wait()
        if result is not None and result is not self.storage:
            self.storage.copy_(result.reshape(-1))
        self.handle = None
        return self.storage

    def copy_back(self, as_view: bool, globally_used=None) -> None:
        """Leave the reduced values in each parameter's ``.grad`` (a view of the bucket
        with ``as_view``); a parameter no rank used (``globally_used[index]`` 0) keeps
        its ``.grad`` (None)."""
        for index, param, view in zip(self.layout.params, self._params, self.views):
            if globally_used is not None and not globally_used[index]:
                continue
            if param.grad is None:
                param.grad = view if as_view else view.clone()
            elif not is_view_of(param.grad, view):
                param.grad.copy_(view)

    def release(self) -> None:
        """Let go of an adopted gradient (after its backward); back to the own buffer."""
        self._storage, self._views, self._buffer = self.owned, self._owned_views, None


def _adoptable(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether a solo bucket can reduce ``grad`` where it lies: a plain dense contiguous
    tensor shaped like its parameter that autograd does not track (``create_graph``)."""
    return (grad.layout == torch.strided and not grad.requires_grad and grad.is_contiguous()
            and grad.dtype == param.dtype and grad.device == param.device
            and grad.shape == param.shape)
