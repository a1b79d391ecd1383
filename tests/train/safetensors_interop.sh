#!/usr/bin/env bash
# partrain's safetensors files against the Python package's (safetensors.numpy): a file the package
# writes is read by partrain and checked, a file partrain writes is read back by the package and
# checked bit for bit; both files must also be byte-identical (same order, same padding). Skipped
# (exit 77) where PYTHON cannot import safetensors and numpy (tools/setup.sh makes .cache/py-venv).
#   safetensors_interop.sh PYTHON SAFETENSORS_INTEROP
set -uo pipefail
python=$1 tool=$2
if ! "$python" -c 'import safetensors, numpy' >/dev/null 2>&1; then
  echo "skipped: '$python' cannot import safetensors and numpy (tools/setup.sh installs them in .cache/py-venv)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$tool" "$work" <<'PY'
import subprocess, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

tool, work = sys.argv[1], sys.argv[2]
# The tensors of safetensors_interop.cpp: (name, dtype, numpy dtype, shape), bytes by the same rule.
specs = [("bool", "BOOL", np.bool_, [3]), ("u8", "U8", np.uint8, [2, 3]), ("i8", "I8", np.int8, [4]),
         ("i16", "I16", np.int16, [2, 2]), ("u16", "U16", np.uint16, [3]), ("i32", "I32", np.int32, [2, 1, 2]),
         ("u32", "U32", np.uint32, [2]), ("i64", "I64", np.int64, [3]), ("u64", "U64", np.uint64, [1]),
         ("f16", "F16", np.float16, [2, 3]), ("f32", "F32", np.float32, [3, 2]), ("f64", "F64", np.float64, [2]),
         ("empty", "F32", np.float32, [0, 3]), ("scalar", "F64", np.float64, []), ("w\u00e9ight", "F32", np.float32, [2])]
metadata = {"note": "caf\u00e9 \"q\""}  # one entry: the package writes metadata in hash order

def raw(k, dt, shape):
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
    if dt is np.bool_:
        return bytes((j + k) & 1 for j in range(n))
    return bytes((j * 7 + k * 13 + 1) & 0xFF for j in range(n))

arrays = {name: np.frombuffer(raw(k, dt, shape), dtype=dt).reshape(shape) for k, (name, _, dt, shape) in enumerate(specs)}
failed = 0

# (a) the package writes, partrain reads and checks.
save_file(arrays, f"{work}/py.safetensors", metadata=metadata)
r = subprocess.run([tool, "check", f"{work}/py.safetensors"])
print(f"{'ok  ' if r.returncode == 0 else 'FAIL'}  partrain reads the package's file")
failed += r.returncode != 0

# (b) partrain writes, the package reads: every tensor's dtype, shape and bytes, and the metadata.
subprocess.run([tool, "write", f"{work}/cpp.safetensors"], check=True)
got = load_file(f"{work}/cpp.safetensors")
with safe_open(f"{work}/cpp.safetensors", "np") as f:
    got_meta = f.metadata()
bad = [name for name, a in arrays.items()
       if name not in got or got[name].dtype != a.dtype or list(got[name].shape) != list(a.shape)
       or got[name].tobytes() != a.tobytes()]
bad += sorted(set(got) - set(arrays))
if got_meta != metadata:
    bad.append("__metadata__")
print(f"{'ok  ' if not bad else 'FAIL'}  the package reads partrain's file ({len(got)} tensors){': ' + ', '.join(bad) if bad else ''}")
failed += bool(bad)

# Both writers agree byte for byte: tensor order, offsets, padding.
same = open(f"{work}/py.safetensors", "rb").read() == open(f"{work}/cpp.safetensors", "rb").read()
print(f"{'ok  ' if same else 'FAIL'}  both files are byte-identical")
failed += not same
sys.exit(1 if failed else 0)
PY
