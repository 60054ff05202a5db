#!/usr/bin/env python3
"""bench/overlap_trace.py splits stage 03's step right, and reads a real trace.

    overlap_trace_test.py DEMO_03

  1. A made-up trace of one rank, two steps, worked out by hand: in each,
     backward from 10 to 30 ms after the step's start with its "graph
     done" at 25, two buckets queued at 15 and 22 whose all-reduces run
     16-21 and 24-28 on the communication thread; the second step's
     second bucket waits 4 ms behind the first. With --skip-steps 0 the
     medians are those worked out here, and a stray all-reduce queued
     outside any backward counts nowhere. The CPU columns come from the
     events' thread CPU clock (tts, tdur), and a trace without it shows
     "-" there.
  2. DEMO_03 --world-size 2 --model deep --depth 4 --steps 3 with a trace:
     overlap_trace.py finds 2 ranks x 2 steps after the first, at least
     one bucket a step, a hidden share between 0 and 100%, and CPU times
     recorded and no longer than the wall times they belong to.
  3. A trace without steps, and a LABEL=TRACE argument without a label,
     are refused with the reason.
  4. A made-up PyTorch profiler trace (bench/torch_trace.py's layout),
     worked out by hand: backward 10 to 30 ms, its last autograd node
     ending at 25, buckets launched at 15 and 22 (c10d::allreduce_) and
     run on two Gloo threads 16-21 and 23-27: the same columns, CPU "-".
     Where a python imports torch, torch_trace.py's own trace of 2 spawned
     ranks reads with at least one bucket a step.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "overlap_trace.py")
sys.path.insert(0, HERE)
import overlap_trace  # noqa: E402
from smoke import expect_refused, fail, python_with  # noqa: E402


def span(name, ts_ms, dur_ms, tid=0, cat="compute", **args):
    return {"name": name, "cat": cat, "ph": "X", "pid": 0, "tid": tid,
            "ts": int(ts_ms * 1000), "dur": int(dur_ms * 1000), "args": args}


def instant(name, ts_ms, cat="comm", **args):
    return {"name": name, "cat": cat, "ph": "i", "pid": 0, "tid": 0, "ts": int(ts_ms * 1000),
            "s": "t", "args": args}


def cpu(event, tts_ms, tdur_ms=None):
    """`event` with the thread CPU clock the kit records (tts, tdur)."""
    event["tts"] = int(tts_ms * 1000)
    if tdur_ms is not None:
        event["tdur"] = int(tdur_ms * 1000)
    return event


def made_up():
    """The steps of the docstring's case 1. CPU clock: backward's thread
    has run 12 ms (step 1) and 9 ms (step 2) of CPU by "graph done"; the
    all-reduces take 0.5 and 0.25 ms of the communication thread's CPU."""
    events = []
    for k, (start, second_run) in enumerate(((0, 22), (100, 122))):
        s1, s2 = 2 * k + 1, 2 * k + 2
        graph_cpu = 12 if k == 0 else 9
        events += [span("step", start, 40, cat="train"),
                   cpu(span("backward", start + 10, 20), 50 * k + 3, 18),
                   cpu(instant("graph done", start + 25, cat="autograd"), 50 * k + 3 + graph_cpu),
                   instant("allreduce queued", start + 15, seq=s1),
                   instant("allreduce queued", start + 22, seq=s2),
                   cpu(span("allreduce", start + 16, 5, tid=1, cat="comm", seq=s1), 7, 0.5),
                   cpu(span("allreduce", second_run + 2 + 4 * k, 4, tid=1, cat="comm", seq=s2),
                       8, 0.25)]
    # A stray all-reduce, queued outside any backward.
    events += [instant("allreduce queued", 60, seq=9),
               cpu(span("allreduce", 61, 3, tid=1, cat="comm", seq=9), 9, 2)]
    return events


def check_made_up():
    s, n = overlap_trace.summary(made_up(), 0)
    # Step 1: queued 1 and 2 ms (median 1.5, first 1), run 5 + 4 = 9 ms,
    # before graph done (25): 5 + 1 = 6 of min(15, 9) = 67%. Step 2: queued
    # 1 and 6 (median 3.5), runs 16-21 and 128-132 (after the step's 125:
    # 0 before it), hidden 5 of 9 = 56%. Medians: queued 2.5, hidden 61%.
    # CPU: graph 12 and 9 ms (median 10.5), the all-reduces 0.75 ms a step.
    want = {"step": 40.0, "graph": 15.0, "tail": 5.0, "buckets": 2, "queued": 2.5,
            "first": 1.0, "run": 9.0, "graph cpu": 10.5, "run cpu": 0.75}
    for key, value in want.items():
        if abs(s[key] - value) > 1e-9:
            fail(f"made-up trace: {key} is {s[key]}, want {value} (all: {s})")
    if n != 2 or abs(s["hidden"] - (6 / 9 + 5 / 9) / 2) > 1e-9:
        fail(f"made-up trace: {n} steps, hidden {s['hidden']}; want 2 and {(6 / 9 + 5 / 9) / 2}")
    # A trace from before the CPU clock (no tts, tdur): the CPU columns say "-".
    old = [{k: v for k, v in e.items() if k not in ("tts", "tdur")} for e in made_up()]
    s0, _ = overlap_trace.summary(old, 0)
    if s0["graph cpu"] is not None or s0["run cpu"] is not None or s0["run"] != 9.0:
        fail(f"a trace without the CPU clock: {s0}; want the CPU columns None")
    if "| - |" not in overlap_trace.table([("old", (s0, 2))]):
        fail(f"a trace without the CPU clock: no '-' in\n{overlap_trace.table([('old', (s0, 2))])}")
    s1, n1 = overlap_trace.summary(made_up(), 1)
    if n1 != 1 or abs(s1["queued"] - 3.5) > 1e-9:
        fail(f"--skip-steps 1: {n1} steps, queued {s1['queued']}; want 1 and 3.5")


def check_demo(demo, tmp):
    trace = os.path.join(tmp, "t03.json")
    r = subprocess.run([demo, "--world-size", "2", "--model", "deep", "--depth", "4",
                        "--steps", "3", "--trace", trace],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"demo_03 with a trace exited {r.returncode}:\n{r.stdout[-2000:]}")
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    s, n = overlap_trace.summary(events, 1)
    if (n != 4 or s["buckets"] < 1 or not 0 <= s["hidden"] <= 1 or s["run"] <= 0
            or s["graph cpu"] is None or not 0 < s["graph cpu"] <= s["graph"] + 1
            or s["run cpu"] is None or not 0 <= s["run cpu"] <= s["run"] + 1):
        fail(f"demo_03's trace: {n} steps (want 2 ranks x 2), summary {s}")
    r = subprocess.run([sys.executable, SCRIPT, f"demo={trace}"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or "| demo | 4 |" not in r.stdout:
        fail(f"overlap_trace.py demo=TRACE: exit {r.returncode}:\n{r.stdout}")


def torch_made_up():
    def x(name, ts_ms, dur_ms, tid=1):
        return {"name": name, "ph": "X", "pid": 0, "tid": tid, "ts": int(ts_ms * 1000),
                "dur": int(dur_ms * 1000)}
    return [x("step", 0, 40), x("backward", 10, 20),
            x("autograd::engine::evaluate_function: AddmmBackward0", 10, 2),
            x("autograd::engine::evaluate_function: AddmmBackward0", 14, 4),
            x("autograd::engine::evaluate_function: AddmmBackward0", 20, 5),
            x("c10d::allreduce_", 15, 0.1), x("c10d::allreduce_", 22, 0.1),
            x("gloo:all_reduce", 16, 5, tid=2), x("gloo:all_reduce", 23, 4, tid=3),
            x("Optimizer.step#SGD.step", 31, 1)]


def check_torch(tmp):
    s, n = overlap_trace.summary(torch_made_up(), 0)
    # graph 10 -> 25; runs 16-21 (5 before 25) and 23-27 (2 before 25): 7 of min(15, 9).
    want = {"step": 40.0, "graph": 15.0, "tail": 5.0, "buckets": 2, "queued": 1.0,
            "first": 1.0, "run": 9.0, "hidden": 7 / 9, "graph cpu": None, "run cpu": None}
    for key, value in want.items():
        if (s[key] is None) != (value is None) or (value is not None
                                                     and abs(s[key] - value) > 1e-9):
            fail(f"made-up PyTorch trace: {key} is {s[key]}, want {value} (all: {s})")
    if n != 1:
        fail(f"made-up PyTorch trace: {n} steps, want 1")
    # Two runs at once (PyTorch's two Gloo threads): 16-21 and 18-28 are
    # 12 ms of running (not 15 summed), 9 of them before 25: hidden 9 of
    # min(15, 12) (summed it would read 12 of 15).
    both = [e for e in torch_made_up() if e["name"] != "gloo:all_reduce"] + [
        {"name": "gloo:all_reduce", "ph": "X", "pid": 0, "tid": 2, "ts": 16000, "dur": 5000},
        {"name": "gloo:all_reduce", "ph": "X", "pid": 0, "tid": 3, "ts": 18000, "dur": 10000}]
    s2, _ = overlap_trace.summary(both, 0)
    if abs(s2["run"] - 12.0) > 1e-9 or abs(s2["hidden"] - 9 / 12) > 1e-9:
        fail(f"overlapping PyTorch runs: run {s2['run']}, hidden {s2['hidden']}; want 12 and "
             f"{9 / 12}")
    # A launch without its run leaves the step out, not read short: here
    # the only step, so nothing is left to read.
    short = [e for e in torch_made_up() if not (e["name"] == "gloo:all_reduce"
                                                and e["tid"] == 3)]
    try:
        overlap_trace.summary(short, 0)
        fail("a PyTorch step with 2 launches and 1 run was read")
    except ValueError as e:
        if "no step" not in str(e):
            fail(f"a launch without its run: {e}")
    python = python_with("torch")
    if python is None:
        print("skipped: torch_trace.py (no python here imports torch)")
        return
    trace = os.path.join(tmp, "torch.json")
    try:
        r = subprocess.run([python, os.path.join(HERE, "torch_trace.py"), "--trace", trace,
                            "--batch", "16", "--steps", "3"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        fail(f"torch_trace.py ran past 240 s:\n{str(e.stdout or '')[-2000:]}")
    if r.returncode != 0:
        fail(f"torch_trace.py exited {r.returncode}:\n{r.stdout[-2000:]}")
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    s, n = overlap_trace.summary(events, 1)
    if n != 4 or s["buckets"] < 1 or not 0 <= s["hidden"] <= 1 or s["run"] <= 0:
        fail(f"torch_trace.py's trace: {n} steps (want 2 ranks x 2), summary {s}")
    print(f"ok: torch_trace.py's trace of 2 ranks reads: {s['buckets']:g} buckets a step")


def check_refused(tmp):
    empty = os.path.join(tmp, "empty.json")
    with open(empty, "w") as f:
        json.dump({"traceEvents": []}, f)
    expect_refused(SCRIPT, [([f"x={empty}"], "no step"), ([empty], "give LABEL=TRACE")])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: overlap_trace_test.py DEMO_03")
    check_made_up()
    with tempfile.TemporaryDirectory(prefix="tp-overlap-trace-") as tmp:
        check_demo(sys.argv[1], tmp)
        check_refused(tmp)
        check_torch(tmp)
    print("ok: overlap_trace.py splits a made-up step as worked out by hand and reads "
          "demo_03's trace")


if __name__ == "__main__":
    main()
