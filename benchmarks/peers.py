"""Peer implementations (PyTorch3D, torch_cluster) built in-process for benchmarking.

The peers' CUDA sources are fetched, unmodified, into the git-ignored `.peers/` folder at the
repository root (`.peers/pytorch3d/csrc/...`, `.peers/torch_cluster/csrc/cuda/...`), next to a small
binding file of ours (`binding.cpp`) that exposes only the entry points benchmarked. Nothing from
them is vendored into pointops or committed; the bindings' text lives below (PYTORCH3D_BINDING,
TORCH_CLUSTER_BINDING) and is written beside the sources when missing, so any checkout with the
sources can build them. `load_pytorch3d()` / `load_torch_cluster()` JIT-build those sources with
`torch.utils.cpp_extension.load` and return the module, or None when the sources or CUDA are absent;
`load_torch_cluster_cpu()` builds torch_cluster's CPU ops (no GPU needed) for correctness smoke runs.

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
TORCH_CLUSTER_CPU_SOURCES = ("knn_cpu.cpp", "radius_cpu.cpp", "fps_cpu.cpp")


# Benchmark-only binding of PyTorch3D's own CUDA kernels (.peers/pytorch3d/binding.cpp).
PYTORCH3D_BINDING = r"""// Benchmark-only binding of PyTorch3D's own CUDA kernels (sources in csrc/, unmodified), exposing
// their forward and backward entry points under the names PyTorch3D's Python (pytorch3d._C) and
// benchmarks/peers.py call. Not part of pointops.
#include <torch/extension.h>

#include <tuple>

std::tuple<at::Tensor, at::Tensor> KNearestNeighborIdxCuda(const at::Tensor& p1, const at::Tensor& p2,
                                                           const at::Tensor& lengths1, const at::Tensor& lengths2,
                                                           const int norm, const int K, const int version);
std::tuple<at::Tensor, at::Tensor> KNearestNeighborBackwardCuda(const at::Tensor& p1, const at::Tensor& p2,
                                                                const at::Tensor& lengths1,
                                                                const at::Tensor& lengths2, const at::Tensor& idxs,
                                                                const int norm, const at::Tensor& grad_dists);
std::tuple<at::Tensor, at::Tensor> BallQueryCuda(const at::Tensor& p1, const at::Tensor& p2,
                                                 const at::Tensor& lengths1, const at::Tensor& lengths2, const int K,
                                                 const float radius, const bool skip_points_outside_cube);
at::Tensor FarthestPointSamplingCuda(const at::Tensor& points, const at::Tensor& lengths, const at::Tensor& K,
                                     const at::Tensor& start_idxs, const int64_t max_K_known);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("KNearestNeighborIdxCuda", &KNearestNeighborIdxCuda);
  m.def("KNearestNeighborBackwardCuda", &KNearestNeighborBackwardCuda);
  m.def("BallQueryCuda", [](const at::Tensor& p1, const at::Tensor& p2, const at::Tensor& l1, const at::Tensor& l2,
                            int K, float radius) { return BallQueryCuda(p1, p2, l1, l2, K, radius, false); });
  m.def("FarthestPointSamplingCuda", [](const at::Tensor& points, const at::Tensor& lengths, const at::Tensor& K,
                                        const at::Tensor& start_idxs) {
    return FarthestPointSamplingCuda(points, lengths, K, start_idxs, -1);
  });
  // pytorch3d._C's names, as pytorch3d/ops/knn.py calls them (CUDA tensors only here).
  m.def("knn_points_idx", &KNearestNeighborIdxCuda);
  m.def("knn_points_backward", &KNearestNeighborBackwardCuda);
}
"""

# Benchmark-only binding of torch_cluster 1.6.3's CUDA ops (.peers/torch_cluster/binding.cpp). It
# includes torch_cluster's own headers, so a signature that changes upstream fails to compile here
# instead of linking a different overload. The names and argument orders are those of the C++
# functions (torch_cluster's Python reaches them through torch.ops.torch_cluster.*, whose extra
# num_workers argument only the CPU versions use).
TORCH_CLUSTER_BINDING = r"""// Benchmark-only binding of torch_cluster's own CUDA ops (sources in csrc/cuda/, unmodified),
// exposing knn_cuda / radius_cuda / fps_cuda to benchmarks/peers.py. Not part of pointops.
#include <torch/extension.h>

#include "fps_cuda.h"
#include "knn_cuda.h"
#include "radius_cuda.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("knn_cuda", &knn_cuda, "knn_cuda(x, y, ptr_x, ptr_y, k, cosine)", pybind11::arg("x"), pybind11::arg("y"),
        pybind11::arg("ptr_x"), pybind11::arg("ptr_y"), pybind11::arg("k"), pybind11::arg("cosine"));
  m.def("radius_cuda", &radius_cuda, "radius_cuda(x, y, ptr_x, ptr_y, r, max_num_neighbors, ignore_same_index)",
        pybind11::arg("x"), pybind11::arg("y"), pybind11::arg("ptr_x"), pybind11::arg("ptr_y"), pybind11::arg("r"),
        pybind11::arg("max_num_neighbors"), pybind11::arg("ignore_same_index"));
  m.def("fps_cuda", &fps_cuda, "fps_cuda(src, ptr, ratio, random_start)", pybind11::arg("src"),
        pybind11::arg("ptr"), pybind11::arg("ratio"), pybind11::arg("random_start"));
}
"""

# The same for torch_cluster's CPU ops (nanoflann k-d trees; .peers/torch_cluster/binding_cpu.cpp),
# for a correctness smoke run on a machine without a GPU.
TORCH_CLUSTER_CPU_BINDING = r"""// Benchmark-only binding of torch_cluster's own CPU ops (sources in csrc/cpu/, unmodified),
// exposing knn_cpu / radius_cpu / fps_cpu to benchmarks/peers.py. Not part of pointops.
#include <torch/extension.h>

#include "fps_cpu.h"
#include "knn_cpu.h"
#include "radius_cpu.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("knn_cpu", &knn_cpu, "knn_cpu(x, y, ptr_x, ptr_y, k, num_workers)", pybind11::arg("x"), pybind11::arg("y"),
        pybind11::arg("ptr_x"), pybind11::arg("ptr_y"), pybind11::arg("k"), pybind11::arg("num_workers"));
  m.def("radius_cpu", &radius_cpu,
        "radius_cpu(x, y, ptr_x, ptr_y, r, max_num_neighbors, num_workers, ignore_same_index)", pybind11::arg("x"),
        pybind11::arg("y"), pybind11::arg("ptr_x"), pybind11::arg("ptr_y"), pybind11::arg("r"),
        pybind11::arg("max_num_neighbors"), pybind11::arg("num_workers"), pybind11::arg("ignore_same_index"));
  m.def("fps_cpu", &fps_cpu, "fps_cpu(src, ptr, ratio, random_start)", pybind11::arg("src"), pybind11::arg("ptr"),
        pybind11::arg("ratio"), pybind11::arg("random_start"));
}
"""


def _binding(root, text, filename="binding.cpp"):
    """root/filename, written from `text` when the peer's sources are there but it is not."""
    binding = root / filename
    if root.is_dir() and not binding.exists():
        binding.write_text(text)
    return binding


def _build(name, root, csrc, sources, binding_text, extra_ldflags=(), cuda=True, binding_name="binding.cpp"):
    paths = [csrc / s for s in sources]
    if (cuda and not torch.cuda.is_available()) or not all(p.exists() for p in paths):
        return None
    binding = _binding(root, binding_text, binding_name)
    from torch.utils.cpp_extension import load
    return load(name=name, sources=[str(binding)] + [str(p) for p in paths],
                extra_include_paths=[str(csrc)], extra_cflags=["-O2"], extra_cuda_cflags=["-O3"],
                extra_ldflags=list(extra_ldflags), with_cuda=cuda, verbose=False)


def load_pytorch3d():
    """PyTorch3D's KNearestNeighborIdxCuda / BallQueryCuda / FarthestPointSamplingCuda, or None."""
    return _build("pytorch3d_peer", PYTORCH3D_DIR, PYTORCH3D_DIR / "csrc", PYTORCH3D_SOURCES, PYTORCH3D_BINDING)


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
                  TORCH_CLUSTER_SOURCES, TORCH_CLUSTER_BINDING, extra_ldflags=["-Wl,--allow-multiple-definition"])


def load_torch_cluster_cpu():
    """torch_cluster's knn_cpu / radius_cpu / fps_cpu (no GPU needed), or None without the sources."""
    return _build("torch_cluster_cpu_peer", TORCH_CLUSTER_DIR, TORCH_CLUSTER_DIR / "csrc" / "cpu",
                  TORCH_CLUSTER_CPU_SOURCES, TORCH_CLUSTER_CPU_BINDING, cuda=False, binding_name="binding_cpu.cpp")


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
# return a (2, E) LongTensor: row 0 indexes y (the query), row 1 indexes x (the neighbour); the
# *_graph functions return (source, target) edges. `mod` is load_torch_cluster() for CUDA tensors or
# load_torch_cluster_cpu() for CPU ones; the dispatch is csrc/knn.cpp's and csrc/radius.cpp's.


def _batch_ptrs(x, y, batch_x, batch_y, batch_size):
    if batch_size is None:
        batch_size = 1
        if batch_x is not None:
            assert x.size(0) == batch_x.numel()
            batch_size = int(batch_x.max()) + 1
        if batch_y is not None:
            assert y.size(0) == batch_y.numel()
            batch_size = max(batch_size, int(batch_y.max()) + 1)
    assert batch_size > 0
    if batch_size <= 1:
        return None, None
    assert batch_x is not None and batch_y is not None
    arange = torch.arange(batch_size + 1, device=x.device)
    return torch.bucketize(arange, batch_x), torch.bucketize(arange, batch_y)


def _flat(x, y):
    x = x.view(-1, 1) if x.dim() == 1 else x
    y = y.view(-1, 1) if y.dim() == 1 else y
    return x.contiguous(), y.contiguous()


def torch_cluster_knn(mod, x, y, k, batch_x=None, batch_y=None, cosine=False, num_workers=1, batch_size=None):
    """As torch_cluster.knn(...): (2, E), each y's k nearest x (nearest first on CUDA), fewer where
    a cloud is short. num_workers only matters on the CPU."""
    if x.numel() == 0 or y.numel() == 0:
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = _flat(x, y)
    ptr_x, ptr_y = _batch_ptrs(x, y, batch_x, batch_y, batch_size)
    if x.is_cuda:
        return mod.knn_cuda(x, y, ptr_x, ptr_y, k, cosine)
    if cosine:
        raise RuntimeError("`cosine` argument not supported on CPU")
    return mod.knn_cpu(x, y, ptr_x, ptr_y, k, num_workers)


def torch_cluster_knn_graph(mod, x, k, batch=None, loop=False, flow="source_to_target", cosine=False,
                            num_workers=1, batch_size=None):
    """As torch_cluster.knn_graph(...): knn of x against itself with k + 1 neighbours when self
    loops are dropped, then the flow swap and the self-loop mask."""
    assert flow in ["source_to_target", "target_to_source"]
    edge_index = torch_cluster_knn(mod, x, x, k if loop else k + 1, batch, batch, cosine, num_workers, batch_size)
    if flow == "source_to_target":
        row, col = edge_index[1], edge_index[0]
    else:
        row, col = edge_index[0], edge_index[1]
    if not loop:
        mask = row != col
        row, col = row[mask], col[mask]
    return torch.stack([row, col], dim=0)


def torch_cluster_radius(mod, x, y, r, batch_x=None, batch_y=None, max_num_neighbors=32, num_workers=1,
                         batch_size=None, ignore_same_index=False):
    """As torch_cluster.radius(...): for each y the x with squared distance < r**2, at most
    max_num_neighbors of them (on CUDA the first in x's index order; on the CPU in k-d tree order)."""
    if x.numel() == 0 or y.numel() == 0:
        return torch.empty(2, 0, dtype=torch.long, device=x.device)
    x, y = _flat(x, y)
    ptr_x, ptr_y = _batch_ptrs(x, y, batch_x, batch_y, batch_size)
    if x.is_cuda:
        return mod.radius_cuda(x, y, ptr_x, ptr_y, r, max_num_neighbors, ignore_same_index)
    return mod.radius_cpu(x, y, ptr_x, ptr_y, r, max_num_neighbors, num_workers, ignore_same_index)


def torch_cluster_radius_graph(mod, x, r, batch=None, loop=False, max_num_neighbors=32, flow="source_to_target",
                               num_workers=1, batch_size=None):
    """As torch_cluster.radius_graph(...): radius of x against itself, self matches skipped inside
    the search (ignore_same_index = not loop, so they do not use up max_num_neighbors), then the
    flow swap."""
    assert flow in ["source_to_target", "target_to_source"]
    edge_index = torch_cluster_radius(mod, x, x, r, batch, batch, max_num_neighbors, num_workers, batch_size,
                                      not loop)
    if flow == "source_to_target":
        row, col = edge_index[1], edge_index[0]
    else:
        row, col = edge_index[0], edge_index[1]
    return torch.stack([row, col], dim=0)


def torch_cluster_fps(mod, src, batch=None, ratio=0.5, random_start=True, batch_size=None):
    """As torch_cluster.fps(...): flat global indices, ceil(ratio * n_b) per cloud."""
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
    return (mod.fps_cuda if src.is_cuda else mod.fps_cpu)(src, ptr, r, random_start)
