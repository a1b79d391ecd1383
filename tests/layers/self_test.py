#!/usr/bin/env python3
"""Proves check_layers.py can fail: in a copy of include/ and docs/, a core header that includes a
train header (upward) and a comm <-> comm/x cycle must each be reported; the clean copy must pass."""
import pathlib
import shutil
import subprocess
import sys

src, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
check = pathlib.Path(__file__).with_name("check_layers.py")


def run() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(check), str(work)], capture_output=True, text=True)


shutil.rmtree(work, ignore_errors=True)
for d in ("include", "docs"):
    shutil.copytree(src / d, work / d)
clean = run()
assert clean.returncode == 0, "clean tree failed:\n" + clean.stderr
core = work / "include/partrain/core/error.hpp"
core.write_text(core.read_text() + "\n#include <partrain/train/epochs.hpp>\n")
up = run()
assert up.returncode == 1 and "core/error.hpp" in up.stderr and "train/epochs.hpp" in up.stderr, up.stderr
core.write_text(core.read_text().replace("\n#include <partrain/train/epochs.hpp>\n", "\n"))
nested = work / "include/partrain/comm/x"
nested.mkdir()
(nested / "a.hpp").write_text("#include <partrain/comm/local.hpp>\n")
(work / "include/partrain/comm/b.hpp").write_text("#include <partrain/comm/x/a.hpp>\n")
cyc = run()
assert cyc.returncode == 1 and "folder cycle" in cyc.stderr, cyc.stderr
print("layers self-test: clean tree passes; an upward include and a folder cycle are each reported")
