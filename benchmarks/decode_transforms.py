"""The decode pipeline both sides of bench_decode.py run: a module of its own, importing
neither MPI nor hpcddp, for spawned worker processes to import."""

import io

import numpy as np
import torch
from PIL import Image

CROP = 224


def decode_crop_flip(sample):
    """JPEG bytes to a random 224x224 crop, flipped half the time: uint8, CHW."""
    image, label = sample
    with Image.open(io.BytesIO(image.numpy().tobytes())) as picture:
        pixels = np.asarray(picture.convert("RGB"))
    top, left, flip = (int(v) for v in torch.randint(0, pixels.shape[0] - CROP + 1, (3,)))
    crop = pixels[top:top + CROP, left:left + CROP]
    if flip % 2:
        crop = crop[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1))), label


class Decoded(torch.utils.data.Dataset):
    """The peer's dataset: ``H5Dataset``'s sample, decoded per sample."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return decode_crop_flip(self.inner[index])
