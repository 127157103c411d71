"""pointops: point-cloud and particle operators for PyTorch, with CPU and CUDA kernels.

Public API:
  nearest_neighbor, chamfer, chamfer_distance, ChamferLoss, ChamferFunction, fscore
  voxelize, voxel_features, Voxels, Voxelizer
  particle_sum, ParticleSum
  knn_points, knn_gather, ball_query, sample_farthest_points, KNN (PyTorch3D's contracts)
  knn, knn_graph, radius, radius_graph, nearest, fps, grid_cluster (packed clouds: torch_cluster's
  contracts, TorchScript-able), knn_interpolate (torch_geometric's)
  strided (module): strided.map, strided.zip, strided.reduce, strided.matmul over any strided view
  build_info()
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from ._loader import load_extension as _load_extension
from ._version import __version__

_C, _LOADED_HOW = _load_extension()

from .chamfer import ChamferFunction, chamfer, fscore, nearest_neighbor  # noqa: E402
from .chamfer_loss import ChamferLoss, chamfer_distance  # noqa: E402
from .voxelize import Voxelizer, Voxels, voxel_features, voxelize  # noqa: E402
from .particle_sum import ParticleSum, particle_sum  # noqa: E402
from .neighbors import KNN, ball_query, knn_gather, knn_points, sample_farthest_points  # noqa: E402
from .neighbors_packed import knn, knn_graph, nearest, radius, radius_graph  # noqa: E402
from .sampling_packed import fps, grid_cluster, knn_interpolate  # noqa: E402
from . import strided  # noqa: E402


def build_info() -> dict:
    """Facts about the loaded extension (``python -m pointops info`` prints them):

    version       pointops version
    cuda          True when it has CUDA kernels, False for a CPU-only build
    cuda_version  the CUDA it was compiled with (None for CPU-only)
    cuda_archs    the GPU code compiled in, e.g. ["sm_80", "sm_90", "compute_90"] (compute_XX is
                  PTX, compiled for newer GPUs when loaded); [] for CPU-only
    torch_version the torch it was compiled against (that torch's ``__version__``)
    loaded        "prebuilt" (the installed pointops._C) or "jit" (compiled at import)
    path          the file of the loaded module
    """
    info = dict(_C.build_info())
    info["cuda_archs"] = [arch for arch in info["cuda_archs"].split(",") if arch]
    info["loaded"] = _LOADED_HOW
    info["path"] = _C.__file__
    return info


__all__ = [
    "nearest_neighbor", "chamfer", "chamfer_distance", "ChamferLoss", "ChamferFunction", "fscore",
    "voxelize", "voxel_features", "Voxels", "Voxelizer", "particle_sum", "ParticleSum",
    "knn_points", "knn_gather", "ball_query", "sample_farthest_points", "KNN", "knn", "knn_graph", "radius",
    "radius_graph", "nearest", "fps", "grid_cluster", "knn_interpolate", "strided", "build_info", "__version__",
]
