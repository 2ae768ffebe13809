"""GPU tests skip on machines without one, unless ``HPCDDP_TEST_GPU=1`` says a GPU must be
there: then a missing GPU is a failure, so a GPU machine cannot silently skip them."""

import os

import pytest
import torch


def skip_or_fail_without_gpu(what: str) -> None:
    if torch.cuda.is_available():
        return
    if os.environ.get("HPCDDP_TEST_GPU", "0") == "1":
        pytest.fail(f"HPCDDP_TEST_GPU=1 but CUDA is not available: {what} cannot run")
    pytest.skip(f"{what} needs a GPU; this machine has none (HPCDDP_TEST_GPU=1 makes this "
                f"a failure)")
