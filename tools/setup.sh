#!/usr/bin/env bash
# Installs every Debian package partrain needs, then the Python packages of the safetensors interop
# test (safetensors, numpy) in a venv of the repository, .cache/py-venv (git-ignored; CMake's
# PARTRAIN_SAFETENSORS_PYTHON points there). Idempotent and non-interactive: when all are present
# it does nothing (no apt-get, no pip at all), otherwise one `apt-get update` and one install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

# The venv, from PyPI (skipped quietly when it already imports both; a failure leaves the interop
# test Skipped, not the setup failed).
python_venv() {
  local venv=$root/.cache/py-venv
  if "$venv/bin/python" -c 'import safetensors, numpy' >/dev/null 2>&1; then
    return
  fi
  echo "setup: creating $venv (safetensors, numpy)"
  if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/python" -m pip install -q safetensors numpy; }; then
    echo "setup: could not make $venv; the safetensors interop test will report Skipped" >&2
  fi
}

packages=(
  build-essential cmake ninja-build g++ git
  clang libclang-rt-14-dev          # clang -fsanitize=fuzzer (libFuzzer) for the fuzz job
  libgloo-dev                       # the gloo backend (CPU processes over TCP)
  libopenmpi-dev openmpi-bin        # the mpi backend (shared memory on a host, mpirun/srun clusters)
  catch2                            # Catch2 2.13, found by FetchContent's FIND_PACKAGE_ARGS
  libopenblas-dev                   # host GEMMs of the examples
  zlib1g-dev                        # gzip IDX files
  dataset-fashion-mnist             # /usr/share/datasets/fashion-mnist/
  python3                           # tools/amalgamate.py
  python3-venv                      # .cache/py-venv for the safetensors interop test
  gnuplot-nox                       # plots of benchmark figures
)
# Thrust's headers for the CPU tier (Thrust's host system runs the device loops there): the CUDA
# toolkit's CCCL when it is installed, so g++ and nvcc see the same Thrust; Debian's otherwise.
if [ ! -e /usr/local/cuda/include/cccl/thrust/version.h ] && [ ! -e /usr/include/thrust/version.h ]; then
  packages+=(libthrust-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  python_venv
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
python_venv
echo "setup: done"
