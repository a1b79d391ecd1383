#!/usr/bin/env bash
# The main job: data parallel training of the example's own MLP on the real Fashion-MNIST files,
# 2 ranks on this machine's CPUs over the fastest path one host has: the local backend (the ranks
# are threads of one process, each pinned to a core and meeting the other on its own thread: the
# example's --local-collectives inline), with ZeRO-2 (--parallel zero2), whose step there runs
# over shared memory: each rank averages and steps its half of the parameters and writes them
# into both replicas in one pass. The same bits as DDP's all_reduce + SGD, about 5% faster.
# Measured side by side on the project's 2-core machine (2026-11-27, 8 epochs, the same result):
# median epoch 173-178k samples/s with zero2 against 165-168k with DDP over local, 140-148k over
# mpi under mpirun and 40k over gloo processes.
#   BUILD_DIR=dir (default: build-main), JOBS=n (default: 2)
#   Arguments replace the defaults (--backend local --nproc 2 --parallel zero2), e.g.
#   tools/run_main.sh --nproc 2 --epochs 2
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-main}
jobs=${JOBS:-2}
target=fashion_mnist

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPARTRAIN_BUILD_TESTS=OFF -DPARTRAIN_BUILD_BENCH=OFF \
  -DPARTRAIN_BUILD_EXAMPLES=ON -DPARTRAIN_WITH_CUDA=OFF
cmake --build "$build" -j "$jobs" --target "$target"
exe="$build/examples/fashion_mnist/$target"
[ -x "$exe" ] || { echo "run_main: built $target but $exe is missing" >&2; exit 1; }
[ $# -gt 0 ] || set -- --backend local --nproc 2 --parallel zero2
echo "run_main: $exe $*"
exec "$exe" "$@"
