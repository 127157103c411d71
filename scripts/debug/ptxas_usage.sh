#!/usr/bin/env bash
# Registers / spills / shared memory of every kernel in the given .cu files (ptxas -v), for the
# hot kernels' resource report without a GPU: scripts/debug/ptxas_usage.sh csrc/neighbors/knn_cuda_list16.cu
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r -a TORCH_INCLUDES <<<"$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")"
PY_INCLUDE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
for f in "$@"; do
  nvcc -c "$f" -o /dev/null -std=c++20 -O3 -arch=sm_90a --expt-relaxed-constexpr -Icsrc "${TORCH_INCLUDES[@]}" \
    -I"$PY_INCLUDE" -D_GLIBCXX_USE_CXX11_ABI=1 -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
    -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
    -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ -Xcompiler -fPIC -Xptxas -v 2>&1 |
    awk '/Function properties for/ {name=$NF} /spill/ {spill=$0} /Used [0-9]+ registers/ {print name; print "   " $0 "; " spill}' |
    c++filt | sed -E 's/ptxas info *: //'
done
