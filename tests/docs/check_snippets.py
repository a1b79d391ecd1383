#!/usr/bin/env python3
"""Checks that the code the documentation shows is the code that runs.

  check_snippets.py --root REPO [FILE.md ...]

A fenced block right after a line `<!-- from: path/in/repo -->` must appear, line for line and
consecutively, in that file (an example built and run by its own test), so a snippet cannot drift
from the program it was taken from. Pages default to README.md and docs/*.md. Exit status 1 names
the page, the line and the first snippet line not found.
"""
import argparse
import glob
import os
import re
import sys

FROM = re.compile(r"^\s*<!--\s*from:\s*(\S+)\s*-->\s*$")
FENCE = re.compile(r"^\s*(```+|~~~+)")


def snippets(path):
    """[(line number, source file, [lines])] of the page's blocks marked with a source."""
    out, source, block, start = [], None, None, 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines, 1):
        if block is not None:
            if FENCE.match(line):
                out.append((start, source, block))
                block, source = None, None
            else:
                block.append(line)
            continue
        m = FROM.match(line)
        if m:
            source = m.group(1)
        elif FENCE.match(line) and source:
            block, start = [], n
        elif line.strip():
            source = None  # the marker applies to the very next block only
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("pages", nargs="*")
    a = ap.parse_args()
    pages = a.pages or [os.path.join(a.root, "README.md")] + sorted(glob.glob(os.path.join(a.root, "docs", "*.md")))
    checked = 0
    for page in pages:
        for start, source, block in snippets(page):
            with open(os.path.join(a.root, source), encoding="utf-8") as f:
                text = f.read().splitlines()
            found = any(text[i:i + len(block)] == block for i in range(len(text) - len(block) + 1))
            if not found:
                missing = next((l for l in block if l not in text), block[0] if block else "")
                print(f"{page}:{start}: the snippet is not in {source}; first line not found:\n  {missing}")
                return 1
            checked += 1
    if checked == 0:
        print("check_snippets: no snippet marked <!-- from: ... --> in", pages)
        return 1
    print(f"check_snippets: {checked} snippet(s) found in their sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
