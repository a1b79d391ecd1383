#!/usr/bin/env bash
# Installs every Debian package partrain needs. Idempotent and non-interactive: when all are
# present it does nothing (no apt-get at all), otherwise one `apt-get update` and one install.
set -euo pipefail

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
  gnuplot-nox                       # plots of benchmark figures
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
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
echo "setup: done"
