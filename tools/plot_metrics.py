#!/usr/bin/env python3
"""Charts for partrain runs, drawn with gnuplot (Debian gnuplot-nox; no Python packages needed).

  plot_metrics.py metrics.jsonl -o run.png [--size 1000x450]
      loss over steps (step records) beside every numeric epoch field (accuracy, loss...) over
      epochs, from the JSON-lines file written by partrain::metrics_writer.
  plot_metrics.py --table bench.txt -o scaling.png --x ranks --y samples/s [--series mode]
      a scaling chart from a benchmark's whitespace table (the header row names the columns;
      rows whose x and y are numbers are plotted, one line per value of the series column).
      A .csv table (commas, e.g. bench_slow_link's accuracy over time) is read the same way;
      --logx puts x on a log scale, --yrange LO:HI fixes y (default from 0).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("plot_metrics: " + msg, file=sys.stderr)
    sys.exit(2)


def number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def read_metrics(path):
    steps, epochs = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not JSON ({e}); expected one metrics record per line")
            kind = rec.get("kind")
            if kind is None:  # older files without "kind": a record naming an epoch is per epoch
                kind = "epoch" if "epoch" in rec else "step" if "step" in rec else None
            if kind == "step":
                steps.append(rec)
            elif kind == "epoch":
                epochs.append(rec)
    if not steps and not epochs:
        fail(f"{path}: no step or epoch records (expected lines like {{\"kind\":\"step\",\"step\":1,\"loss\":0.5}})")
    return steps, epochs


def write_columns(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(" ".join("NaN" if v is None else repr(v) for v in row) + "\n")


def quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_gnuplot(script):
    gp = shutil.which("gnuplot")
    if not gp:
        fail("gnuplot not found (install Debian's gnuplot-nox, as tools/setup.sh does)")
    r = subprocess.run([gp], input=script, text=True, capture_output=True)
    if r.returncode != 0:
        fail("gnuplot failed:\n" + r.stderr)


def terminal(size):
    w, h = size
    return f"set terminal pngcairo size {w},{h} noenhanced font 'sans,10'\n"


def plot_metrics(args, tmp):
    steps, epochs = read_metrics(args.metrics)
    script = terminal(args.size) + f"set output {quote(args.output)}\nset grid\nset key below\n"
    panels = []
    step_keys = [k for k in ("loss",) if any(number(r.get(k)) is not None for r in steps)]
    if step_keys:
        data = os.path.join(tmp, "steps.dat")
        write_columns(data, [[number(r.get("step"))] + [number(r.get(k)) for k in step_keys] for r in steps])
        plots = ", ".join(f"{quote(data)} using 1:{i + 2} with lines lw 1.5 title {quote(k)}" for i, k in enumerate(step_keys))
        panels.append("set title 'per step'\nset xlabel 'step'\nplot " + plots + "\n")
    skip = {"kind", "epoch", "time", "step", "samples_per_s", "bytes_sent"}  # other scales than accuracy and loss
    epoch_keys = sorted({k for r in epochs for k, v in r.items() if k not in skip and number(v) is not None})
    if epoch_keys:
        data = os.path.join(tmp, "epochs.dat")
        write_columns(data, [[number(r.get("epoch"))] + [number(r.get(k)) for k in epoch_keys] for r in epochs])
        plots = ", ".join(f"{quote(data)} using 1:{i + 2} with linespoints lw 1.5 pt 7 title {quote(k)}"
                          for i, k in enumerate(epoch_keys))
        panels.append("set title 'per epoch'\nset xlabel 'epoch'\nset xtics 1\nplot " + plots + "\n")
    if not panels:
        fail(f"{args.metrics}: no numeric fields to plot (expected 'loss' in step records or numbers in epoch records)")
    title = f" title {quote(args.title)}" if args.title else ""
    script += f"set multiplot layout 1,{len(panels)}{title}\n" + "".join(panels) + "unset multiplot\n"
    run_gnuplot(script)


def plot_table(args, tmp):
    with open(args.table, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip()]
    csv = args.table.endswith(".csv")

    def split(line):
        return [c.strip() for c in line.split(",")] if csv else line.split()

    header_at = next((i for i, l in enumerate(lines) if args.x in split(l) and args.y in split(l)), None)
    if header_at is None:
        fail(f"{args.table}: no header row naming both '{args.x}' and '{args.y}'")
    names = split(lines[header_at])
    xi, yi = names.index(args.x), names.index(args.y)
    si = names.index(args.series) if args.series in names else None
    series = {}
    for l in lines[header_at + 1:]:
        cells = split(l)
        if len(cells) < len(names):
            continue
        extra = len(cells) - len(names)  # a first column with spaces in it
        cells = [" ".join(cells[:extra + 1])] + cells[extra + 1:]
        try:
            x, y = float(cells[xi]), float(cells[yi])
        except ValueError:
            continue
        series.setdefault(cells[si] if si is not None else args.y, []).append((x, y))
    if not series:
        fail(f"{args.table}: no rows with numbers in '{args.x}' and '{args.y}'")
    plots = []
    for n, (name, pts) in enumerate(series.items()):
        data = os.path.join(tmp, f"series{n}.dat")
        write_columns(data, sorted(pts))
        plots.append(f"{quote(data)} using 1:2 with linespoints lw 1.5 pt 7 title {quote(name)}")
    script = terminal(args.size) + f"set output {quote(args.output)}\nset grid\nset key {args.key}\n"
    script += f"set xlabel {quote(args.x)}\nset ylabel {quote(args.y)}\nset title {quote(args.title or 'scaling')}\n"
    if args.logx:
        script += "set logscale x\n"
    script += f"set yrange [{args.yrange or '0:*'}]\nplot " + ", ".join(plots) + "\n"
    run_gnuplot(script)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics", nargs="?", help="metrics JSON-lines file")
    p.add_argument("--table", help="benchmark table (text) instead of a metrics file")
    p.add_argument("-o", "--output", required=True, help="PNG to write")
    p.add_argument("--size", default="1000x450", help="WIDTHxHEIGHT in pixels (default 1000x450)")
    p.add_argument("--x", default="ranks", help="table: x column (default ranks)")
    p.add_argument("--y", default="samples/s", help="table: y column (default samples/s)")
    p.add_argument("--series", default="mode", help="table: column that names each line (default mode)")
    p.add_argument("--title", help="chart title")
    p.add_argument("--logx", action="store_true", help="table: x on a log scale")
    p.add_argument("--yrange", help="table: y range LO:HI (default 0:*)")
    p.add_argument("--key", default="top left", help="table: where gnuplot puts the legend (default 'top left')")
    args = p.parse_args()
    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
        if w <= 0 or h <= 0:
            raise ValueError
    except ValueError:
        fail(f"--size is '{args.size}', expected WIDTHxHEIGHT such as 1000x450")
    args.size = (w, h)
    if (args.metrics is None) == (args.table is None):
        fail("give either a metrics file or --table FILE")
    with tempfile.TemporaryDirectory(prefix="partrain_plot_") as tmp:
        # gnuplot writes the PNG in place; render to a temporary name and rename, so a reader
        # never sees half a file.
        final = args.output
        args.output = os.path.join(tmp, "out.png")
        plot_metrics(args, tmp) if args.metrics else plot_table(args, tmp)
        shutil.move(args.output, final)


if __name__ == "__main__":
    main()
