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


class DeterministicAlgorithms:
    """torch.use_deterministic_algorithms(enabled) inside the block; the previous setting (and its
    warn_only) restored after it."""

    def __init__(self, enabled=True):
        self.enabled = enabled

    def __enter__(self):
        self.previous = torch.are_deterministic_algorithms_enabled()
        self.previous_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(self.enabled)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous, warn_only=self.previous_warn_only)


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
