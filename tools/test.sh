#!/usr/bin/env bash
# Builds partrain (Release) and runs its test suite. The GPU tests (ctest label `gpu`) run only
# where a GPU is present; without one, the CUDA parts are left to CI's nvcc job (compile only).
#   BUILD_DIR=dir      build folder (default: build)
#   JOBS=n             parallel build and test jobs (default: 2)
#   PARTRAIN_CMAKE_ARGS="-D..."  extra configure arguments
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-2}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "test: GPU found, the gpu-labelled tests run too"
  cuda_args=()
  ctest_filter=()
else
  echo "test: no GPU, CUDA parts off here and tests labelled gpu excluded"
  cuda_args=(-DPARTRAIN_WITH_CUDA=OFF)
  ctest_filter=(-LE gpu)
fi

# shellcheck disable=SC2086 # PARTRAIN_CMAKE_ARGS is a list of words on purpose
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" ${PARTRAIN_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" "${ctest_filter[@]}"
