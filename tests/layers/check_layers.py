#!/usr/bin/env python3
"""Checks that partrain's headers respect the layer table of docs/architecture.md.

The table (rows `| N | `folder/` | ... | `a/`, `b/` |`) is the one source: a header under
include/partrain/<folder>/ may include its own folder, config.hpp, and the folders its row lists;
each listed folder must sit on a lower layer; every folder of the tree must have a row. Then no
two folders (nested folders such as parallel/pipeline counted on their own, detail/ as part of its
parent) may include each other, directly or through others. Exit 1 with one line per breach.
"""
from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
HEADERS = ROOT / "include" / "partrain"
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([a-z_]+)/`\s*\|(.*)\|\s*([^|]*)\|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]partrain/([^>"]+)[>"]')


def read_table() -> dict[str, tuple[int, set[str]]]:
    table = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            table[m.group(2)] = (int(m.group(1)), set(re.findall(r"`([a-z_]+)/`", m.group(4))))
    return table


def node_of(rel: pathlib.PurePosixPath) -> str:
    """The folder a header belongs to, for the cycle check: detail/ folds into its parent."""
    parts = [p for p in rel.parts[:-1] if p != "detail"]
    return "/".join(parts)


def main() -> int:
    table = read_table()
    errors: list[str] = []
    if not table:
        return print(f"layers: no layer table found in {DOC}", file=sys.stderr) or 1
    for folder, (layer, allowed) in table.items():
        for a in sorted(allowed):
            if a not in table:
                errors.append(f"{DOC.name}: `{folder}/` may include `{a}/`, which has no row")
            elif table[a][0] >= layer:
                errors.append(f"{DOC.name}: `{folder}/` (layer {layer}) lists `{a}/` (layer {table[a][0]}), not below it")
    edges: dict[str, set[str]] = {}
    for path in sorted(HEADERS.rglob("*")):
        if path.suffix not in (".hpp", ".cuh") or not path.is_file():
            continue
        rel = pathlib.PurePosixPath(path.relative_to(HEADERS).as_posix())
        if len(rel.parts) == 1:
            continue  # partrain.hpp (the facade) and config.hpp sit above and below everything
        folder = rel.parts[0]
        if folder not in table:
            errors.append(f"include/partrain/{folder}/ has no row in the layer table of {DOC.name}")
            continue
        allowed = table[folder][1] | {folder}
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = pathlib.PurePosixPath(m.group(1))
            if len(target.parts) == 1:
                continue
            if target.parts[0] not in allowed:
                errors.append(f"include/partrain/{rel}:{n}: includes <partrain/{target}>, but `{folder}/` "
                              f"(layer {table[folder][0]}) may include only {sorted(allowed)}")
            a, b = node_of(rel), node_of(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    # Folder cycles: depth-first search over the folder graph.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                errors.append("folder cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    for e in errors:
        print(e, file=sys.stderr)
    nheaders = sum(1 for p in HEADERS.rglob("*") if p.suffix in (".hpp", ".cuh"))
    print(f"layers: {len(table)} folders, {nheaders} headers, {sum(len(v) for v in edges.values())} folder edges, "
          f"{len(errors)} breach(es)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
