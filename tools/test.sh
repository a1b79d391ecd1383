#!/usr/bin/env bash
# Builds partrain (Release) and runs its test suite. The GPU tests (ctest label `gpu`) run only
# where a GPU is present; without one, the CUDA parts are left to CI's nvcc job (compile only).
# The examples and benchmarks build optimised; the test executables build at -O0 under
# AddressSanitizer + UBSan, so this one run also checks the suite for memory errors and undefined
# behaviour (the examples' own tests run them at full speed).
#   BUILD_DIR=dir      build folder (default: build)
#   JOBS=n             parallel build and test jobs (default: 2)
#   PARTRAIN_TEST_SANITIZE="..."  sanitizers for the tests (default "address;undefined"; "" for none)
#   PARTRAIN_CMAKE_ARGS="-D..."  extra configure arguments
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
jobs=${JOBS:-2}

# A GPU is there when nvidia-smi lists one, or, where nvidia-smi is missing (some containers mount
# only the driver library and the device nodes), when the kernel driver reports a GPU in
# /proc/driver/nvidia/gpus or /dev/nvidia0 exists. A false "yes" costs nothing: every gpu test
# exits 77 (Skipped) when no usable device answers. PARTRAIN_GPU=0/1 overrides the detection.
have_gpu() {
  case "${PARTRAIN_GPU:-}" in
    1) return 0 ;;
    0) return 1 ;;
  esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU' && return 0
  fi
  if [ -d /proc/driver/nvidia/gpus ] && [ -n "$(ls -A /proc/driver/nvidia/gpus 2>/dev/null)" ]; then
    return 0
  fi
  [ -c /dev/nvidia0 ]
}

if have_gpu; then
  echo "test: GPU found, the gpu-labelled tests run too"
  cuda_args=()
  ctest_filter=()
else
  echo "test: no GPU, CUDA parts off here and tests labelled gpu excluded"
  cuda_args=(-DPARTRAIN_WITH_CUDA=OFF)
  ctest_filter=(-LE gpu)
fi

sanitize=${PARTRAIN_TEST_SANITIZE-address;undefined}
# A leak or an error stops the test with a stack (LeakSanitizer is on by default on Linux). Where
# a GPU is, a host test that reaches the CUDA driver needs the shadow gap unprotected.
asan_default=detect_leaks=1:abort_on_error=1
if [ ${#cuda_args[@]} -eq 0 ]; then asan_default+=:protect_shadow_gap=0; fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-$asan_default}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# shellcheck disable=SC2086 # PARTRAIN_CMAKE_ARGS is a list of words on purpose
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" \
  -DPARTRAIN_TEST_SANITIZE="$sanitize" ${PARTRAIN_CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs" "${ctest_filter[@]}"
