#!/usr/bin/env bash
# The main job: distributed data parallel training of the example's own MLP on the real
# Fashion-MNIST files, 2 ranks over Gloo on this machine's CPUs (the host defaults).
#   BUILD_DIR=dir (default: build-main), JOBS=n (default: 2)
#   Arguments replace the defaults (--nproc 2), e.g. tools/run_main.sh --nproc 2 --epochs 2
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
[ $# -gt 0 ] || set -- --nproc 2
echo "run_main: $exe $*"
exec "$exe" "$@"
