"""The Chamfer training step's timeline on a GPU (issue 19): where the GPU waits within one step.

    python scripts/debug/chamfer_step_timeline.py [B,N]      (default 8,8192; squared L2)

Runs warm steps (chamfer_distance forward + backward, gradients set to None first, as a training
loop does), then three steps under torch.profiler (CPU and CUDA activities) and prints, for the
last one, every CPU op of depth <= 2 and every GPU activity (kernels, memsets, copies) with its start
and end in µs from the step's first CPU event, sorted by start, then the GPU's idle gaps of >= 5 µs
inside the step. Writes the Chrome trace next to $OUT (or /tmp) as chamfer_step_trace.json."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import pointops


def main():
    B, N = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "8,8192").split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, N, 3, device="cuda", generator=g).requires_grad_()
    y = torch.randn(B, N, 3, device="cuda", generator=g).requires_grad_()

    def step():
        x.grad = None
        y.grad = None
        loss, _ = pointops.chamfer_distance(x, y)
        loss.backward()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            with record_function(f"step{i}"):
                step()
            torch.cuda.synchronize()
    trace = os.path.join(os.environ.get("OUT", "/tmp"), "chamfer_step_trace.json")
    prof.export_chrome_trace(trace)
    events = prof.events()
    marks = [e for e in events if e.name == "step2"]
    t0 = marks[0].time_range.start
    t_end_cpu = marks[0].time_range.end
    print(f"chamfer step timeline, {B} x {N}^2, {torch.cuda.get_device_name()}; t = 0: step2's first CPU event")
    rows = []
    for e in events:
        if e.time_range.start < t0:
            continue
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.append((e.time_range.start - t0, e.time_range.end - t0, "GPU", e.name[:90]))
        elif e.time_range.start <= t_end_cpu + 2000 and e.name != "step2" and (e.cpu_parent is None or
                                                                              e.cpu_parent.name == "step2" or
                                                                              (e.cpu_parent.cpu_parent is not None and
                                                                               e.cpu_parent.cpu_parent.name == "step2")):
            rows.append((e.time_range.start - t0, e.time_range.end - t0, f"CPU t{e.thread}", e.name[:90]))
    rows.sort()
    for start, end, where, name in rows:
        print(f"{start:9.1f} {end:9.1f} {end - start:8.1f}  {where:12s} {name}")
    gpu = sorted((s, e) for s, e, w, _ in rows if w == "GPU")
    if gpu:
        print(f"GPU busy from {gpu[0][0]:.1f} to {gpu[-1][1]:.1f} us; CPU step ends at {t_end_cpu - t0:.1f} us")
        busy_end = gpu[0][1]
        for s, e in gpu[1:]:
            if s - busy_end >= 5:
                print(f"  GPU idle {busy_end:9.1f} -> {s:9.1f} ({s - busy_end:.1f} us)")
            busy_end = max(busy_end, e)


if __name__ == "__main__":
    main()
