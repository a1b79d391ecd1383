#!/usr/bin/env python3
"""Checks a merged partrain trace (Chrome-trace JSON written by rank 0 with PARTRAIN_TRACE):

  check_trace.py trace.json --ranks N [--steps S]

- the file is valid JSON with a traceEvents list;
- one process per rank (pid 0..N-1, each named "rank <pid>");
- spans on one track (pid, tid) nest: each either contains the next one or ends before it;
- every rank has the same number of "step" spans (S when given), a data_wait per batch, and
  forward_backward and optimizer spans inside its steps;
- every rank reduces the same buckets (tracks 16, 17, ...), and each step span holds exactly one
  all_reduce of every bucket, on every rank.
Exits 1 naming the first thing that is wrong.
"""
import argparse
import json
import sys
from collections import defaultdict

BUCKET0 = 16  # trace_track::bucket0
EPS = 1e-3    # microseconds; the files' resolution is 1 ns


def fail(msg):
    print("check_trace: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    try:
        with open(args.trace, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{args.trace}: {e}")
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        fail(f"{args.trace}: no traceEvents list")

    names = {}
    tracks = defaultdict(list)  # (pid, tid) -> [(ts, dur, name)]
    for e in events:
        if e.get("ph") == "M":
            if e.get("name") == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        if e.get("ph") != "X":
            fail(f"unexpected event phase {e.get('ph')!r}: {e}")
        if e["dur"] < 0:
            fail(f"negative duration: {e}")
        tracks[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["dur"]), e["name"]))

    expected = {r: f"rank {r}" for r in range(args.ranks)}
    if names != expected:
        fail(f"processes {names}, expected one per rank: {expected}")

    for (pid, tid), spans in tracks.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_spans = []
        for ts, dur, name in spans:
            while open_spans and open_spans[-1][0] + open_spans[-1][1] <= ts + EPS:
                open_spans.pop()
            if open_spans and ts + dur > open_spans[-1][0] + open_spans[-1][1] + EPS:
                fail(f"rank {pid} track {tid}: '{name}' at {ts} overlaps '{open_spans[-1][2]}' without nesting")
            open_spans.append((ts, dur, name))

    step_counts = {}
    buckets_of = {}
    for r in range(args.ranks):
        main_track = tracks.get((r, 0), [])
        steps = [s for s in main_track if s[2] == "step"]
        if not steps:
            fail(f"rank {r}: no step spans")
        step_counts[r] = len(steps)
        for kind in ("forward_backward", "optimizer"):
            inner = [s for s in main_track if s[2] == kind]
            if len(inner) != len(steps):
                fail(f"rank {r}: {len(inner)} {kind} spans for {len(steps)} steps")
        waits = [s for s in tracks.get((r, 1), []) if s[2] == "data_wait"]
        if len(waits) < len(steps):
            fail(f"rank {r}: {len(waits)} data_wait spans for {len(steps)} steps")
        buckets = sorted(tid for (pid, tid) in tracks if pid == r and tid >= BUCKET0)
        if not buckets:
            fail(f"rank {r}: no bucket all_reduce tracks")
        buckets_of[r] = buckets
        for ts, dur, _ in steps:
            for b in buckets:
                inside = [s for s in tracks[(r, b)]
                          if s[2] == "all_reduce" and s[0] >= ts - EPS and s[0] + s[1] <= ts + dur + EPS]
                if len(inside) != 1:
                    fail(f"rank {r}: the step at {ts} us holds {len(inside)} all_reduce spans of bucket {b - BUCKET0}, "
                         f"expected 1")
    if len(set(step_counts.values())) != 1:
        fail(f"ranks ran different numbers of steps: {step_counts}")
    if args.steps is not None and step_counts[0] != args.steps:
        fail(f"{step_counts[0]} steps per rank, expected {args.steps}")
    if any(b != buckets_of[0] for b in buckets_of.values()):
        fail(f"ranks reduced different buckets: {buckets_of}")
    print(f"check_trace: {args.ranks} ranks, {step_counts[0]} steps each, {len(buckets_of[0])} bucket(s), "
          f"{sum(len(s) for s in tracks.values())} spans: ok")


if __name__ == "__main__":
    main()
