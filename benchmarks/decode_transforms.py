"""The decode pipeline both sides of bench_decode.py run: a module of its own, importing
neither MPI nor more of hpcddp than its JPEG decoder, for spawned worker processes to import."""

import numpy as np
import torch

from hpcddp.data.images import decode_jpeg

CROP = 224


def decode_crop_flip(sample, decoder="auto"):
    """JPEG bytes to a random 224x224 crop, flipped half the time: uint8, CHW."""
    image, label = sample
    pixels = decode_jpeg(image, decoder=decoder)
    top, left, flip = (int(v) for v in torch.randint(0, pixels.shape[0] - CROP + 1, (3,)))
    crop = pixels[top:top + CROP, left:left + CROP]
    if flip % 2:
        crop = crop[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1))), label


class Decoded(torch.utils.data.Dataset):
    """The peer's dataset: ``H5Dataset``'s sample, decoded per sample."""

    def __init__(self, inner, decoder="auto"):
        self.inner, self.decoder = inner, decoder

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return decode_crop_flip(self.inner[index], self.decoder)
