#!/usr/bin/env python3
"""Where an FSDP step waits for its collectives, read from demo traces.

    fsdp_trace.py LABEL=TRACE [LABEL=TRACE ...] [--skip-steps N]
                  [--reduce-scatter-waits]

Each TRACE is a demo's --trace file (./kit demo 10 ... --trace t.json; the
kit's Chrome trace format, common/src/trace.cc). On each rank, the thread
that runs the "step" spans is the training thread; a "wait" span on it is
time it spent blocked on a collective it needed (before a unit computes,
its all-gather; in backward, also the previous unit's reduce-scatter,
one being in flight at most; at the end of backward, the last one). Per
step it sums those waits by where they fall: inside the step's "forward"
span, inside its "backward" span (there split by what they wait for: an
all-gather, a reduce-scatter or an all-reduce, named by the communication
thread's span of the same seq), or elsewhere (the optimizer). Beside
them: the step's length, and how long the communication thread ran
all-gathers while the training thread computed (inside forward or
backward, not in a wait): the all-gather time prefetch hid.

The first N steps of each rank (--skip-steps, default 1: the first
forward records the order that prefetch follows, so nothing is prefetched
in it) are left out; what is printed is the median over the remaining
steps of all ranks, one row per trace, as a markdown table.

--reduce-scatter-waits prints instead how the waits on reduce-scatters
fall against each one's span: before it began (queued behind another
collective), while it ran, after it ended (the thread getting a core
back), ms a step.

What prefetch changes shows here directly: a unit whose all-gather was
issued early (forward_prefetch, BackwardPrefetch) is waited for less, or
not at all, when its turn comes, and its all-gather runs under compute.
"""

import argparse
import json
import statistics
import sys


def spans(events, name, pid, tid):
    return [e for e in events if e.get("ph") == "X" and e["name"] == name and
            e["pid"] == pid and e["tid"] == tid]


def inside(event, outer):
    return outer["ts"] <= event["ts"] and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]


def collective_names(events):
    """{(pid, seq): the collective's name} from the communication thread's
    spans (a "wait" carries the seq of the collective it waits for)."""
    return {(e["pid"], e["args"]["seq"]): e["name"] for e in events
            if e.get("ph") == "X" and e.get("cat") == "comm" and e["name"] != "wait"
            and "seq" in e.get("args", {})}


# What a step's waits are summed into, in the table's order; in backward by
# the kind of collective waited for (its name's prefix on the communication
# thread: allgather_into_tensor, reduce_scatter_tensor, allreduce).
KINDS = [("allgather", "all-gathers"), ("reduce_scatter", "reduce-scatters"),
         ("allreduce", "all-reduces")]
COLUMNS = (["forward"] + [f"backward, {kind}" for _, kind in KINDS] +
           ["backward, other", "elsewhere"])
UNDER_COMPUTE = "all-gathers under compute"


def column_of(wait, name, forwards, backwards):
    if any(inside(wait, f) for f in forwards):
        return "forward"
    if any(inside(wait, b) for b in backwards):
        kind = next((k for prefix, k in KINDS if name and name.startswith(prefix)), "other")
        return f"backward, {kind}"
    return "elsewhere"


def minus(intervals, holes):
    """The parts of `intervals` ([(begin, end)]) outside every hole."""
    for h0, h1 in holes:
        intervals = [piece for a, b in intervals
                     for piece in ((a, min(b, h0)), (max(a, h1), b)) if piece[0] < piece[1]]
    return intervals


def overlap(span, intervals):
    begin, end = span["ts"], span["ts"] + span["dur"]
    return sum(max(0, min(end, b) - max(begin, a)) for a, b in intervals)


def step_waits(events):
    """[(step, step ms, {column: ms})] of every step on every rank, in
    order: the training thread's waits inside the step, by where they fall
    (its forward and backward are the spans inside it) and, in backward, by
    what they wait for; and "all-gathers under compute": how long the
    communication thread ran all-gathers while the training thread computed
    (inside forward or backward, not waiting), which is what prefetch is
    for."""
    rows = []
    training = sorted({(e["pid"], e["tid"]) for e in events
                       if e.get("ph") == "X" and e["name"] == "step"})
    if not training:
        raise ValueError("no \"step\" spans: not a demo's trace?")
    names = collective_names(events)
    for pid, tid in training:
        waits = spans(events, "wait", pid, tid)
        forwards = spans(events, "forward", pid, tid)
        backwards = spans(events, "backward", pid, tid)
        gathers = [e for e in events if e.get("ph") == "X" and e.get("cat") == "comm" and
                   e["pid"] == pid and e["tid"] != tid and e["name"].startswith("allgather")]
        steps = sorted(spans(events, "step", pid, tid), key=lambda e: e["ts"])
        for index, step in enumerate(steps):
            row = dict.fromkeys(COLUMNS + [UNDER_COMPUTE], 0.0)
            mine = [w for w in waits if inside(w, step)]
            for w in mine:
                name = names.get((pid, w["args"].get("seq")))
                row[column_of(w, name, forwards, backwards)] += w["dur"] / 1e3
            computing = minus([(c["ts"], c["ts"] + c["dur"]) for c in forwards + backwards
                               if inside(c, step)],
                              [(w["ts"], w["ts"] + w["dur"]) for w in mine])
            # (an all-gather that began in the step before counts for its part here)
            row[UNDER_COMPUTE] = sum(overlap(g, computing) for g in gathers) / 1e3
            rows.append((step["args"].get("step", index), step["dur"] / 1e3, row))
    return rows


def reduce_scatter_waits(events, skip_steps):
    """(before, while, after) ms a step: how the training thread's waits on
    a reduce-scatter fall against that reduce-scatter's own span on the
    communication thread (still queued, running, already ended: the last
    is the waiting thread's time to get a core back), summed over the steps
    after the first `skip_steps` of every rank, over their number."""
    names = {(e["pid"], e["args"]["seq"]): e for e in events
             if e.get("ph") == "X" and e.get("cat") == "comm" and e["name"] != "wait"
             and "seq" in e.get("args", {})}
    split = [0.0, 0.0, 0.0]
    counted = 0
    for pid, tid in sorted({(e["pid"], e["tid"]) for e in events
                            if e.get("ph") == "X" and e["name"] == "step"}):
        steps = sorted(spans(events, "step", pid, tid), key=lambda e: e["ts"])[skip_steps:]
        counted += len(steps)
        for w in spans(events, "wait", pid, tid):
            done = names.get((pid, w["args"].get("seq")))
            if not done or not done["name"].startswith("reduce_scatter") or \
                    not any(inside(w, step) for step in steps):
                continue
            w0, w1 = w["ts"], w["ts"] + w["dur"]
            c0, c1 = done["ts"], done["ts"] + done["dur"]
            split[0] += max(0, min(w1, c0) - w0)
            split[1] += max(0, min(w1, c1) - max(w0, c0))
            split[2] += max(0, w1 - max(w0, c1))
    if not counted:
        raise ValueError(f"no step after the first {skip_steps}")
    return [x / counted / 1e3 for x in split]


def summary(path, skip_steps):
    """([median step ms, then the median of each column], steps counted)
    over the steps of every rank after the first `skip_steps`."""
    events = load_events(path)
    rows = [[ms] + [row[c] for c in COLUMNS + [UNDER_COMPUTE]]
            for step, ms, row in step_waits(events) if step >= skip_steps]
    if not rows:
        raise ValueError(f"{path}: no step after the first {skip_steps}")
    return [statistics.median(column) for column in zip(*rows)], len(rows)


def traces_of(parser, items):
    """[(label, path)] of LABEL=TRACE arguments."""
    out = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"give each trace as LABEL=TRACE; got '{item}'")
        out.append((label, path))
    return out


def load_events(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def print_reduce_scatter_waits(parser, args):
    lines = ["| set-up | waited before the reduce-scatter began | while it ran | after it ended |",
             "|---|---|---|---|"]
    for label, path in traces_of(parser, args.traces):
        try:
            before, during, after = reduce_scatter_waits(load_events(path), args.skip_steps)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"fsdp_trace.py: {path}: {e}")
        lines.append(f"| {label} | {before:.1f} | {during:.1f} | {after:.1f} |")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", metavar="LABEL=TRACE")
    parser.add_argument("--skip-steps", type=int, default=1,
                        help="leave out the first N steps (default 1)")
    parser.add_argument("--reduce-scatter-waits", action="store_true",
                        help="instead: the waits on reduce-scatters, before, while and after "
                             "each ran, ms a step (mean)")
    args = parser.parse_args()
    if args.skip_steps < 0:
        parser.error(f"--skip-steps takes 0 or more; got {args.skip_steps}")
    if args.reduce_scatter_waits:
        print_reduce_scatter_waits(parser, args)
        return
    lines = ["| set-up | step, ms | " + " | ".join(f"waited: {c}" for c in COLUMNS) +
             f" | {UNDER_COMPUTE} | steps (all ranks) |", "|---" * (len(COLUMNS) + 4) + "|"]
    for label, path in traces_of(parser, args.traces):
        try:
            medians, n = summary(path, args.skip_steps)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"fsdp_trace.py: {path}: {e}")
        lines.append(f"| {label} | " + " | ".join(f"{m:.1f}" for m in medians) + f" | {n} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
