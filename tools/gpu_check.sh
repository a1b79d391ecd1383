#!/usr/bin/env bash
# tools/gpu_check.sh: everything partrain can only prove on a GPU, in one command, for the day a
# GPU machine is lent (nvcc, CMake, NCCL, maybe PyTorch; no apt, no internet). It configures for
# the native architecture, builds what the checks need, runs every gpu-labelled test (each runs
# with -w NoAssertions: a case that checks nothing fails), trains the example on one GPU in fp32,
# fp16 and bf16 to full accuracy, runs the CUDA rows of the benchmarks, trains the same MLP in
# PyTorch eager when torch imports, trains the CUDA ViT under FSDP (fp32 and bf16 gathers) and the
# same ViT in PyTorch eager and torch.compile, and prints one table and a `summary:` line. Exit 1 when any
# step failed; a step that cannot run here (no GPU, no nvcc, no torch) is SKIP with the reason.
#
#   tools/gpu_check.sh --prepare     copy what the GPU machine lacks (Catch2's header and CMake
#                                    files, the Fashion-MNIST files) into .device/ (git-ignored),
#                                    which travels with the working tree to the device machine
#   tools/gpu_check.sh --pack DIR    pack a CUDA build folder built here (its executables, ctest
#                                    files and the shared libraries they load from outside CUDA and
#                                    the C runtime: gloo, OpenBLAS, Open MPI) into
#                                    .device/prebuilt.tar.xz; the device machine then runs them
#                                    without building (nvcc there spends device time)
#   tools/gpu_check.sh [--only steps] [--build DIR] [--data DIR] [--jobs N]
#        steps: configure,build,tests,example,bench,torch,vit,determinism (comma-separated; default
#        all). The
#        build folder persists on a warm machine, so a run may be split to fit a command's limit:
#        --only configure,build   then   --only tests,example,bench,torch,vit
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
device_dir=$root/.device
build=$root/build-gpu
data=""
jobs=$(nproc 2>/dev/null || echo 2)
only="configure,build,tests,example,bench,torch,vit,determinism"
torch_vit_epochs=2      # PyTorch's ViT rows time its steps; our ViT trains the example's 8 epochs
accuracy_floor=0.85     # the host example reaches 0.89 after 8 epochs; a wrong gradient stays far below
precision_slack=0.01    # fp16/bf16 within this of fp32 (as the host mixed-precision test)

while [ $# -gt 0 ]; do
  case $1 in
    --prepare) prepare=1 ;;
    --pack) pack=$2; shift ;;
    --only) only=$2; shift ;;
    --build) build=$2; shift ;;
    --data) data=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (expected --prepare, --pack, --only, --build, --data, --jobs)" >&2; exit 2 ;;
  esac
  shift
done

if [ -n "${prepare:-}" ]; then
  set -e
  mkdir -p "$device_dir/catch2/include" "$device_dir/catch2/lib/cmake"
  rm -rf "$device_dir/catch2/include/catch2" "$device_dir/catch2/lib/cmake/Catch2"
  cp -r /usr/include/catch2 "$device_dir/catch2/include/"
  # Catch2 2.13 is one header. The package travels header-only: its test-discovery scripts and a
  # config of our own that defines Catch2::Catch2 alone, so the tests build their main from
  # tests/catch_main.cpp with the device machine's compiler (Debian's config would also import
  # libCatch2WithMain.a, built by this machine's compiler and not part of the copy).
  mkdir -p "$device_dir/catch2/lib/cmake/Catch2"
  cp /usr/lib/cmake/Catch2/Catch.cmake /usr/lib/cmake/Catch2/CatchAddTests.cmake \
     /usr/lib/cmake/Catch2/Catch2ConfigVersion.cmake "$device_dir/catch2/lib/cmake/Catch2/"
  cat >"$device_dir/catch2/lib/cmake/Catch2/Catch2Config.cmake" <<'CONFIG'
# Written by tools/gpu_check.sh --prepare: Catch2 2.13 as a header-only package.
if(NOT TARGET Catch2::Catch2)
  list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
  get_filename_component(_partrain_catch2_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
  add_library(Catch2::Catch2 INTERFACE IMPORTED)
  set_target_properties(Catch2::Catch2 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_partrain_catch2_root}/include")
endif()
CONFIG
  rm -rf "$device_dir/fashion-mnist"
  cp -r /usr/share/datasets/fashion-mnist "$device_dir/fashion-mnist"
  echo "gpu_check: prepared $device_dir ($(du -sh "$device_dir" | cut -f1)): Catch2 header and CMake package, Fashion-MNIST"
  echo "gpu_check: on the device machine: tools/gpu_check.sh (it finds them there)"
  exit 0
fi

# Pack a build folder made here; the tarball keeps paths relative to the repository root and the
# root's absolute path, which the ctest files name (rewritten to the device machine's root).
prebuilt=$device_dir/prebuilt.tar.xz
ctest_files() {  # $1: build folder, relative to the working directory; ctest's files and those they
                 # include (catch_discover_tests' per-executable lists), NUL-terminated
  find "$1" -path '*/CMakeFiles' -prune -o \( -name '*.cmake' -o -name CMakeCache.txt \) -print0
}
if [ -n "${pack:-}" ]; then
  set -e
  dir=$(cd "$pack" && pwd)
  rel=${dir#"$root"/}
  [ "$rel" != "$dir" ] || { echo "gpu_check: --pack $pack: the build folder must lie inside $root" >&2; exit 2; }
  [ -f "$dir/CTestTestfile.cmake" ] || { echo "gpu_check: --pack $pack: not a configured build folder" >&2; exit 2; }
  staging=$(mktemp -d)
  trap 'rm -rf "$staging"' EXIT
  libs=$staging/.device/prebuilt/lib
  mkdir -p "$libs"
  mapfile -t exes < <(cd "$root" && find "$rel" -path '*/CMakeFiles' -prune -o -type f -perm -u+x -print |
                      while read -r f; do head -c 4 "$f" | grep -q ELF && echo "$f"; done)
  for f in "${exes[@]}"; do
    ldd "$root/$f" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case $name in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*|libgcc_s.so*|ld-linux*|libcuda.so*) ;;
        libcudart.so*|libnccl.so*|libcublas*) ;;  # the device machine's CUDA has its own
        *) cp -Lu "$path" "$libs/$name" ;;
      esac
    done
  done
  echo "$root" >"$staging/.device/prebuilt/root"
  echo "$rel" >"$staging/.device/prebuilt/build"
  (cd "$root" && ctest_files "$rel") >"$staging/files"
  printf '%s\0' "${exes[@]}" >>"$staging/files"
  tar -C "$root" --null -cf "$staging/build.tar" -T "$staging/files"
  tar -C "$staging" -rf "$staging/build.tar" .device/prebuilt
  mkdir -p "$device_dir"
  xz -T0 -6 -c "$staging/build.tar" >"$prebuilt"
  echo "gpu_check: packed ${#exes[@]} executables and $(ls "$libs" | wc -l) libraries from $rel into $prebuilt ($(du -h "$prebuilt" | cut -f1))"
  exit 0
fi

# Unpack it on the device machine: the build folder back at its path, the libraries beside it.
if [ -f "$prebuilt" ] && [ ! -f "$build/CMakeCache.txt" ]; then
  tar -C "$root" -xJf "$prebuilt"
  packed_root=$(cat "$device_dir/prebuilt/root")
  packed_build=$(cat "$device_dir/prebuilt/build")
  if [ "$packed_root" != "$root" ]; then  # the ctest files name the sources and the build by absolute path
    ctest_files "$root/$packed_build" | xargs -0 sed -i "s|$packed_root/|$root/|g"
  fi
  build=$root/$packed_build
  # The CUDA libraries of this machine (the toolkit's, else the Python wheels PyTorch loads).
  host_ld_path=${LD_LIBRARY_PATH:-}  # PyTorch's step keeps the machine's own (its wheels' CUDA libraries)
  cuda_libs=$(find /usr/local/cuda/ /usr/local/cuda/lib64/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -maxdepth 7 \
                \( -name 'libnccl.so.2' -o -name 'libcublas.so.13' -o -name 'libcudart.so.13' \) 2>/dev/null |
              xargs -r -n1 dirname | awk '!seen[$0]++' | paste -sd:)
  export LD_LIBRARY_PATH=$device_dir/prebuilt/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cmake_cmd=$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$build/CMakeCache.txt")
  if [ -n "$cmake_cmd" ] && [ ! -x "$cmake_cmd" ] && command -v cmake >/dev/null; then
    ln -s "$(command -v cmake)" "$cmake_cmd"  # the example tests run through it
  fi
  only=${only//configure,/}; only=${only//build,/}
  echo "gpu_check: prebuilt $build from $prebuilt; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  prebuilt_used=1
fi

mkdir -p "$build"
out=$build/gpu_check
mkdir -p "$out"
rows=()
failed=0
skipped=0
passed=0
record() {  # step status detail
  rows+=("$(printf '%-24s %-5s %s' "$1" "$2" "$3")")
  case $2 in
    ok) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
  echo "gpu_check: $1: $2 $3"
}
wants() { [[ ",$only," == *",$1,"* ]]; }
[ -n "${prebuilt_used:-}" ] && record prebuilt ok "$build from $prebuilt (configure and build skipped)"

# What this machine has.
nvcc=${CUDACXX:-}
[ -z "$nvcc" ] && nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
fi
gpu=${gpu_name:-none}
echo "gpu_check: nvcc ${nvcc:-none}, GPU $gpu, build $build, $jobs jobs"
if [ -z "$data" ]; then
  if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    data=/usr/share/datasets/fashion-mnist
  else
    data=$device_dir/fashion-mnist
  fi
fi
export PARTRAIN_FASHION_MNIST_DIR=${PARTRAIN_FASHION_MNIST_DIR:-$data}  # the tests' and benchmarks' data

# 1. Configure: CUDA on, the native architecture where a GPU is (the default list otherwise).
if wants configure; then
  if [ -z "$nvcc" ]; then
    record configure SKIP "no nvcc: nothing CUDA can be built here"
  else
    args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DPARTRAIN_WITH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc"
          -DFETCHCONTENT_FULLY_DISCONNECTED=ON)
    command -v ninja >/dev/null 2>&1 || args=("${args[@]:2}")
    [ -n "$gpu_name" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES=native)
    if [ ! -f /usr/include/catch2/catch.hpp ] && [ -d "$device_dir/catch2/lib/cmake/Catch2" ]; then
      args+=("-DCatch2_DIR=$device_dir/catch2/lib/cmake/Catch2")
    fi
    if cmake -S "$root" -B "$build" "${args[@]}" >"$out/configure.log" 2>&1; then
      archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
      record configure ok "CUDA architectures ${archs:-?}; $(grep -c 'left out' "$out/configure.log") part(s) left out ($out/configure.log)"
    else
      record configure FAIL "cmake failed: $out/configure.log (Catch2 missing? run tools/gpu_check.sh --prepare where it is)"
    fi
  fi
fi

# 2. Build only what the checks run: the gpu-labelled tests, the example, the benchmarks.
targets=(partrain_label_gpu fashion_mnist_cuda bench_collectives bench_precision_cuda peers_export_vit_init)
if wants build; then
  if [ -z "$nvcc" ]; then
    record build SKIP "no nvcc"
  elif [ ! -f "$build/CMakeCache.txt" ]; then
    record build FAIL "not configured ($build)"
  else
    have=()
    for t in "${targets[@]}"; do
      cmake --build "$build" --target help 2>/dev/null | grep -q "^$t\\b\\|[ /]$t:" && have+=("$t")
    done
    start=$SECONDS
    keep_going=()  # build every target that can be built, so one failure does not hide the others' results
    grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$build/CMakeCache.txt" && keep_going=(-- -k 0)
    if cmake --build "$build" -j "$jobs" --target "${have[@]}" "${keep_going[@]}" >"$out/build.log" 2>&1; then
      record build ok "${have[*]} in $((SECONDS - start)) s"
    else
      record build FAIL "$(grep -m1 -E 'error|FAILED' "$out/build.log" | cut -c1-150) ($out/build.log)"
    fi
  fi
fi

# 3. Every gpu-labelled test. Skipped tests on a machine with a GPU are failures: a test that
# could not use the GPU there proved nothing.
if wants tests; then
  if [ ! -f "$build/CTestTestfile.cmake" ]; then
    record gpu_tests SKIP "no build folder with tests"
  else
    ctest --test-dir "$build" -L gpu --output-on-failure --timeout 150 >"$out/tests.log" 2>&1
    rc=$?
    total=$(grep -oE 'out of [0-9]+' "$out/tests.log" | tail -n 1 | grep -oE '[0-9]+')
    nskip=$(grep -cE '\*\*\*Skipped|Not Run' "$out/tests.log")
    nfail=$(grep -oE '[0-9]+ tests failed' "$out/tests.log" | grep -oE '[0-9]+')
    detail="${total:-0} tests, ${nfail:-0} failed, $nskip skipped ($out/tests.log)"
    if [ "${total:-0}" = 0 ]; then
      record gpu_tests FAIL "no gpu-labelled tests found"
    elif [ $rc -ne 0 ]; then
      record gpu_tests FAIL "$detail"
    elif [ -n "$gpu_name" ] && [ "$nskip" -gt 0 ]; then
      record gpu_tests FAIL "$detail: skipped with a GPU present"
    elif [ -z "$gpu_name" ]; then
      record gpu_tests SKIP "no GPU: $detail"
    else
      record gpu_tests ok "$detail"
    fi
  fi
fi

# 4. The example on one GPU, full data and epochs, in each precision: the MLP under DDP, then
# (step vit) the ViT under FSDP. Each row: test accuracy >= the floor, and the 16-bit runs within
# the slack of their fp32 run.
example=$build/examples/fashion_mnist/fashion_mnist_cuda
backend=gloo
grep -q 'PARTRAIN_WITH_NCCL:BOOL=ON\|NCCL_LIBRARY:FILEPATH=/' "$build/CMakeCache.txt" 2>/dev/null && backend=nccl
train_example() {  # row precision fp32_accuracy_var example_args...
  local row=$1 p=$2 ref_var=$3
  shift 3
  if [ -z "$gpu_name" ]; then
    record "$row" SKIP "no GPU"
    return
  elif [ ! -x "$example" ]; then
    record "$row" FAIL "fashion_mnist_cuda not built"
    return
  elif [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    record "$row" FAIL "no Fashion-MNIST in $data (run --prepare where it is, or pass --data)"
    return
  fi
  rm -f "$out/$row.jsonl"
  local start=$SECONDS
  if "$example" --device cuda --nproc 1 --precision "$p" --data "$data" --log-every 0 --metrics "$out/$row.jsonl" "$@" \
       >"$out/$row.log" 2>&1; then
    read -r acc sps < <(python3 - "$out/$row.jsonl" <<'PY'
import json, sys
epochs = [json.loads(l) for l in open(sys.argv[1]) if '"test_accuracy"' in l]
print(epochs[-1]["test_accuracy"], epochs[-1].get("samples_per_s", 0)) if epochs else print("none 0")
PY
    )
    [ "$p" = fp32 ] && printf -v "$ref_var" '%s' "$acc"
    local ref=${!ref_var}
    verdict=$(python3 -c "
a='$acc'; f='$ref'
if a == 'none': print('FAIL no epoch record')
elif float(a) < $accuracy_floor: print('FAIL below $accuracy_floor')
elif f and abs(float(a) - float(f)) > $precision_slack: print('FAIL more than $precision_slack from fp32')
else: print('ok')")
    record "$row" "${verdict%% *}" "test_accuracy $acc, $sps samples/s, $((SECONDS - start)) s over $backend ${verdict#* }"
  else
    record "$row" FAIL "exit status $? ($out/$row.log)"
  fi
}
if wants example; then
  mlp_fp32_acc=""
  for p in fp32 fp16 bf16; do train_example "example_$p" "$p" mlp_fp32_acc --backend "$backend"; done
fi
if wants vit; then
  vit_fp32_acc=""
  if [ "$backend" != nccl ]; then
    record vit_fp32 SKIP "built without NCCL: FSDP over CUDA layers reduces with NCCL"
  else
    # bf16: the layers' matrix products in bf16 on the tensor cores (fp32 accumulation), and FSDP
    # gathers the parameters and reduces the gradients in bf16.
    for p in fp32 bf16; do
      train_example "vit_$p" "$p" vit_fp32_acc --backend nccl --model vit --parallel fsdp
    done
  fi
fi

# 4b. Determinism on one GPU: the launch helper's reduction (CUB's, through Thrust) gives the same
# bits run after run, and the CUDA example trained twice ends on the same parameter checksum.
if wants determinism; then
  tier=$build/tests/cuda/test_cpu_tier_cuda
  if [ -z "$gpu_name" ]; then
    record determinism_reductions SKIP "no GPU"
    record determinism_example SKIP "no GPU"
  else
    if [ ! -x "$tier" ]; then
      record determinism_reductions FAIL "test_cpu_tier_cuda not built"
    elif "$tier" "[launch]" >"$out/determinism_reductions.log" 2>&1; then
      record determinism_reductions ok "$(grep -m1 -E 'passed|assertions' "$out/determinism_reductions.log")"
    else
      record determinism_reductions FAIL "exit status $? ($out/determinism_reductions.log)"
    fi
    if [ ! -x "$example" ] || [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
      record determinism_example FAIL "fashion_mnist_cuda not built or no Fashion-MNIST in $data"
    else
      sums=()
      for run in 1 2; do
        "$example" --device cuda --nproc 1 --backend "$backend" --data "$data" --epochs 1 --limit-train 6000 \
          --limit-test 1000 --log-every 0 >"$out/determinism_example_$run.log" 2>&1
        sums+=("$(grep -m1 -oE 'final parameter checksum [0-9a-f]+' "$out/determinism_example_$run.log" | awk '{print $4}')")
      done
      if [ -z "${sums[0]}" ] || [ -z "${sums[1]}" ]; then
        record determinism_example FAIL "no checksum printed ($out/determinism_example_1.log)"
      elif [ "${sums[0]}" = "${sums[1]}" ]; then
        record determinism_example ok "two runs, checksum ${sums[0]} both"
      else
        record determinism_example FAIL "two runs differ: ${sums[0]} and ${sums[1]}"
      fi
    fi
  fi
fi

# 5. The benchmarks' CUDA rows. bench_ddp has none yet (it says so itself); bench_collectives'
# NCCL rows (--quick: one GPU makes NCCL a world of one, so its sizes matter little) and
# bench_precision_cuda's cuda rows are recorded.
if wants bench; then
  record bench_ddp SKIP "bench_ddp has no CUDA rows (the CUDA MLP step is timed by bench_precision_cuda)"
  if [ -z "$gpu_name" ]; then
    record bench_collectives SKIP "no GPU"
    record bench_precision_cuda SKIP "no GPU"
  else
    if [ -x "$build/bench/collectives/bench_collectives" ] &&
       timeout 600 "$build/bench/collectives/bench_collectives" --quick >"$out/bench_collectives.log" 2>&1; then
      if grep -qi '^nccl' "$out/bench_collectives.log" && ! grep -qi 'nccl: skipped' "$out/bench_collectives.log"; then
        record bench_collectives ok "$(grep -ci 'nccl' "$out/bench_collectives.log") nccl lines ($out/bench_collectives.log)"
      else
        record bench_collectives FAIL "no NCCL rows (built without NCCL?) ($out/bench_collectives.log)"
      fi
    else
      record bench_collectives FAIL "did not run to the end ($out/bench_collectives.log)"
    fi
    if [ -x "$build/bench/precision/bench_precision_cuda" ] &&
       PARTRAIN_FASHION_MNIST_DIR=$data timeout 600 "$build/bench/precision/bench_precision_cuda" \
         >"$out/bench_precision.log" 2>&1 && grep -q '^summary:' "$out/bench_precision.log" &&
       ! grep -q 'no GPU visible' "$out/bench_precision.log"; then
      record bench_precision_cuda ok "$(grep -m1 '^summary:' "$out/bench_precision.log")"
    else
      record bench_precision_cuda FAIL "did not run to the end ($out/bench_precision.log)"
    fi
  fi
fi

# 6. The same MLP (784-256-128-10, SGD lr 0.05 momentum 0.9, batch 64, 8 epochs) in PyTorch eager.
if wants torch; then
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    record torch_eager SKIP "torch does not import"
  elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    record torch_eager SKIP "torch imports, but sees no CUDA device"
  elif [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    record torch_eager FAIL "no Fashion-MNIST in $data"
  else
    line=$(LD_LIBRARY_PATH=${host_ld_path-${LD_LIBRARY_PATH:-}} timeout 600 python3 - "$data" <<'PY' 2>"$out/torch.log"
import gzip, sys, time, torch
d = sys.argv[1]
def idx(name, offset):
    return torch.frombuffer(bytearray(gzip.open(f"{d}/{name}").read()[offset:]), dtype=torch.uint8)
mean, std = 0.2860, 0.3530  # partrain's fashion_mnist_normalization()
xs = ((idx("train-images-idx3-ubyte.gz", 16).view(-1, 784).float() / 255 - mean) / std).cuda()
ys = idx("train-labels-idx1-ubyte.gz", 8).long().cuda()
xt = ((idx("t10k-images-idx3-ubyte.gz", 16).view(-1, 784).float() / 255 - mean) / std).cuda()
yt = idx("t10k-labels-idx1-ubyte.gz", 8).long().cuda()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
start, seen = time.perf_counter(), 0
for epoch in range(8):
    perm = torch.randperm(xs.shape[0], device="cuda")
    for i in range(0, xs.shape[0] - 63, 64):
        b = perm[i:i + 64]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(xs[b]), ys[b]).backward()
        opt.step()
        seen += 64
torch.cuda.synchronize()
sps = seen / (time.perf_counter() - start)
with torch.no_grad():
    acc = (model(xt).argmax(1) == yt).float().mean().item()
print(f"{acc:.4f} {sps:.0f}")
PY
    )
    if [ -n "$line" ]; then
      record torch_eager ok "test_accuracy ${line% *}, ${line#* } samples/s (torch $(python3 -c 'import torch; print(torch.__version__)'))"
    else
      record torch_eager FAIL "the PyTorch run failed ($out/torch.log)"
    fi
  fi
fi

# 7. The same ViT in PyTorch on the GPU, eager and through torch.compile (bench/peers/torch_vit.py
# from the CUDA ViT's initial weights, peers_export_vit_init), $torch_vit_epochs epochs each: its
# samples/s beside vit_fp32's.
if wants vit; then
  export_init=$build/bench/peers/peers_export_vit_init
  for mode in eager compile; do
    row=torch_vit_$mode
    if ! python3 -c 'import torch' >/dev/null 2>&1; then
      record "$row" SKIP "torch does not import"
    elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      record "$row" SKIP "torch imports, but sees no CUDA device"
    elif [ ! -x "$export_init" ]; then
      record "$row" FAIL "peers_export_vit_init not built"
    elif [ ! -f "$out/vit_init.bin" ] && ! "$export_init" "$out/vit_init.bin" >"$out/vit_init.log" 2>&1; then
      record "$row" FAIL "peers_export_vit_init failed ($out/vit_init.log)"
    else
      flags=(--device cuda --epochs "$torch_vit_epochs")
      [ "$mode" = compile ] && flags+=(--compile)
      start=$SECONDS
      LD_LIBRARY_PATH=${host_ld_path-${LD_LIBRARY_PATH:-}} PYTHONUNBUFFERED=1 timeout 600 python3 \
        "$root/bench/peers/torch_vit.py" --data "$data" --init "$out/vit_init.bin" "${flags[@]}" >"$out/$row.log" 2>&1
      line=$(grep '^epoch' "$out/$row.log" | tail -n 1)
      if [ -n "$line" ]; then
        record "$row" ok "${line% (rank 0)}, $((SECONDS - start)) s (torch $(python3 -c 'import torch; print(torch.__version__)'))"
      else
        record "$row" FAIL "the PyTorch run failed ($out/$row.log)"
      fi
    fi
  done
fi

echo
echo "gpu_check: $gpu"
printf '%-24s %-5s %s\n' step status detail
for r in "${rows[@]}"; do echo "$r"; done
echo "summary: gpu_check passed=$passed failed=$failed skipped=$skipped gpu=\"$gpu\" nvcc=$([ -n "$nvcc" ] && echo yes || echo no)"
[ "$failed" -eq 0 ]
