#!/usr/bin/env python3
"""ctest: the Fashion-MNIST example in mixed precision on the host.

1. fp16 and bf16 training reach a final test accuracy within 0.01 of fp32 after the same epochs
   (same seed, data, ranks and steps).
2. fp16 with a checkpoint: a run stopped after epoch 1 and resumed to epoch 2 ends with the same
   parameters (checksum) as a run of 2 epochs in one go: the scaler's state travels with it.
3. --reduce-16bit (gradients all_reduced in 16 bits) trains too.

usage: precision_check.py PROGRAM WORKDIR
"""
import os
import re
import shutil
import subprocess
import sys

program, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
base = ["--backend", "local", "--nproc", "2", "--limit-train", "12000", "--limit-test", "3000",
        "--log-every", "0", "--seed", "1"]


def run(*args):
    cmd = [program, *base, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"FAILED ({p.returncode}): {' '.join(cmd)}\n{out}")
    return out


def field(out, pattern, what):
    m = re.search(pattern, out)
    if not m:
        sys.exit(f"no '{what}' line in the output:\n{out}")
    return m.group(1)


acc = {}
for prec in ("fp32", "fp16", "bf16"):
    out = run("--epochs", "2", "--precision", prec)
    if prec != "fp32" and f"precision {prec}" not in out:
        sys.exit(f"the run does not report precision {prec}:\n{out}")
    acc[prec] = float(field(out, r"final test_accuracy ([0-9.]+)", "final test_accuracy"))
    print(f"{prec}: final test_accuracy {acc[prec]:.4f}")
failed = False
for prec in ("fp16", "bf16"):
    gap = abs(acc[prec] - acc["fp32"])
    ok = gap <= 0.01
    failed |= not ok
    print(f"{prec} vs fp32: |{acc[prec]:.4f} - {acc['fp32']:.4f}| = {gap:.4f} {'<=' if ok else '>'} 0.01")
if acc["fp32"] < 0.7:
    print(f"fp32 reached only {acc['fp32']:.4f}: the comparison means little")
    failed = True

straight = run("--epochs", "2", "--precision", "fp16", "--checkpoint", os.path.join(work, "a"))
first = run("--epochs", "1", "--precision", "fp16", "--checkpoint", os.path.join(work, "b"))
resumed = run("--epochs", "2", "--precision", "fp16", "--checkpoint", os.path.join(work, "b"))
if "resumed from" not in resumed:
    sys.exit(f"the second run did not resume:\n{resumed}")
c1 = field(straight, r"final parameter checksum ([0-9a-f]+)", "checksum")
c2 = field(resumed, r"final parameter checksum ([0-9a-f]+)", "checksum")
s1 = field(straight, r"loss scale now ([0-9.e+]+)", "loss scale")
s2 = field(resumed, r"loss scale now ([0-9.e+]+)", "loss scale")
print(f"fp16 2 epochs straight: checksum {c1}, scale {s1}; 1 + resumed 1: checksum {c2}, scale {s2}")
if c1 != c2 or s1 != s2:
    print("the resumed fp16 run differs from the straight one")
    failed = True

out = run("--epochs", "1", "--precision", "bf16", "--reduce-16bit")
if "gradients reduced in 16 bits" not in out:
    sys.exit(f"--reduce-16bit is not reported:\n{out}")
a16 = float(field(out, r"final test_accuracy ([0-9.]+)", "final test_accuracy"))
print(f"bf16 with 16-bit all_reduce, 1 epoch: {a16:.4f}")
if a16 < 0.6:
    print("bf16 with 16-bit gradient reduction did not train")
    failed = True
sys.exit(1 if failed else 0)
