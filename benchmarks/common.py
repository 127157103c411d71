"""Timing helpers shared by every benchmark: CUDA events, warm-up, median of repeats."""
import statistics
import time

import torch


def time_ms(fn, warmup: int = 5, repeat: int = 30, cuda: bool = None) -> float:
    """Median wall time of fn() in milliseconds: CUDA events for GPU work, perf_counter for work on
    the host. `cuda` defaults to whether a GPU is present; pass False to time CPU work there."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def environment_line() -> str:
    import pointops

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    info = pointops.build_info()
    return (f"device: {dev}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
            f"pointops {info['version']} ({'CUDA' if info['cuda'] else 'CPU'} build)")


def markdown_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
