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

Figures a page shows as a command's output are checked, not typed by hand: a line
`<!-- checked: PHRASE | PHRASE2 -->` before a ```text block says that the block's line containing
each PHRASE must be printed, exactly, by the ```sh block above it (e.g. a checksum). --update rewrites such
lines from what the commands printed.

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
CHECKED = re.compile(r"^\s*<!--\s*checked:\s*(.+?)\s*-->\s*$")


def extract(path, checks=None):
    """[(line number, command, sh block number)] of the ```sh blocks of one Markdown file; appends to
    `checks` the checked output lines: (line number, sh block number, phrase, the line as written)."""
    out = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    fence = None  # the opening fence while inside a block
    lang = ""
    pending, pending_line = "", 0
    block = -1  # the current (or last) sh block
    phrase = None  # a <!-- checked: --> waiting for its text block
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None:
            c = CHECKED.match(line)
            if c:
                phrase = c.group(1)
            elif m:
                fence, lang = m.group(2), m.group(3).lower()
                if lang == "sh":
                    block += 1
                    phrase = None
                elif phrase is not None:
                    if block < 0:
                        raise SystemExit(f"{path}:{n}: <!-- checked: {phrase} --> has no ```sh block above it")
                    for one in (x.strip() for x in phrase.split("|")):
                        for k, l in enumerate(lines[n:], n + 1):
                            if FENCE.match(l):
                                raise SystemExit(f"{path}:{n}: no line of the block contains the checked phrase '{one}'")
                            if one in l:
                                if checks is not None:
                                    checks.append((k, block, one, l.strip()))
                                break
                    phrase = None
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
        out.append((pending_line, pending + text, block))
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
    p.add_argument("--update", action="store_true", help="rewrite checked output lines from what the commands print")
    p.add_argument("files", nargs="*", help="only these Markdown files (default: README.md and docs/*.md)")
    args = p.parse_args()
    root, build = os.path.abspath(args.root), os.path.abspath(args.build)
    files = args.files or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    checks = {f: [] for f in files}
    pages = [(f, extract(f, checks[f])) for f in files if os.path.exists(f)]
    total = sum(len(c) for _, c in pages)
    if args.list:
        for f, cmds in pages:
            for n, c, _ in cmds:
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
    checked = 0
    for f, cmds in pages:
        if not cmds:
            continue
        rel = os.path.relpath(f, root)
        env = dict(os.environ)
        outputs = {}  # sh block -> what its commands printed
        with tempfile.TemporaryDirectory(prefix="partrain_docs_") as cwd:
            scratch_root(root, build, cwd)
            for n, cmd, block in cmds:
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
                outputs[block] = outputs.get(block, b"") + (r.stdout or b"") + (r.stderr or b"")
        checked += verify_checks(f, rel, checks[f], outputs, args.update)
    print(f"run_doc_commands: {ran} command(s) from {len([p for p in pages if p[1]])} page(s) passed, "
          f"{checked} checked output line(s) matched, in {time.monotonic() - started:.1f} s")


def verify_checks(path, rel, checks, outputs, update):
    """Each checked line must be a line the block above it printed; --update writes the printed one."""
    if not checks:
        return 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    changed = False
    for n, block, phrase, written in checks:
        printed = [l.strip() for l in outputs.get(block, b"").decode(errors="replace").splitlines() if phrase in l]
        if written in printed:
            continue
        if update and printed:
            indent = lines[n - 1][: len(lines[n - 1]) - len(lines[n - 1].lstrip())]
            lines[n - 1] = indent + printed[-1] + "\n"
            changed = True
            print(f"updated {rel}:{n}: {printed[-1]}")
            continue
        print(f"FAILED {rel}:{n}: the page shows '{written}', but its commands printed "
              + (" / ".join(f"'{p}'" for p in printed) if printed else f"no line containing '{phrase}'")
              + " (rerun with --update to take the printed line)")
        sys.exit(1)
    if changed:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(lines)
    return len(checks)


if __name__ == "__main__":
    main()
