import os
from pathlib import Path

import pytest
import torch

import pointops

HAS_CUDA_BUILD = pointops.build_info()["cuda"]
HAS_CUDA = HAS_CUDA_BUILD and torch.cuda.is_available()

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA build of pointops and a CUDA GPU")

# CPU always; CUDA where a GPU and a CUDA build are present (skipped cleanly elsewhere).
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def data_dir() -> Path:
    """../shared/data beside the checkout, or $POINTOPS_DATA, or .data/ in the checkout (the GPU
    machine gets the data carried there). None when absent: data tests then skip."""
    repo = Path(__file__).resolve().parents[1]
    for candidate in (os.environ.get("POINTOPS_DATA"), repo.parent / "shared" / "data", repo / ".data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


@pytest.fixture
def shared_data():
    d = data_dir()
    if d is None:
        pytest.skip("../shared/data is not present")
    return d
