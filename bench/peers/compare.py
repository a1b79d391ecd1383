#!/usr/bin/env python3
"""partrain against PyTorch on this machine, side by side: the example's job (MLP 784-256-128-10
on Fashion-MNIST, batch 64 per rank, SGD lr 0.05 momentum 0.9, cosine per epoch, the same initial
weights) run by partrain and by PyTorch (torch_mlp.py), in alternation, with the medians printed:

  partrain 2 ranks      the main job (tools/run_main.sh): 2 ranks as threads of one process,
                        ZeRO-2 with its step over shared memory (--backend local --nproc 2 --parallel zero2)
  partrain 1 rank       one process (--backend local --nproc 1)
  torch DDP 2 ranks     DistributedDataParallel over gloo, 1 thread per rank
  torch 1 process       one process at PyTorch's default threads (all cores)

Figures: steady-state samples/s (the last epoch's training loop), wall time of the whole run,
and the peak resident memory of the largest process (per rank). PyTorch comes from PyPI into a
venv this script creates (--venv, default build/peers-venv; several GB); where it cannot be
installed the script says so and exits 0 with no figures.

  bench/peers/compare.py [--build build] [--epochs 2] [--repeats 2] [--venv DIR]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = "/usr/share/datasets/fashion-mnist"
MAIN_JOB = ["--backend", "local", "--nproc", "2", "--parallel", "zero2"]  # tools/run_main.sh's defaults


def ensure_torch(venv):
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import torch, torch.distributed as d; assert d.is_gloo_available(); print(torch.__version__)"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"peers: installing PyTorch from PyPI into {venv} (once; several GB)", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "torch", "numpy"], check=True, timeout=3600)
        subprocess.run(probe, check=True, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        print(f"peers: skipped: PyTorch could not be installed ({e})")
        return None
    return py


def measure(cmd):
    """Runs cmd; returns (output, wall seconds, peak RSS in MiB of its largest process)."""
    wrapper = ("import resource, subprocess, sys, time\n"
               "t = time.perf_counter()\n"
               "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)\n"
               "sys.stdout.write(p.stdout)\n"
               "print(f'@@ rc={p.returncode} wall={time.perf_counter() - t:.3f} "
               "maxrss_kib={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}')\n")
    out = subprocess.run([sys.executable, "-c", wrapper] + cmd, capture_output=True, text=True).stdout
    m = re.search(r"@@ rc=(-?\d+) wall=([\d.]+) maxrss_kib=(\d+)", out)
    if not m or m.group(1) != "0":
        raise SystemExit(f"peers: {' '.join(cmd)} failed:\n{out[-3000:]}")
    return out, float(m.group(2)), int(m.group(3)) / 1024


def last_samples_per_s(out):
    rates = re.findall(r"epoch \d+/\d+ .*?samples/s (\d+)", out.replace("\r", "\n"))
    if not rates:
        raise SystemExit(f"peers: no 'samples/s' in the output:\n{out[-2000:]}")
    return float(rates[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--venv", default=None)
    a = ap.parse_args()
    if a.epochs < 1 or a.repeats < 1:
        raise SystemExit("peers: --epochs and --repeats must be >= 1")
    example = os.path.join(a.build, "examples", "fashion_mnist", "fashion_mnist")
    export = os.path.join(a.build, "bench", "peers", "peers_export_init")
    for f in (example, export):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"peers: {f} is missing: build it first (tools/test.sh, or cmake --build {a.build})")
    py = ensure_torch(a.venv or os.path.join(a.build, "peers-venv"))
    if not py:
        print("summary: skipped=1")
        return 0

    tmp = tempfile.mkdtemp(prefix="partrain-peers-")
    init = os.path.join(tmp, "init.bin")
    subprocess.run([export, init], check=True)
    help_text = subprocess.run([example, "--help"], capture_output=True, text=True).stdout
    e = ["--epochs", str(a.epochs)]
    if "zero2" not in help_text:
        raise SystemExit(f"peers: {example} has no --parallel zero2: rebuild it")
    main_job = ("partrain 2 ranks", [example, *MAIN_JOB, *e])
    torch_cmd = [py, os.path.join(HERE, "torch_mlp.py"), "--data", DATA, "--init", init, *e]
    runs = [main_job,
            ("torch DDP 2 ranks (gloo)", torch_cmd + ["--ddp", "2", "--threads", "1"]),
            ("partrain 1 rank", [example, "--backend", "local", "--nproc", "1", *e]),
            ("torch 1 process", torch_cmd)]
    results = {name: [] for name, _ in runs}
    for r in range(a.repeats):
        for name, cmd in runs:  # alternating, so drift in the machine's load hits every run alike
            out, wall, rss = measure(cmd)
            results[name].append((last_samples_per_s(out), wall, rss))
            print(f"  run {r + 1}/{a.repeats} {name}: {results[name][-1][0]:.0f} samples/s, {wall:.1f} s, "
                  f"{rss:.0f} MiB", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)

    med = {n: tuple(statistics.median(x[i] for x in v) for i in range(3)) for n, v in results.items()}
    print(f"\npeers: {a.epochs} epoch(s), medians of {a.repeats} alternating runs, {os.cpu_count()} cores")
    print(f"{'run':<26} {'samples/s':>10} {'wall s':>8} {'peak MiB/rank':>14}")
    for name, _ in runs:
        s, w, m = med[name]
        print(f"{name:<26} {s:>10.0f} {w:>8.1f} {m:>14.0f}")
    ours, ddp, single = med[main_job[0]], med["torch DDP 2 ranks (gloo)"], med["torch 1 process"]
    one = med["partrain 1 rank"]
    print(f"summary: vs_torch_ddp_samples={ours[0] / ddp[0]:.3f} vs_torch_single_samples={ours[0] / single[0]:.3f} "
          f"vs_torch_ddp_wall={ddp[1] / ours[1]:.3f} vs_torch_ddp_memory={ddp[2] / ours[2]:.3f} "
          f"one_rank_vs_torch_single={one[0] / single[0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
