#!/usr/bin/env bash
# tools/cpu_tier_coverage.sh: how much of the device code the CPU tier executes. Builds only the
# cpu_tier tests with gcov instrumentation (g++ --coverage, -O0), runs them (ctest -L cpu_tier),
# and counts, per functor header (the element logic every CUDA kernel runs), the lines gcov saw
# executed in any test over the lines it instrumented. The tier runs the device loops' Thrust calls
# (core/detail/thrust_index.hpp) on Thrust's host system; the CUDA glue around them in
# partrain/cuda/launch.cuh (the CUDA policy, the stream-ordered allocator, the error translation)
# runs only on a GPU: its statements are counted as device lines the CPU tier cannot execute.
# Prints a table and a `summary:` line.
#   tools/cpu_tier_coverage.sh [build-dir]      (default: build-cov; JOBS=n parallel build jobs)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-$root/build-cov}
jobs=${JOBS:-1}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="--coverage -O0" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DPARTRAIN_WITH_CUDA=OFF -DPARTRAIN_BUILD_EXAMPLES=OFF \
  -DPARTRAIN_BUILD_BENCH=OFF -DPARTRAIN_INSTALL=OFF -DPARTRAIN_PACKAGING_TESTS=OFF -DPARTRAIN_HEADER_TESTS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target partrain_label_cpu_tier >/dev/null
find "$build" -name '*.gcda' -delete
ctest --test-dir "$build" -L cpu_tier --output-on-failure --no-tests=error -j "$jobs" >/dev/null

python3 - "$root" "$build" <<'PY'
import gzip, json, pathlib, re, subprocess, sys, tempfile

root, build = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
functor_headers = [
    "include/partrain/core/for_each_index.hpp",
    "include/partrain/core/detail/thrust_index.hpp",
    "include/partrain/core/half.hpp",
    "include/partrain/optim/detail/update_rules.hpp",
    "include/partrain/optim/detail/elements.hpp",
    "include/partrain/precision/detail/elements.hpp",
    "include/partrain/parallel/detail/ddp_elements.hpp",
    "models/mlp_elements.hpp",
    "models/mlp_device.hpp",  # the CUDA MLP's whole step, on the host backend
]
executed = {h: set() for h in functor_headers}
instrumented = {h: set() for h in functor_headers}
gcdas = sorted((build / "tests" / "cpu_tier").rglob("*.gcda"))
if not gcdas:
    sys.exit("cpu_tier_coverage: no .gcda files under " + str(build / "tests/cpu_tier") + " (did the tests run?)")
with tempfile.TemporaryDirectory() as tmp:
    for gcda in gcdas:
        subprocess.run(["gcov", "--json-format", "-o", str(gcda.parent), str(gcda)], cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for out in pathlib.Path(tmp).glob("*.gcov.json.gz"):
            data = json.loads(gzip.decompress(out.read_bytes()))
            out.unlink()
            for f in data["files"]:
                path = pathlib.Path(f["file"])
                path = path if path.is_absolute() else (pathlib.Path(data.get("current_working_directory", ".")) / path)
                try:
                    rel = str(path.resolve().relative_to(root))
                except ValueError:
                    continue
                if rel not in executed:
                    continue
                for line in f["lines"]:
                    instrumented[rel].add(line["line_number"])
                    if line["count"] > 0:
                        executed[rel].add(line["line_number"])

# Device-only lines: the statements inside the function bodies of cuda/launch.cuh.
launch = (root / "include/partrain/cuda/launch.cuh").read_text().splitlines()
kernel_lines, depth, body_depth = 0, 0, None
for text in launch:
    code = text.split("//")[0].strip()
    if body_depth is not None and code and code not in ("{", "}", "};") and not code.startswith("#"):
        kernel_lines += 1
    opens = code.count("{") - code.count("}")
    if body_depth is None and code.endswith("{") and ")" in code and "namespace" not in code:
        body_depth = depth  # a function's body opens here
    depth += opens
    if body_depth is not None and depth <= body_depth:
        body_depth = None

print(f"{'file':<52} {'executed':>9} {'lines':>6} {'share':>7}")
tot_e = tot_i = 0
for h in functor_headers:
    e, i = len(executed[h]), len(instrumented[h])
    tot_e, tot_i = tot_e + e, tot_i + i
    print(f"{h:<52} {e:>9} {i:>6} {100.0 * e / i if i else 0:>6.1f}%")
print(f"{'include/partrain/cuda/launch.cuh (CUDA glue, GPU only)':<52} {0:>9} {kernel_lines:>6} {0:>6.1f}%")
share = tot_e / (tot_i + kernel_lines) if tot_i + kernel_lines else 0
print(f"summary: cpu_tier_line_share={share:.3f} functor_lines_executed={tot_e}/{tot_i} "
      f"gpu_only_lines={kernel_lines}")
PY
