"""Helpers shared by the demo modules: device synchronisation, timing, matplotlib."""
from __future__ import annotations

import pathlib
import statistics
import time
from typing import Any, Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device, repeat: int = 20, *,
            per_call: bool = False) -> tuple[Any, float]:
    """Call `fn` once (the warm-up, whose result is returned), then `repeat` more times, and return
    (result, milliseconds).

    per_call=False: the mean time of the repeats, the device synchronised only before and after the
    loop (throughput: one call's launches overlap the next call's host work).
    per_call=True: the median of the repeats, each call synchronised on its own (latency).
    """
    out = fn()
    sync(device)
    if not per_call:
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        sync(device)
        return out, (time.perf_counter() - start) / repeat * 1e3
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return out, statistics.median(times) * 1e3


def pyplot(prefix: str, path: pathlib.Path):
    """matplotlib.pyplot with the file-only Agg backend, or None (after saying that `path` will not
    be saved) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{prefix} matplotlib is not installed: {path.name} not saved (pip install matplotlib)")
        return None
    return plt


def save_figure(fig, path: pathlib.Path, prefix: str, **savefig_kwargs) -> None:
    """Save `fig` to `path` (creating its folder), close it and print the path."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, **savefig_kwargs)
    plt.close(fig)
    print(f"{prefix} saved {path}")
