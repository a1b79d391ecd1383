#!/usr/bin/env python3
"""What including partrain costs a user's build: wall seconds and peak memory of compiling

  (a) a file that includes only the facade <partrain/partrain.hpp>,
  (b) examples/ddp (the facade, Gloo when found),
  (c) the Fashion-MNIST example, every mode in one file,

at -fsyntax-only, -O0 and -O2, header-only and in the compiled mode (-DPARTRAIN_COMPILED=1: the
CMake option PARTRAIN_COMPILED, whose library src/compiled.cpp is compiled once, its own row),
each the median of --repeats runs taken in turns, then the
partrain headers that cost most on their own (-fsyntax-only of a file including just that header,
less the same for an empty file). Prints a table, then `summary: facade_syntax_s=... ddp_example_o2_s=...`.

  python3 bench/compile_time/compile_time.py [--cxx g++] [--repeats 3] [--headers 12] [--quick]
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def openblas_include():
    for d in ("/usr/include/x86_64-linux-gnu/openblas-pthread", "/usr/include/aarch64-linux-gnu/openblas-pthread",
              "/usr/include/openblas"):
        if os.path.exists(os.path.join(d, "cblas.h")):
            return d
    return None


def have_gloo():
    return os.path.exists("/usr/include/gloo/context.h")


def measure(cxx, args):
    """One compile in a child Python, so RUSAGE_CHILDREN's peak is that compile's."""
    code = ("import resource,subprocess,sys,time\n"
            "t=time.perf_counter()\n"
            "r=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.PIPE,text=True)\n"
            "w=time.perf_counter()-t\n"
            "sys.stderr.write(r.stderr[-3000:]) if r.returncode else None\n"
            "print(w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n")
    out = subprocess.run([sys.executable, "-c", code, cxx] + args, capture_output=True, text=True)
    wall, kib, rc = out.stdout.split()
    if rc != "0":
        sys.exit(f"compile_time: {' '.join([cxx] + args)} failed:\n{out.stderr}")
    return float(wall), int(kib)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--headers", type=int, default=12, help="how many of the costliest headers to list")
    ap.add_argument("--quick", action="store_true", help="one run each, no per-header list")
    a = ap.parse_args()
    if a.quick:
        a.repeats, a.headers = 1, 0

    tmp = tempfile.mkdtemp(prefix="partrain-compile-time-")
    facade = os.path.join(tmp, "facade.cpp")
    with open(facade, "w") as f:
        f.write("#include <partrain/partrain.hpp>\nint main() {}\n")
    empty = os.path.join(tmp, "empty.cpp")
    with open(empty, "w") as f:
        f.write("int main() {}\n")
    base = ["-std=c++20", "-I", os.path.join(ROOT, "include")]
    gloo = ["-DPARTRAIN_WITH_GLOO=1"] if have_gloo() else []
    cases = [("facade", base + [facade]), ("examples/ddp", base + gloo + [os.path.join(ROOT, "examples/ddp/main.cpp")])]
    blas = openblas_include()
    if blas:
        cases.append(("fashion_mnist (every mode)",
                      base + gloo + ["-I", os.path.join(ROOT, "models"), "-I", os.path.join(ROOT, "examples/fashion_mnist"),
                                     "-I", blas, os.path.join(ROOT, "examples/fashion_mnist/main.cpp")]))
    compiled = ["-DPARTRAIN_COMPILED=1"]
    cases += [(name + " (compiled mode)", compiled + args) for name, args in cases]
    cases.append(("the compiled mode's library (once)",
                  base + gloo + compiled + [os.path.join(ROOT, "src/compiled.cpp")]))
    levels = [("syntax", ["-fsyntax-only"]), ("-O0", ["-O0", "-c", "-o", os.devnull]), ("-O2", ["-O2", "-c", "-o", os.devnull])]

    runs = {}
    for _ in range(a.repeats):  # in turns, so a busy moment spreads over every row
        for name, args in cases:
            for level, flags in levels:
                runs.setdefault((name, level), []).append(measure(a.cxx, flags + args))

    print(f"compile time with {a.cxx} ({subprocess.run([a.cxx, '-dumpfullversion'], capture_output=True, text=True).stdout.strip()}), "
          f"{os.cpu_count()} CPUs, median of {a.repeats}")
    print(f"| file | {' | '.join(l for l, _ in levels)} | peak MiB (-O2) |")
    print("| --- |" + " --- |" * (len(levels) + 1))
    for name, _ in cases:
        cells = [f"{statistics.median(w for w, _ in runs[(name, l)]):.2f} s" for l, _ in levels]
        peak = max(k for _, k in runs[(name, "-O2")]) / 1024
        print(f"| {name} | {' | '.join(cells)} | {peak:.0f} |")

    if a.headers:
        floor = statistics.median(measure(a.cxx, ["-fsyntax-only", "-std=c++20", empty])[0] for _ in range(3))
        costs = []
        headers = sorted(glob.glob(os.path.join(ROOT, "include/partrain/**/*.hpp"), recursive=True))
        for h in headers:
            rel = os.path.relpath(h, os.path.join(ROOT, "include"))
            if "/detail/" in rel or rel == "partrain/partrain.hpp":
                continue
            with open(h, encoding="utf-8") as f:
                text = f.read()
            if "PARTRAIN_HAS_CUDA" in text.split("#pragma once")[-1][:400] and "#error" in text[:2000]:
                continue  # CUDA-only
            tu = os.path.join(tmp, "one.cpp")
            with open(tu, "w") as f:
                f.write(f"#include <{rel}>\nint main() {{}}\n")
            extra = gloo if "gloo" in rel else []
            if "mpi" in rel or "nccl" in rel:
                continue
            costs.append((measure(a.cxx, ["-fsyntax-only"] + base + extra + [tu])[0] - floor, rel))
        costs.sort(reverse=True)
        print(f"\nthe partrain headers that cost most on their own (-fsyntax-only, less {floor:.2f} s for an empty file; "
              "a header's cost includes what it includes):")
        print("| header | s |")
        print("| --- | --- |")
        for c, rel in costs[:a.headers]:
            print(f"| {rel} | {c:.2f} |")

    m = lambda name, level: statistics.median(w for w, _ in runs[(name, level)])
    summary = [f"facade_syntax_s={m('facade', 'syntax'):.2f}", f"facade_o0_s={m('facade', '-O0'):.2f}",
               f"ddp_example_o2_s={m('examples/ddp', '-O2'):.2f}", f"ddp_example_o0_s={m('examples/ddp', '-O0'):.2f}"]
    summary += [f"facade_syntax_compiled_s={m('facade (compiled mode)', 'syntax'):.2f}",
                f"ddp_example_o2_compiled_s={m('examples/ddp (compiled mode)', '-O2'):.2f}",
                f"compiled_library_o2_s={m(cases[-1][0], '-O2'):.2f}"]
    if blas:
        summary.append(f"fashion_mnist_o2_compiled_s={m('fashion_mnist (every mode) (compiled mode)', '-O2'):.2f}")
        summary.append(f"fashion_mnist_o2_s={m('fashion_mnist (every mode)', '-O2'):.2f}")
        summary.append(f"fashion_mnist_o2_peak_mib={max(k for _, k in runs[('fashion_mnist (every mode)', '-O2')]) / 1024:.0f}")
    print("summary: " + " ".join(summary))


if __name__ == "__main__":
    main()
