#!/usr/bin/env python3
"""The example ViT in partrain and in PyTorch on this machine, side by side: the same model
(models/vit_layers.hpp; torch_vit.py writes it with nn.Module), the same initial weights
(peers_export_vit_init), the same batches (partrain's sampler, seed 0, ported), batch 64 per rank,
AdamW (lr 1e-3, wd 0.01) with warmup_cosine_lr per step, run in alternation, medians printed:

  partrain 2 ranks      bench_vit --train-only --train-epochs E: DDP, 2 ranks as threads of one
                        process (local backend), one OpenBLAS thread per rank
  torch DDP 2 ranks     DistributedDataParallel over gloo, 2 processes, 1 thread each
  torch 1 process       one process at PyTorch's default threads (all cores), batch 64

First, once: K AdamW steps (constant lr) of both on one process over the same batches, their losses
printed side by side; step 0's is the initial loss on the first batch, which checks the weight
mapping (they must agree to 1e-4, or the script stops). Figures: steady-state samples/s (the last
epoch, after its first 10 steps), wall time of the whole run, the peak resident memory of the
largest process and per rank (partrain's 2 ranks share one process and its one copy of the data),
and the test accuracy reached. PyTorch comes from the venv compare.py uses (build/peers-venv; its
ensure_torch installs it from PyPI when missing); where torch cannot be imported the script says
why and exits 0 with no figures.

  bench/peers/compare_vit.py [--build build] [--epochs 1] [--repeats 2] [--check-steps 5] [--venv DIR]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # importing compare.py leaves no __pycache__ in the source tree
from compare import DATA, ensure_torch, last_samples_per_s, measure  # noqa: E402

TOLERANCE = 1e-4  # on the initial loss


def check_losses(out):
    return [float(v) for v in re.findall(r"check step \d+ loss ([-\d.eE+]+)", out)]


def last_accuracy(out):
    acc = re.findall(r"test_accuracy ([\d.]+)", out)
    return float(acc[-1]) if acc else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--check-steps", type=int, default=5)
    ap.add_argument("--venv", default=None)
    a = ap.parse_args()
    if a.epochs < 1 or a.repeats < 1 or a.check_steps < 1:
        raise SystemExit("peers: --epochs, --repeats and --check-steps must be >= 1")
    bench = os.path.join(a.build, "bench", "vit", "bench_vit")
    export = os.path.join(a.build, "bench", "peers", "peers_export_vit_init")
    for f in (bench, export):
        if not os.access(f, os.X_OK):
            raise SystemExit(f"peers: {f} is missing: build it first (ninja bench_vit peers_export_vit_init)")
    py = ensure_torch(a.venv or os.path.join(a.build, "peers-venv"))
    if not py:
        print("summary: skipped=1")
        return 0

    tmp = tempfile.mkdtemp(prefix="partrain-peers-vit-")
    try:
        init = os.path.join(tmp, "vit_init.bin")
        subprocess.run([export, init], check=True)
        torch_cmd = [py, os.path.join(HERE, "torch_vit.py"), "--data", DATA, "--init", init]

        # The same model, weights, batches and optimizer: the losses of the first steps agree.
        k = ["--check-steps", str(a.check_steps)]
        ours = check_losses(subprocess.run([bench, *k], capture_output=True, text=True, check=True).stdout)
        theirs = check_losses(subprocess.run(torch_cmd + k, capture_output=True, text=True, check=True).stdout)
        if len(ours) != a.check_steps or len(theirs) != a.check_steps:
            raise SystemExit(f"peers: expected {a.check_steps} check losses, got {len(ours)} (partrain) and "
                             f"{len(theirs)} (torch)")
        print(f"check: {a.check_steps} AdamW steps on one process, the same batches (loss before each step)")
        print(f"{'step':>4} {'partrain':>12} {'torch':>12} {'|difference|':>13}")
        for s, (p, t) in enumerate(zip(ours, theirs)):
            print(f"{s:>4} {p:>12.7f} {t:>12.7f} {abs(p - t):>13.2e}")
        initial_diff = abs(ours[0] - theirs[0])
        if initial_diff > TOLERANCE:
            raise SystemExit(f"peers: the initial losses differ by {initial_diff:.2e} (> {TOLERANCE}): the weights or "
                             f"the data do not map")
        print(f"initial loss on the first batch agrees: |difference| {initial_diff:.1e} <= {TOLERANCE}\n", flush=True)

        e = ["--epochs", str(a.epochs)]
        ours_name, ddp_name, single_name = "partrain 2 ranks (threads)", "torch DDP 2 ranks (gloo)", "torch 1 process"
        runs = [(ours_name, [bench, "--train-only", "--train-epochs", str(a.epochs)], 2),
                (ddp_name, torch_cmd + e + ["--ddp", "2", "--threads", "1"], 1),
                (single_name, torch_cmd + e, 1)]
        results = {name: [] for name, _, _ in runs}
        for r in range(a.repeats):
            for name, cmd, _ in runs:  # alternating, so drift in the machine's load hits every run alike
                out, wall, rss = measure(cmd)
                results[name].append((last_samples_per_s(out), wall, rss, last_accuracy(out)))
                print(f"  run {r + 1}/{a.repeats} {name}: {results[name][-1][0]:.0f} samples/s, {wall:.1f} s, "
                      f"{rss:.0f} MiB, test accuracy {results[name][-1][3]:.4f}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {n: tuple(statistics.median(x[i] for x in v) for i in range(4)) for n, v in results.items()}
    print(f"\npeers (ViT): {a.epochs} epoch(s), batch 64 per rank, medians of {a.repeats} alternating runs, "
          f"{os.cpu_count()} cores")
    print(f"{'run':<28} {'samples/s':>10} {'(runs min-max)':>15} {'wall s':>8} {'peak MiB':>9} {'ranks in it':>11} "
          f"{'MiB/rank':>9} {'test acc':>9}")
    for name, _, ranks in runs:
        s, w, m, acc = med[name]
        rates = [x[0] for x in results[name]]
        spread = f"{min(rates):.0f}-{max(rates):.0f}"
        print(f"{name:<28} {s:>10.0f} {spread:>15} {w:>8.1f} {m:>9.0f} {ranks:>11} {m / ranks:>9.0f} {acc:>9.4f}")
    print("peak MiB: the largest process's resident peak (torch DDP: one rank's process); a wide min-max means the "
          "machine's load changed between runs (more --repeats, or a quiet machine)")
    ours, ddp, single = med[ours_name], med[ddp_name], med[single_name]
    print(f"summary: vit_vs_torch={ours[0] / ddp[0]:.3f} vit_vs_torch_single={ours[0] / single[0]:.3f} "
          f"vit_vs_torch_wall={ddp[1] / ours[1]:.3f} initial_loss_diff={initial_diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
