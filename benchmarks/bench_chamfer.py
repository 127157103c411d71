"""Chamfer / nearest neighbour: pointops vs torch.cdist(x, y).pow(2).min(...), both directions.

Correctness first: for 512 random queries per direction, pointops' distances are compared with a
float64 brute force (and the baseline's with the same oracle). Then forward (both directions) and
forward + backward (chamfer_distance(...)[0].backward()) are timed with CUDA events. The norm=1 (L1)
rows compare with torch.cdist(x, y, p=1).
"""
import subprocess

import torch

import pointops
from common import markdown_table, time_ms

FULL_SIZES = [(32, 2048, 2048), (8, 8192, 8192), (1, 131072, 131072)]
QUICK_SIZES = [(2, 1024, 1024), (1, 4096, 4096)]
MATRIX_BYTES_LIMIT = 4 << 30  # the baseline materialises B x N x M distances; chunk above this


def torch_distances(x, y, norm=2):
    return torch.cdist(x, y).pow(2) if norm == 2 else torch.cdist(x, y, p=1)


def torch_nearest(x, y, norm=2):
    """The torch-native way: (squared) cdist and a min, in query chunks when the matrix is large."""
    B, N, M = x.shape[0], x.shape[1], y.shape[1]
    chunk = max(1, min(N, MATRIX_BYTES_LIMIT // max(1, B * M * x.element_size())))
    dists, idxs = [], []
    for start in range(0, N, chunk):
        d = torch_distances(x[:, start:start + chunk], y, norm)
        value, index = d.min(2)
        dists.append(value)
        idxs.append(index)
    return torch.cat(dists, 1), torch.cat(idxs, 1)


def torch_chamfer_loss(x, y, norm=2):
    d = torch_distances(x, y, norm)
    return d.min(2).values.mean() + d.min(1).values.mean()


def check_against_float64(x, y, dist, norm=2):
    g = torch.Generator().manual_seed(0)
    B, N = x.shape[0], x.shape[1]
    b = torch.randint(0, B, (512,), generator=g)
    i = torch.randint(0, N, (512,), generator=g)
    q = x[b, i].double()
    term = (lambda d: d * d) if norm == 2 else torch.abs
    ref = torch.stack([term(y[bb].double() - qq).sum(-1).min() for bb, qq in zip(b.tolist(), q)])
    got = dist[b, i].double()
    rel = ((got - ref).abs() / ref.clamp(min=1e-30)).max().item()
    return rel


def fp32_pair_ceiling():
    """Point pairs/s if the FP32 pipes did nothing but the 6 instructions of (x - y)^2 in 3-D
    (3 FADD, 1 FMUL, 2 FFMA): SMs x 128 lanes x max SM clock / 6."""
    try:
        mhz = float(subprocess.run(["nvidia-smi", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=20).stdout.split()[0])
    except Exception:
        return None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return sms * 128 * mhz * 1e6 / 6


def run(quick: bool = False) -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = QUICK_SIZES if quick else FULL_SIZES
    ceiling = fp32_pair_ceiling() if device == "cuda" else None
    rows = []
    for dtype, norm in ((torch.float32, 2), (torch.float16, 2), (torch.float32, 1)):
        for B, N, M in sizes:
            if norm == 1 and N * M >= 131072 * 131072:
                continue  # torch's p=1 cdist is a plain loop kernel: minutes at this size
            g = torch.Generator(device=device).manual_seed(1)
            x = torch.randn(B, N, 3, device=device, generator=g).to(dtype)
            y = torch.randn(B, M, 3, device=device, generator=g).to(dtype)
            pairs = 2 * B * N * M
            big = N * M >= 131072 * 131072
            dist1, dist2, _, _ = pointops.chamfer(x, y, norm=norm)
            err = max(check_against_float64(x, y, dist1, norm), check_against_float64(y, x, dist2, norm))
            base_dist, _ = torch_nearest(x, y, norm)
            base_err = check_against_float64(x, y, base_dist, norm)
            repeat, warmup = (10, 2) if big else (30, 5)
            t_fwd = time_ms(lambda: pointops.chamfer(x, y, norm=norm), warmup, repeat)
            t_base_fwd = time_ms(lambda: (torch_nearest(x, y, norm), torch_nearest(y, x, norm)), 1 if big else 3,
                                 3 if big else 10)
            xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
            t_fb = time_ms(lambda: pointops.chamfer_distance(xg, yg, norm=norm)[0].backward(), warmup, repeat)
            if B * N * M * x.element_size() <= MATRIX_BYTES_LIMIT:
                t_base_fb = time_ms(lambda: torch_chamfer_loss(xg, yg, norm).backward(), 3, 10)
                base_fb = f"{t_base_fb:.3f}"
                speed_fb = f"{t_base_fb / t_fb:.1f}x"
            else:
                base_fb, speed_fb = "n/a (matrix too large)", "-"
            rate = pairs / (t_fwd * 1e-3)
            rows.append([
                f"{B}x{N}x{M}", str(dtype).replace("torch.", "") + ("" if norm == 2 else ", norm=1 (L1)"), f"{t_fwd:.3f}", f"{t_base_fwd:.3f}",
                f"{t_base_fwd / t_fwd:.1f}x", f"{t_fb:.3f}", base_fb, speed_fb, f"{rate:.2e}",
                f"{100 * rate / ceiling:.0f}%" if ceiling else "-", f"{err:.1e} / {base_err:.1e}",
            ])
            del x, y, xg, yg
            if device == "cuda":
                torch.cuda.empty_cache()
    header = ["B x N x M", "dtype", "fwd ms", "torch fwd ms", "speed-up", "fwd+bwd ms", "torch fwd+bwd ms",
              "speed-up", "pairs/s (fwd)", "of FP32 ceiling", "max rel err pointops / torch"]
    text = "## Chamfer / nearest neighbour (both directions)\n\n"
    text += ("fwd: `pointops.chamfer(x, y)`; torch: `torch.cdist(x, y).pow(2).min(2)` and `.min(1)` "
             "(query-chunked when the distance matrix exceeds 4 GiB). fwd+bwd: "
             "`chamfer_distance(x, y)[0].backward()` vs the same loss built on cdist (norm=1 rows: "
             "`cdist(x, y, p=1)`). pairs/s = 2BNM / fwd time. "
             "FP32 ceiling = SMs x 128 x max SM clock / 6 instructions per pair (squared L2). Errors: max relative "
             "error of 512 sampled distances against float64.\n\n")
    return text + markdown_table(header, rows)
