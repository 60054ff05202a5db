#!/usr/bin/env python3
"""Where stage 03's step goes, bucket by bucket, read from demo traces,
and PyTorch's DDP step the same way from its profiler's.

    overlap_trace.py LABEL=TRACE [LABEL=TRACE ...] [--skip-steps N]

Each TRACE is a demo's --trace file of a stage that syncs inside backward
(./kit demo 03 ... --trace t.json, or the same demo on a shaped link
through bench/on_link.py; the kit's Chrome trace format,
common/src/trace.cc), or a PyTorch trace from bench/torch_trace.py. On
each rank the thread that runs the "step" spans is the training thread;
the one that runs the collectives' spans is the communication thread. Per
step, from the events the kit already records:

  step       the step span, ms
  graph      backward's own work: from the backward span's start to its
             "graph done" instant (every gradient computed, every bucket
             queued)
  tail       from "graph done" to the backward span's end: the
             end-of-backward callback waiting for the buckets' all-reduces
             (and copying the averages back): the sync not hidden
  buckets    all-reduces queued during backward
  queued     per bucket, from its "allreduce queued" instant (the hook
             that completed it) to the start of its span on the
             communication thread: the wait behind the buckets before it,
             and the thread's wake-up; the median over buckets
  first      the same for the step's first bucket alone: no bucket before
             it, so this is the hand-off's own latency
  run        the time an all-reduce was running: the buckets' spans,
             summed (overlapping spans counted once); Gloo's all-reduce, CPU
             and wire
  hidden     of `run`, the part that ran before "graph done", over
             min(graph, run): the share of what overlap could hide that it
             hid (lesson 03's "hidden")

and from the thread CPU clock each event carries (Chrome's tts and tdur):

  graph cpu  the training thread's CPU time over `graph`: where it is well
             under `graph`, the thread was runnable or waiting but not
             running (on a machine with fewer cores than busy threads, it
             waited for a core)
  run cpu    the communication thread's CPU time inside the all-reduces:
             the rest of `run` it spent waiting (for the peer's bytes, the
             wire, or a core); Gloo's own I/O thread is not in it

The first N steps of each rank (--skip-steps, default 1: the first
iteration builds and then rebuilds the buckets) are left out; printed is
the median over the remaining steps of all ranks, one row per trace, as a
markdown table.

A trace written before the kit recorded the thread CPU clock shows "-" in
the two CPU columns. What the kit's trace cannot say: what Gloo's I/O
thread, OpenBLAS's other threads (where a rank runs more than one) and the
kernel's network stack cost: no span of the kit's runs on them.

PyTorch's trace (torch_trace.py; PyTorch 1.13's profiler, CPU) gives the
same columns from its own events: backward is the "backward"
record_function; "graph done" is the end of the last autograd node
("autograd::engine::evaluate_function: ..."), whose hooks launch the last
bucket; a bucket's "queued" instant is its "c10d::allreduce_" on the
training thread, and its run the "gloo:all_reduce" span on a Gloo worker
thread (launches and runs paired in order of start; a step whose counts
differ is left out, and said on stderr). Its profiler records no thread CPU time ("-"), and
PyTorch's Gloo has 2 worker threads, so two runs may overlap: `run` counts
that time once.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from atomic_file import write_text  # noqa: E402

COLUMNS = ["step", "graph", "tail", "buckets", "queued", "first", "run", "hidden",
           "graph cpu", "run cpu"]


def threads_of(events, pid):
    """(training thread, communication thread) of rank `pid`: the tids that
    run the "step" spans and the collectives' spans."""
    training = {e["tid"] for e in events if e.get("ph") == "X" and e["pid"] == pid
                and e["name"] == "step"}
    comm = {e["tid"] for e in events if e.get("ph") == "X" and e["pid"] == pid
            and e.get("cat") == "comm" and e["name"] not in ("wait",)}
    if len(training) != 1 or len(comm) != 1:
        raise ValueError(f"rank {pid}: {len(training)} thread(s) with step spans and "
                         f"{len(comm)} with collectives; expected one of each")
    return training.pop(), comm.pop()


def within(ts, start, end):
    return start <= ts <= end


def cpu_between(begin, end):
    """The recording thread's CPU ms from event `begin`'s start to event
    `end`'s (both on that thread), or None without the CPU clock."""
    if "tts" not in begin or "tts" not in end:
        return None
    return (end["tts"] - begin["tts"]) / 1e3


def cpu_of(spans):
    """The CPU ms of these spans summed, or None without the CPU clock."""
    if any("tdur" not in s for s in spans):
        return None
    return sum(s["tdur"] for s in spans) / 1e3


def is_torch_trace(events):
    """True for a PyTorch profiler trace (torch_trace.py), whose all-reduces
    are "gloo:all_reduce" spans."""
    return any(e.get("name") == "gloo:all_reduce" for e in events)


def union(intervals):
    """The (start, end) intervals merged where they overlap, in order."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def row(step_ms, b_start, g, b_end, waits, runs):
    """A step's COLUMNS from its backward [b_start, b_end], "graph done" at
    g, the buckets' waits and their runs ((start, dur) each), all in us but
    step_ms; the CPU columns are left to the caller. `run` is the time an
    all-reduce was running: the union of the runs (PyTorch's two Gloo
    threads can run two at once; the kit's one thread never does)."""
    running = union([(t, t + d) for t, d in runs])
    run_total = sum(end - start for start, end in running)
    before_done = sum(max(0, min(end, g) - start) for start, end in running)
    possible = min(g - b_start, run_total)
    return {"step": step_ms, "graph": (g - b_start) / 1e3, "tail": (b_end - g) / 1e3,
            "buckets": len(runs),
            "queued": statistics.median(waits) / 1e3 if waits else 0.0,
            "first": waits[0] / 1e3 if waits else 0.0,
            "run": run_total / 1e3,
            "hidden": before_done / possible if possible > 0 else 0.0,
            "graph cpu": None, "run cpu": None}


def torch_step_rows(events, pid):
    """One dict of COLUMNS per step of rank `pid` of a PyTorch trace."""
    mine = [e for e in events if e.get("pid") == pid and e.get("ph") == "X"]
    steps = sorted((e for e in mine if e["name"] == "step"), key=lambda e: e["ts"])
    if not steps:
        return []
    training = steps[0]["tid"]
    rows = []
    for step in steps:
        end = step["ts"] + step["dur"]
        on_training = [e for e in mine if e["tid"] == training and within(e["ts"], step["ts"], end)]
        bwd = [e for e in on_training if e["name"] == "backward"]
        if len(bwd) != 1:
            continue
        b = bwd[0]
        b_end = b["ts"] + b["dur"]
        nodes = [e for e in on_training if within(e["ts"], b["ts"], b_end)
                 and e["name"].startswith("autograd::engine::evaluate_function")]
        if not nodes:
            continue
        g = max(e["ts"] + e["dur"] for e in nodes)
        launches = sorted(e["ts"] for e in on_training if e["name"] == "c10d::allreduce_"
                          and within(e["ts"], b["ts"], b_end))
        runs = sorted((e for e in mine if e["name"] == "gloo:all_reduce"
                       and e["tid"] != training and within(e["ts"], b["ts"], b_end)),
                      key=lambda e: e["ts"])
        if len(launches) != len(runs):
            # A run the profile's end cut off, or events this reader does not
            # know: said, and the step left out rather than read short.
            print(f"overlap_trace.py: rank {pid}: a step left out: {len(launches)} "
                  f"c10d::allreduce_ launches and {len(runs)} gloo:all_reduce runs in its "
                  "backward", file=sys.stderr)
            continue
        paired = list(zip(launches, runs))
        rows.append(row(step["dur"] / 1e3, b["ts"], g, b_end,
                        [r["ts"] - t for t, r in paired],
                        [(r["ts"], r["dur"]) for _, r in paired]))
    return rows


def step_rows(events, pid):
    """One dict of COLUMNS per step of rank `pid`, in step order."""
    if is_torch_trace(events):
        return torch_step_rows(events, pid)
    training, comm = threads_of(events, pid)
    mine = [e for e in events if e["pid"] == pid]
    steps = sorted((e for e in mine if e.get("ph") == "X" and e["tid"] == training
                    and e["name"] == "step"), key=lambda e: e["ts"])
    backwards = [e for e in mine if e.get("ph") == "X" and e["tid"] == training
                 and e["name"] == "backward"]
    done = [e for e in mine if e.get("ph") == "i" and e["name"] == "graph done"
            and e["tid"] == training]
    queued = {e["args"]["seq"]: e["ts"] for e in mine
              if e.get("ph") == "i" and e["name"] == "allreduce queued"}
    runs = {e["args"]["seq"]: e for e in mine if e.get("ph") == "X" and e["tid"] == comm
            and e["name"] == "allreduce" and "seq" in e.get("args", {})}
    rows = []
    for step in steps:
        end = step["ts"] + step["dur"]
        bwd = [b for b in backwards if within(b["ts"], step["ts"], end)]
        if len(bwd) != 1:
            continue  # accumulation or no backward: not this tool's step
        b = bwd[0]
        b_end = b["ts"] + b["dur"]
        if not any(within(d["ts"], b["ts"], b_end) for d in done):
            continue
        g_event = min((d for d in done if within(d["ts"], b["ts"], b_end)),
                      key=lambda d: d["ts"])
        g = g_event["ts"]
        seqs = sorted(s for s, t in queued.items() if within(t, b["ts"], b_end) and s in runs)
        r = row(step["dur"] / 1e3, b["ts"], g, b_end, [runs[s]["ts"] - queued[s] for s in seqs],
                [(runs[s]["ts"], runs[s]["dur"]) for s in seqs])
        r["graph cpu"] = cpu_between(b, g_event)
        r["run cpu"] = cpu_of([runs[s] for s in seqs])
        rows.append(r)
    return rows


def summary(events, skip_steps):
    """The median of every column over the steps of all ranks, after each
    rank's first skip_steps."""
    rows = []
    for pid in sorted({e["pid"] for e in events if "pid" in e}):
        rows += step_rows(events, pid)[skip_steps:]
    if not rows:
        raise ValueError("no step with one backward and its graph's end in it (a stage that "
                         "syncs inside backward, traced with --trace, or torch_trace.py's "
                         "trace?)")
    return {c: median_or_none([r[c] for r in rows]) for c in COLUMNS}, len(rows)


def median_or_none(values):
    """The median, or None where any step lacks the value (no CPU clock)."""
    return None if any(v is None for v in values) else statistics.median(values)


def ms(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


def table(results):
    lines = ["| trace | steps | step, ms | graph, ms | graph cpu, ms | tail, ms | buckets | "
             "queued, ms | first, ms | run, ms | run cpu, ms | hidden |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, (s, n) in results:
        lines.append(f"| {label} | {n} | {s['step']:.1f} | {s['graph']:.1f} | "
                     f"{ms(s['graph cpu'])} | {s['tail']:.1f} | {s['buckets']:g} | "
                     f"{s['queued']:.2f} | {s['first']:.2f} | {s['run']:.1f} | "
                     f"{ms(s['run cpu'])} | {100 * s['hidden']:.0f}% |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", metavar="LABEL=TRACE")
    parser.add_argument("--skip-steps", type=int, default=1,
                        help="steps of each rank left out at the start (default 1)")
    parser.add_argument("--out", help="also write the table here (markdown), under a title "
                        "and a --note line saying how the traces were made")
    parser.add_argument("--note", default="", help="with --out: how the traces were made")
    args = parser.parse_args()
    if args.skip_steps < 0:
        parser.error("--skip-steps takes 0 or more")
    results = []
    for item in args.traces:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"{item!r}: give LABEL=TRACE")
        try:
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            results.append((label, summary(events, args.skip_steps)))
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"overlap_trace.py: {path}: {e}")
    text = table(results)
    print(text)
    if args.out:
        write_text(args.out, "# Where stage 03's step goes, bucket by bucket\n\n"
                   + (args.note + "\n\n" if args.note else "")
                   + "Made with `python3 bench/overlap_trace.py` (its docstring says what each "
                   "column is): medians over each trace's steps after the first "
                   f"{args.skip_steps}, every rank's.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
