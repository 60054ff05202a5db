#!/usr/bin/env python3
"""bench/fsdp_trace.py sums the right waits, and reads a real demo trace.

    fsdp_trace_test.py DEMO_10

  1. A made-up trace of one rank, two steps: waits inside forward, inside
     backward and after backward (the optimizer's), one wait on another
     thread (the communication thread's, not the training thread's) and
     one outside any step. With --skip-steps 0 and 1 the medians are those
     worked out by hand, and the wrong thread's and the stray wait count
     nowhere; waits in backward are split by the collective their seq
     names on the communication thread; the all-gathers' time under
     compute is what of them overlaps forward and backward outside waits;
     --reduce-scatter-waits splits the waits on reduce-scatters by their
     spans (before, while, after).
  2. DEMO_10 --world-size 2 --model deep --depth 4 --steps 3 under
     FULL_SHARD with a trace: fsdp_trace.py reads it, finds 2 ranks x 2
     steps after the first, and every wait is within its step.
  3. A trace without steps, and a LABEL=TRACE argument without a label,
     are refused with the reason.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fsdp_trace.py")
sys.path.insert(0, HERE)
import fsdp_trace  # noqa: E402
from smoke import expect_refused, fail  # noqa: E402


def span(name, ts, dur, tid=1, pid=0, **args):
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


# Two steps of 1000 us on thread 1 of rank 0 (pid 0), without "step" args
# (numbered in order). Step 0: 100 us waited in forward, in
# backward 50 for an all-gather and 30 for a reduce-scatter, 10 at the
# optimizer. Step 1: 20 in forward, 30 in backward for a reduce-scatter, 0
# after. A wait on thread 2 (the communication thread) and one between the
# steps count nowhere.
MADE_UP = [
    span("step", 0, 1000), span("forward", 0, 400), span("wait", 100, 100, seq=1),
    span("backward", 400, 500), span("wait", 500, 50, seq=2), span("wait", 600, 30, seq=3),
    span("wait", 950, 10, seq=3),
    span("wait", 300, 600, tid=2, seq=1),
    span("wait", 1050, 40, seq=4),
    span("step", 1100, 1000), span("forward", 1100, 400), span("wait", 1200, 20, seq=4),
    span("backward", 1500, 500), span("wait", 1600, 30, seq=5),
    # the communication thread (tid 2): the collectives the waits name
    dict(span("allgather_into_tensor", 90, 100, tid=2, seq=1), cat="comm"),
    dict(span("allgather_into_tensor", 480, 60, tid=2, seq=2), cat="comm"),
    dict(span("reduce_scatter_tensor", 590, 40, tid=2, seq=3), cat="comm"),
    dict(span("allgather_into_tensor", 1190, 20, tid=2, seq=4), cat="comm"),
    dict(span("reduce_scatter_tensor", 1590, 40, tid=2, seq=5), cat="comm"),
    # Another rank (pid 1): no step of its own, only collectives at the same
    # times and seqs as rank 0's: none of them may count for rank 0.
    dict(span("allgather_into_tensor", 0, 2000, tid=2, pid=1, seq=1), cat="comm"),
    dict(span("allreduce", 0, 2000, tid=2, pid=1, seq=2), cat="comm"),
]


def check_made_up(tmp):
    path = os.path.join(tmp, "made_up.json")
    with open(path, "w") as f:
        json.dump({"traceEvents": MADE_UP}, f)
    # step; waits in forward, backward (all-gathers, reduce-scatters, all-reduces,
    # other), elsewhere; all-gathers under compute (step 0: 10 us of the first
    # before its wait, 20 us of the second before its wait; step 1: 10 us)
    for skip, want in [(0, ([1.0, 0.06, 0.025, 0.03, 0.0, 0.0, 0.005, 0.02], 2)),
                       (1, ([1.0, 0.02, 0.0, 0.03, 0.0, 0.0, 0.0, 0.01], 1))]:
        got = fsdp_trace.summary(path, skip)
        if [round(x, 6) for x in got[0]] != want[0] or got[1] != want[1]:
            fail(f"made-up trace, --skip-steps {skip}: got {got}, want {want}")
    # The waits on reduce-scatters against their spans, ms a step: step 0's
    # 30 us while seq 3 ran and 10 us after it ended, step 1's 30 us while
    # seq 5 ran; none before one began.
    for skip, want in [(0, [0.0, 0.03, 0.005]), (1, [0.0, 0.03, 0.0])]:
        got = [round(x, 6) for x in fsdp_trace.reduce_scatter_waits(MADE_UP, skip)]
        if got != want:
            fail(f"made-up trace, reduce-scatter waits, --skip-steps {skip}: {got}, want {want}")


def check_demo(demo, tmp):
    trace = os.path.join(tmp, "demo.json")
    r = subprocess.run([demo, "--world-size", "2", "--model", "deep", "--depth", "4",
                        "--steps", "3", "--sharding", "full", "--trace", trace],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"demo_10 with --trace exited {r.returncode}:\n{r.stdout[-3000:]}")
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    rows = [row for row in fsdp_trace.step_waits(events) if row[0] >= 1]
    if len(rows) != 4:
        fail(f"demo trace: {len(rows)} steps after the first on all ranks, want 2 ranks x 2")
    for step, ms, waited in rows:
        if min(waited.values()) < 0 or sum(waited.values()) > ms:
            fail(f"demo trace, step {step}: waits {waited} ms in a {ms} ms step")
        if waited["backward, other"] > 0 or waited["backward, all-reduces"] > 0:
            fail(f"demo trace, step {step}: FULL_SHARD waited in backward for a collective "
                 f"other than all-gathers and reduce-scatters: {waited}")
    r = subprocess.run([sys.executable, SCRIPT, f"full={trace}"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or "| full |" not in r.stdout:
        fail(f"fsdp_trace.py full={trace}: exit {r.returncode}:\n{r.stdout}")


def check_refused(tmp):
    empty = os.path.join(tmp, "empty.json")
    with open(empty, "w") as f:
        json.dump({"traceEvents": [span("forward", 0, 10)]}, f)
    expect_refused(SCRIPT, [([f"x={empty}"], "no \"step\" spans"),
                            ([empty], "give each trace as LABEL=TRACE")])


def main():
    with tempfile.TemporaryDirectory(prefix="tp-fsdp-trace-") as tmp:
        check_made_up(tmp)
        check_demo(sys.argv[1], tmp)
        check_refused(tmp)
    print("ok: fsdp_trace.py sums the training thread's waits by phase, per step")


if __name__ == "__main__":
    main()
