"""The independent reference for the loader tests: torch's DataLoader + DistributedSampler
over ``H5Dataset`` (one file) or ``ConcatDataset`` of one ``H5Dataset`` per file."""

from torch.utils.data import ConcatDataset, DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from hpcddp.data import H5Dataset


def reference_batches(world, paths, batch_size, epoch, keys=("x", "y"), collate_fn=None,
                      **sampler_kwargs):
    """This rank's batches of epoch ``epoch``; ``paths`` is one path or a list of them."""
    if isinstance(paths, (list, tuple)):
        dataset = ConcatDataset([H5Dataset(p, list(keys)) for p in paths])
    else:
        dataset = H5Dataset(paths, list(keys))
    sampler = TorchSampler(dataset, world.size, world.rank, **sampler_kwargs)
    sampler.set_epoch(epoch)
    return list(DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                           collate_fn=collate_fn))
