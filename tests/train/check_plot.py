#!/usr/bin/env python3
"""ctest: tools/plot_metrics.py turns a sample metrics file (and a benchmark table, whitespace or
CSV) into PNGs of the asked size. Exit 77 (skipped) without gnuplot."""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

tool, outdir = sys.argv[1], sys.argv[2]
if not shutil.which("gnuplot"):
    print("skipped: gnuplot is not installed (tools/setup.sh installs gnuplot-nox)")
    sys.exit(77)
os.makedirs(outdir, exist_ok=True)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


metrics = os.path.join(outdir, "sample.jsonl")
with open(metrics, "w") as f:
    for step in range(1, 61):
        f.write(json.dumps({"kind": "step", "step": step, "time": 0, "loss": 2.0 * math.exp(-step / 20) + 0.3}) + "\n")
        if step % 20 == 0:
            f.write(json.dumps({"kind": "epoch", "epoch": step // 20 - 1, "time": 0, "accuracy": 0.6 + step / 300,
                                "val_loss": None}) + "\n")
table = os.path.join(outdir, "bench.txt")
with open(table, "w") as f:
    f.write("bench_x: a table\nmode  ranks  samples/s\nddp overlap  1  1000\nddp overlap  2  1900\nplain  1  1050\n"
            "summary: x=1\n")

curve = os.path.join(outdir, "curve.csv")  # bench_slow_link's accuracy over time
with open(curve, "w") as f:
    f.write("mode,step,seconds_100mbit,test_accuracy\nddp,100,7.8,0.81\nddp,200,15.6,0.84\n"
            "diloco,100,0.4,0.81\ndiloco,200,0.8,0.83\n")

cases = [([metrics, "--size", "640x360"], (640, 360)),
         (["--table", table, "--x", "ranks", "--y", "samples/s", "--size", "500x300"], (500, 300)),
         (["--table", curve, "--x", "seconds_100mbit", "--y", "test_accuracy", "--logx", "--yrange", "0.7:0.9",
           "--key", "bottom right", "--size", "400x300"], (400, 300))]
for n, (args, size) in enumerate(cases):
    out = os.path.join(outdir, f"plot{n}.png")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, tool, *args, "-o", out], check=True)
    got = png_size(out)
    assert got == size, f"{out}: {got[0]}x{got[1]}, expected {size[0]}x{size[1]}"
    print(f"{out}: {got[0]}x{got[1]} ok")

# Bad input is named.
bad = subprocess.run([sys.executable, tool, table, "-o", os.path.join(outdir, "bad.png")], capture_output=True, text=True)
assert bad.returncode != 0 and "not JSON" in bad.stderr, bad.stderr
bad = subprocess.run([sys.executable, tool, "--table", curve, "--x", "seconds", "--y", "test_accuracy", "-o",
                      os.path.join(outdir, "bad.png")], capture_output=True, text=True)
assert bad.returncode != 0 and "no header row naming both 'seconds'" in bad.stderr, bad.stderr
print("ok")
