#!/usr/bin/env python3
"""Runs every command of the documentation, so the docs cannot rot.

  run_doc_commands.py --root REPO --build BUILD_DIR [--timeout 60] [--list] [FILE.md ...]

Every fenced block tagged ```sh in README.md and docs/*.md (globbed now, so pages added later are
covered) is a list of commands: one per line, an optional "$ " prompt, a trailing "\\" joins the
next line, blank lines and "# comments" are skipped. Blocks that must not run here (multi-node,
Slurm, installing packages) are tagged ```console or ```text instead.

The commands are written as a user types them at the repository root after tools/test.sh built
build/. Each page runs in a scratch directory of its own that looks like the repository root:
symbolic links to the repository's top-level entries, and build -> BUILD_DIR. So `build/...` reaches
the tested build, `tools/...` the repository's tools, and files a command writes (metrics, traces,
checkpoints) stay out of the tree and are there for the page's later commands. `export NAME=VALUE`
lines carry over to the page's later commands.

Each command gets --timeout seconds (default 60). The first failure ends the run with the file,
line and command, and the end of its output; exit status 1.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


def extract(path):
    """[(line number, command)] of the ```sh blocks of one Markdown file."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fence = None  # the opening fence while inside a block
    lang = ""
    pending, pending_line = "", 0
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, lang = m.group(2), m.group(3).lower()
            continue
        if m and m.group(2).startswith(fence[0]) and len(m.group(2)) >= len(fence) and not m.group(3):
            if pending:
                raise SystemExit(f"{path}:{pending_line}: the command ends in '\\' at the end of its block")
            fence = None
            continue
        if lang != "sh":
            continue
        text = line.strip()
        if not pending:
            if not text or text.startswith("#"):
                continue
            if text.startswith("$ "):
                text = text[2:].strip()
            pending_line = n
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        out.append((pending_line, pending + text))
        pending = ""
    if fence is not None:
        raise SystemExit(f"{path}: a ``` block is not closed")
    return out


def scratch_root(root, build, into):
    """A directory that looks like the repository root, with build -> the tested build."""
    for name in os.listdir(root):
        if name == "build" or name.startswith("."):
            continue
        os.symlink(os.path.join(root, name), os.path.join(into, name))
    os.symlink(build, os.path.join(into, "build"))


def apply_export(cmd, env, cwd):
    """Runs an `export ...` line in bash and takes the environment it leaves."""
    r = subprocess.run(["bash", "-c", cmd + "\nenv -0"], cwd=cwd, env=env, capture_output=True, timeout=30)
    if r.returncode != 0:
        return r
    env.clear()
    for item in r.stdout.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode()] = v.decode()
    return r


def tail(text, lines=25):
    t = text.decode(errors="replace").rstrip().splitlines()
    return "\n".join(("    " + l) for l in t[-lines:])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="the repository")
    p.add_argument("--build", required=True, help="the build directory that build/ stands for")
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--list", action="store_true", help="print the commands, run nothing")
    p.add_argument("files", nargs="*", help="only these Markdown files (default: README.md and docs/*.md)")
    args = p.parse_args()
    root, build = os.path.abspath(args.root), os.path.abspath(args.build)
    files = args.files or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    pages = [(f, extract(f)) for f in files if os.path.exists(f)]
    total = sum(len(c) for _, c in pages)
    if args.list:
        for f, cmds in pages:
            for n, c in cmds:
                print(f"{os.path.relpath(f, root)}:{n}: {c}")
        return
    if total == 0:
        print("run_doc_commands: no ```sh commands found in " + ", ".join(files))
        sys.exit(1)
    if not os.path.isdir(build):
        print(f"run_doc_commands: the build directory {build} does not exist")
        sys.exit(1)
    started = time.monotonic()
    ran = 0
    for f, cmds in pages:
        if not cmds:
            continue
        rel = os.path.relpath(f, root)
        env = dict(os.environ)
        with tempfile.TemporaryDirectory(prefix="partrain_docs_") as cwd:
            scratch_root(root, build, cwd)
            for n, cmd in cmds:
                t0 = time.monotonic()
                where = f"{rel}:{n}"
                try:
                    if re.match(r"^export\s", cmd):
                        r = apply_export(cmd, env, cwd)
                    else:
                        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, timeout=args.timeout)
                except subprocess.TimeoutExpired as e:
                    print(f"FAILED {where}: timed out after {args.timeout:.0f} s: {cmd}")
                    if e.output:
                        print(tail(e.output))
                    print("  (documentation commands run at a small size: give the command smaller sizes, "
                          "e.g. --limit-train 2000 --epochs 1, or tag its block ```console)")
                    sys.exit(1)
                dt = time.monotonic() - t0
                ran += 1
                if r.returncode != 0:
                    print(f"FAILED {where}: exit status {r.returncode}: {cmd}")
                    print(tail((r.stdout or b"") + (r.stderr or b"")))
                    sys.exit(1)
                print(f"ok {dt:5.1f} s  {where}: {cmd}")
    print(f"run_doc_commands: {ran} command(s) from {len([p for p in pages if p[1]])} page(s) passed "
          f"in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
