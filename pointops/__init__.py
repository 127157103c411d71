"""pointops: point-cloud and particle operators for PyTorch, with CPU and CUDA kernels.

Public API:
  nearest_neighbor, chamfer, chamfer_distance, ChamferLoss, ChamferFunction, fscore
  voxelize, voxel_features, Voxels, Voxelizer
  particle_sum, ParticleSum
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
from . import strided  # noqa: E402


def build_info() -> dict:
    """Facts about the loaded extension: version, whether it has CUDA kernels, the CUDA version and
    torch version it was compiled against, and how it was loaded ("prebuilt" or "jit")."""
    info = dict(_C.build_info())
    info["loaded"] = _LOADED_HOW
    return info


__all__ = [
    "nearest_neighbor", "chamfer", "chamfer_distance", "ChamferLoss", "ChamferFunction", "fscore",
    "voxelize", "voxel_features", "Voxels", "Voxelizer", "particle_sum", "ParticleSum", "strided", "build_info", "__version__",
]
