#!/usr/bin/env bash
# Builds and runs scripts/debug/grid_host_check.cu (the CUDA grid search's logic on the CPU against
# brute force; no GPU needed): scripts/debug/grid_host_check.sh [cases] [seed] [-v]
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r -a TORCH_INCLUDES <<<"$(python3 -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I' + p for p in include_paths()))")"
out=$(mktemp -d)
nvcc scripts/debug/grid_host_check.cu -o "$out/grid_host_check" -std=c++20 -O2 --expt-relaxed-constexpr -Icsrc \
  "${TORCH_INCLUDES[@]}" -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -D_GLIBCXX_USE_CXX11_ABI="$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
"$out/grid_host_check" "$@"
status=$?
rm -rf "$out"
exit $status
