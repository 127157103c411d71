"""Peer implementations (PyTorch3D, torch_cluster) built in-process for benchmarking.

The peers' CUDA sources are fetched, unmodified, into the git-ignored `.peers/` folder at the
repository root (`.peers/pytorch3d/csrc/...`, `.peers/torch_cluster/csrc/cuda/...`), next to a small
binding file of ours that exposes only their forward CUDA functions. Nothing from them is vendored
into pointops or committed. `load_pytorch3d()` / `load_torch_cluster()` JIT-build those sources with
`torch.utils.cpp_extension.load` and return the module, or None when the sources or CUDA are absent.

The wrappers below take the module plus the arguments of the peer's public Python function and do
what that function does around its CUDA call (default lengths / batch pointers, dtype casts, the
sort of PyTorch3D's knn_points), so a timing covers the same work as calling the peer library.

PyTorch3D's loss is timed as PyTorch3D itself runs it: its own `pytorch3d/ops/knn.py` and
`pytorch3d/loss/chamfer.py`, copied unmodified into `.peers/pytorch3d/python/pytorch3d/` beside a
stub `structures/pointclouds.py` (the loss only isinstance-checks that class), import the binding as
`pytorch3d._C` (`load_pytorch3d_chamfer_distance()`).
"""
import sys
from pathlib import Path

import torch

PEERS = Path(__file__).resolve().parents[1] / ".peers"
PYTORCH3D_DIR = PEERS / "pytorch3d"
TORCH_CLUSTER_DIR = PEERS / "torch_cluster"

PYTORCH3D_SOURCES = ("knn/knn.cu", "ball_query/ball_query.cu",
                     "sample_farthest_points/sample_farthest_points.cu")
TORCH_CLUSTER_SOURCES = ("knn_cuda.cu", "radius_cuda.cu", "fps_cuda.cu")


def _build(name, root, csrc, sources, extra_ldflags=()):
    binding = root / "binding.cpp"
    paths = [csrc / s for s in sources]
    if not torch.cuda.is_available() or not binding.exists() or not all(p.exists() for p in paths):
        return None
    from torch.utils.cpp_extension import load
    return load(name=name, sources=[str(binding)] + [str(p) for p in paths],
                extra_include_paths=[str(csrc)], extra_cuda_cflags=["-O3"],
                extra_ldflags=list(extra_ldflags), verbose=False)


def load_pytorch3d():
    """PyTorch3D's KNearestNeighborIdxCuda / BallQueryCuda / FarthestPointSamplingCuda, or None."""
    return _build("pytorch3d_peer", PYTORCH3D_DIR, PYTORCH3D_DIR / "csrc", PYTORCH3D_SOURCES)


def load_pytorch3d_chamfer_distance():
    """PyTorch3D's own ``pytorch3d.loss.chamfer_distance`` over its CUDA kernels, or None."""
    module = load_pytorch3d()
    python = PYTORCH3D_DIR / "python"
    if module is None or not (python / "pytorch3d" / "loss" / "chamfer.py").exists():
        return None
    sys.path.insert(0, str(python))
    import pytorch3d
    pytorch3d._C = module
    sys.modules["pytorch3d._C"] = module
    from pytorch3d.loss.chamfer import chamfer_distance
    return chamfer_distance


def load_torch_cluster():
    """torch_cluster's knn_cuda / radius_cuda / fps_cuda, or None.

    Upstream builds each op as its own library; linked together here, the non-inline __device__
    helper that each .cu gets from utils.cuh is defined three times (identically), hence the flag.
    """
    return _build("torch_cluster_peer", TORCH_CLUSTER_DIR, TORCH_CLUSTER_DIR / "csrc" / "cuda",
                  TORCH_CLUSTER_SOURCES, extra_ldflags=["-Wl,--allow-multiple-definition"])


def _full_lengths(x):
    return torch.full((x.shape[0],), x.shape[1], dtype=torch.int64, device=x.device)


# ---------------------------------------------------------------- PyTorch3D conventions
# Padded batches: p1 (N, P1, D) queries, p2 (N, P2, D) references, optional lengths (N,) int64.


def pytorch3d_knn(mod, p1, p2, K, lengths1=None, lengths2=None, norm=2, version=-1,
                  return_sorted=True):
    """As pytorch3d.ops.knn_points(...) forward: returns (idx, dists), both (N, P1, K).

    dists are squared L2 (norm=2) or L1 (norm=1); slots past lengths2[n] or past lengths1[n] hold
    idx 0 and dist 0. With K > 1 and return_sorted the rows are sorted ascending in Python, as
    PyTorch3D does (the CUDA kernels return them unsorted).
    """
    if p1.shape[0] != p2.shape[0] or p1.shape[2] != p2.shape[2]:
        raise ValueError("p1 and p2 must have the same batch and point dimensions.")
    if norm not in (1, 2):
        raise ValueError("Support for 1 or 2 norm.")
    p1, p2 = p1.contiguous(), p2.contiguous()
    lengths1 = _full_lengths(p1) if lengths1 is None else lengths1
    lengths2 = _full_lengths(p2) if lengths2 is None else lengths2
    idx, dists = mod.KNearestNeighborIdxCuda(p1, p2, lengths1, lengths2, norm, K, version)
    if K > 1 and return_sorted:
        if lengths2.min() < K:
            mask = lengths2[:, None] <= torch.arange(K, device=dists.device)[None]
            mask = mask[:, None].expand(-1, p1.shape[1], -1)
            dists[mask] = float("inf")
            dists, sort_idx = dists.sort(dim=2)
            dists[mask] = 0
        else:
            dists, sort_idx = dists.sort(dim=2)
        idx = idx.gather(2, sort_idx)
    return idx, dists


def pytorch3d_ball_query(mod, p1, p2, K, radius, lengths1=None, lengths2=None):
    """As pytorch3d.ops.ball_query(..., return_nn=False) forward: returns (idx, dists), (N, P1, K).

    The first K points of p2 (in index order) with squared distance < radius**2; unused slots hold
    idx -1 and dist 0.
    """
    if p1.shape[0] != p2.shape[0] or p1.shape[2] != p2.shape[2]:
        raise ValueError("p1 and p2 must have the same batch and point dimensions.")
    p1, p2 = p1.contiguous(), p2.contiguous()
    lengths1 = _full_lengths(p1) if lengths1 is None else lengths1
    lengths2 = _full_lengths(p2) if lengths2 is None else lengths2
    return mod.BallQueryCuda(p1, p2, lengths1.contiguous(), lengths2.contiguous(), K, radius)


def pytorch3d_fps(mod, points, K, lengths=None, random_start_point=False):
    """As pytorch3d.ops.sample_farthest_points(...) up to its CUDA call: returns idx (N, max K).

    K is an int, a list or an (N,) tensor; rows are padded with -1 past min(K[n], lengths[n]).
    (PyTorch3D then gathers the points with masked_gather; that gather is not done here.)
    """
    N, P, _ = points.shape
    device = points.device
    if lengths is None:
        lengths = torch.full((N,), P, dtype=torch.int64, device=device)
    elif lengths.shape != (N,):
        raise ValueError("points and lengths must have same batch dimension.")
    elif lengths.max() > P:
        raise ValueError("A value in lengths was too large.")
    if isinstance(K, int):
        K = torch.full((N,), K, dtype=torch.int64, device=device)
    elif isinstance(K, list):
        K = torch.tensor(K, dtype=torch.int64, device=device)
    if K.shape[0] != N:
        raise ValueError("K and points must have the same batch dimension")
    points = points.to(torch.float32)
    lengths = lengths.to(torch.int64)
    K = K.to(torch.int64)
    start_idxs = torch.zeros_like(lengths)
    if random_start_point:
        for n in range(N):
            start_idxs[n] = torch.randint(high=lengths[n], size=(1,)).item()
    with torch.no_grad():
        return mod.FarthestPointSamplingCuda(points, lengths, K, start_idxs)


# ---------------------------------------------------------------- torch_cluster conventions
# Flat clouds: x (N, F) references, y (M, F) queries, optional sorted batch vectors. knn / radius
# return a (2, E) LongTensor: row 0 indexes y (the query), row 1 indexes x (the neighbour).


def _batch_ptrs(x, y, batch_x, batch_y, batch_size):
    if batch_size is None:
        batch_size = 1
        if batch_x is not None:
            batch_size = int(batch_x.max()) + 1
        if batch_y is not None:
            batch_size = max(batch_size, int(batch_y.max()) + 1)
    if batch_size <= 1:
        return None, None
    arange = torch.arange(batch_size + 1, device=x.device)
    return torch.bucketize(arange, batch_x), torch.bucketize(arange, batch_y)


def torch_cluster_knn(mod, x, y, k, batch_x=None, batch_y=None, cosine=False, batch_size=None):
    """As torch_cluster.knn(...) on CUDA: (2, E), fewer than k edges where a cloud is short."""
    if x.numel() == 0 or y.numel() == 0:
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x = (x.view(-1, 1) if x.dim() == 1 else x).contiguous()
    y = (y.view(-1, 1) if y.dim() == 1 else y).contiguous()
    ptr_x, ptr_y = _batch_ptrs(x, y, batch_x, batch_y, batch_size)
    return mod.knn_cuda(x, y, ptr_x, ptr_y, k, cosine)


def torch_cluster_radius(mod, x, y, r, batch_x=None, batch_y=None, max_num_neighbors=32,
                         batch_size=None):
    """As torch_cluster.radius(...) on CUDA: the first max_num_neighbors x (index order) with
    squared distance < r**2 for each y."""
    if x.numel() == 0 or y.numel() == 0:
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x = (x.view(-1, 1) if x.dim() == 1 else x).contiguous()
    y = (y.view(-1, 1) if y.dim() == 1 else y).contiguous()
    ptr_x, ptr_y = _batch_ptrs(x, y, batch_x, batch_y, batch_size)
    return mod.radius_cuda(x, y, ptr_x, ptr_y, r, max_num_neighbors)


def torch_cluster_fps(mod, src, batch=None, ratio=0.5, random_start=True, batch_size=None):
    """As torch_cluster.fps(...) on CUDA: flat global indices, ceil(ratio * n_b) per cloud."""
    r = ratio if torch.is_tensor(ratio) else torch.tensor(ratio, dtype=src.dtype, device=src.device)
    if batch is not None:
        if batch_size is None:
            batch_size = int(batch.max()) + 1
        deg = src.new_zeros(batch_size, dtype=torch.long)
        deg.scatter_add_(0, batch, torch.ones_like(batch))
        ptr = deg.new_zeros(batch_size + 1)
        torch.cumsum(deg, 0, out=ptr[1:])
    else:
        ptr = torch.tensor([0, src.size(0)], device=src.device)
    return mod.fps_cuda(src, ptr, r, random_start)
