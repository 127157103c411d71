"""Where the Chamfer training step's time goes on a GPU (issue 19), per norm and size:

    python scripts/chamfer_step_probe.py [B,N ...]     (default 32,2048 8,8192)

For each size and norm (2 = squared L2, 1 = L1), with CUDA events (benchmarks/common.time_ms):
the forward on inputs without grad, the forward on inputs requiring grad (what a training step
runs), forward + backward (gradients accumulated into .grad, and set to None first as
optimizer.zero_grad() does), the backward op alone, and the step's host time (perf_counter); then the GPU kernels of five steps from
torch.profiler (CUDA time per kernel), so that a step slower than its kernels reads as host-bound
and a slow kernel names itself."""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import pointops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import time_ms  # noqa: E402


def host_us(fn, calls=200):
    """Median host microseconds of fn() over batches of calls, the queue drained between batches:
    what the step costs the CPU while the GPU keeps up."""
    import statistics
    import time
    for _ in range(10):
        fn()
    batches = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        batches.append((time.perf_counter() - t0) * 1e6 / (calls // 5))
    torch.cuda.synchronize()
    return statistics.median(batches)


def main():
    sizes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or [(32, 2048), (8, 8192)]
    print("chamfer step probe on", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    # This machine's host speed: torch's own smallest CUDA training step (hosts differ by up to 2x).
    w = torch.randn(64, 3, device="cuda", requires_grad=True)

    def torch_step():
        w.grad = None
        (w * 2).sum().backward()

    print(f"reference: torch (w * 2).sum().backward(), w (64, 3): {time_ms(torch_step, 5, 30, cuda=True):.3f} ms, "
          f"host {host_us(torch_step):.1f} us per step", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, N in sizes:
        x = torch.randn(B, N, 3, device="cuda", generator=g)
        y = torch.randn(B, N, 3, device="cuda", generator=g)
        xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
        for norm in (2, 1):
            fwd = time_ms(lambda: pointops.chamfer_distance(x, y, norm=norm), 5, 30, cuda=True)
            fwd_grad = time_ms(lambda: pointops.chamfer_distance(xg, yg, norm=norm), 5, 30, cuda=True)
            step = lambda: pointops.chamfer_distance(xg, yg, norm=norm)[0].backward()  # noqa: E731
            fb = time_ms(step, 5, 30, cuda=True)

            def fresh_step():  # a training loop's: optimizer.zero_grad() sets .grad to None (torch >= 2.0)
                xg.grad = yg.grad = None
                step()

            fb_none = time_ms(fresh_step, 5, 30, cuda=True)
            host = host_us(fresh_step)
            loss = pointops.chamfer_distance(xg, yg, norm=norm)[0]
            bwd = time_ms(lambda: torch.autograd.grad(loss, (xg, yg), retain_graph=True), 5, 30, cuda=True)
            print(f"B={B} N={N} norm={norm}: fwd {fwd:.3f} ms, fwd (inputs require grad) {fwd_grad:.3f} ms, "
                  f"fwd+bwd {fb:.3f} ms (grads accumulated), {fb_none:.3f} ms (grads None first), "
                  f"bwd alone {bwd:.3f} ms; host {host:.1f} us per step (grads None)", flush=True)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
