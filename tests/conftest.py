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


def pytest_collection_modifyitems(items):
    """Marks `cuda` every test that needs a GPU: a CUDA parametrisation or name, or a skip
    condition whose reason names CUDA. The GPU machine runs exactly these (`-m cuda` in
    scripts/gpu_check.sh); CI on the CPU runs the rest."""
    for item in items:
        needs_gpu = "cuda" in item.name.lower() or any(
            "cuda" in str(mark.kwargs.get("reason", "")).lower() for mark in item.iter_markers("skipif"))
        if needs_gpu:
            item.add_marker(pytest.mark.cuda)


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


def check_cuda_graph(step, refill, exact=(), seeds=(1, 2), rtol=1e-5, atol=1e-6):
    """Captures step() -- a tuple of tensors, forward and backward -- in a CUDA graph after a warm-up
    on a side stream; then for each seed refills the static inputs in place (refill(seed)), replays
    and compares with an eager step(): bitwise for the outputs at the indices in `exact` (the
    deterministic ones), to float rounding for the others (sums whose order may differ, atomics)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up outside the capture (allocator, lazy initialisation)
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    replays = []
    for seed in seeds:
        with torch.no_grad():
            refill(seed)
        graph.replay()
        torch.cuda.synchronize()
        expected = step()
        for i, (got, want) in enumerate(zip(captured, expected)):
            if i in exact:
                assert torch.equal(got, want), f"output {i} of the replay differs from eager"
            else:
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        replays.append([t.clone() for t in captured])
    assert any(not torch.equal(a, b) for a, b in zip(*replays[:2])), "the replays recomputed nothing"
