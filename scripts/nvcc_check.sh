#!/usr/bin/env bash
# Compile every csrc/**/*.cu with nvcc against the installed torch's headers (-c only): a syntax and
# template-instantiation check for machines without a GPU. Usage: scripts/nvcc_check.sh [files...]
# NVCC_EXTRA adds flags, e.g. NVCC_EXTRA="-Xptxas -v" for every kernel's registers, shared memory and
# spills (sm_90 unless NVCC_CHECK_ARCH says otherwise).
# A CPU-only torch wheel ships the c10/cuda headers but not the cmake-generated
# c10/cuda/impl/cuda_cmake_macros.h (it only sets Windows export macros), hence
# C10_CUDA_NO_CMAKE_CONFIGURE_FILE below.
set -euo pipefail
cd "$(dirname "$0")/.."
read -r -a TORCH_INCLUDES <<<"$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")"
PY_INCLUDE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
ABI=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
ARCH=${NVCC_CHECK_ARCH:-sm_90}
files=("$@")
if [ ${#files[@]} -eq 0 ]; then mapfile -t files < <(find csrc -name '*.cu' | sort); fi
out=$(mktemp -d)
for f in "${files[@]}"; do
  echo "nvcc -c $f"
  nvcc -c "$f" -o "$out/$(basename "$f").o" -std=c++20 -O3 -arch="$ARCH" --expt-relaxed-constexpr \
    -Icsrc "${TORCH_INCLUDES[@]}" -I"$PY_INCLUDE" -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
    -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE \
    -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
    -D__CUDA_NO_HALF2_OPERATORS__ -Xcompiler -fPIC ${NVCC_EXTRA:-}
done
rm -rf "$out"
echo "nvcc check: ${#files[@]} file(s) compiled"
