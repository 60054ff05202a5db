#!/usr/bin/env python3
"""./kit gpu-check: the CUDA path checked in one command, with a summary to paste.

Runs, from a build configured with CUDA (./kit gpu-check configures and
builds it first):
  1. the GPU unit tests: CUDA tensors and ops against the CPU, the NCCL
     group, the Gloo group staging CUDA tensors;
  2. stage 03's checker on CUDA tensors (check_03_solution --device cuda):
     NCCL at W = 1, Gloo-staged at W = 2, 3 and 4 on one GPU;
  3. lesson 03's demo on CUDA with a trace: does it match the reference, and
     do all-reduces run on the GPU while backward kernels run (the trace's
     device spans, taken from CUDA events)?
  4. the stage-03 step on the GPU against the CPU (bench_gpu_step).
Each step has a time limit; the whole check takes a few minutes on one GPU.
Without a usable GPU it says why, checks nothing and exits 77 ("skipped").

Usage: gpu_check.py BUILD_DIR [--out DIR]
Exit code: 0 every step passed; 1 a step failed; 77 no GPU here.
"""
import json
import os
import shutil
import subprocess
import sys
import time

SKIP = 77


def run(argv, limit_s):
    """(exit code, combined output, seconds); exit code None on a timeout."""
    start = time.monotonic()
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=limit_s)
        return p.returncode, p.stdout, time.monotonic() - start
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, time.monotonic() - start


def last_line(text, containing=""):
    lines = [l for l in text.strip().splitlines() if containing in l]
    line = lines[-1].strip() if lines else ""
    return line[len("SKIP: "):] if line.startswith("SKIP: ") else line


def overlap_from_trace(path):
    """From the demo's Chrome trace, per rank, on the GPU's own clock (spans
    from CUDA events): where the last step's backward kernels ended ("gpu
    graph done", the engine's mark on the compute stream, before the
    end-of-backward callback that waits), and the communication on the
    GPU's communication stream (NCCL: "gpu allreduce"; Gloo staging: "gpu
    copy to host" / "gpu copy to device"). A DDP that launches buckets from
    its hooks has communication starting before backward's kernels end; one
    that launches everything from the end-of-backward callback has none.
    Returns (communication spans of that step, how many began before
    backward's kernels ended, ms of them before that end), summed over
    ranks; None when the trace has no GPU spans."""
    with open(path) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda"]
    if not gpu:
        return None
    compute = ("gpu forward", "gpu backward", "gpu graph done")
    total = early = 0
    hidden_us = 0.0
    for pid in sorted({e["pid"] for e in gpu}):
        mine = [e for e in gpu if e["pid"] == pid]
        backwards = [e for e in mine if e["name"] == "gpu backward"]
        if not backwards:
            continue
        bwd = max(backwards, key=lambda e: e["ts"])  # the last step's
        b0, b_end = bwd["ts"], bwd["ts"] + bwd["dur"]
        marks = [e["ts"] for e in mine if e["name"] == "gpu graph done" and b0 <= e["ts"] <= b_end]
        if not marks:
            continue
        kernels_end = max(marks)
        for e in mine:
            if e["name"] in compute or not (b0 <= e["ts"] <= b_end):
                continue
            total += 1
            if e["ts"] < kernels_end:
                early += 1
                hidden_us += min(kernels_end, e["ts"] + e["dur"]) - e["ts"]
    return total, early, hidden_us / 1000.0


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    build = os.path.abspath(args[0])
    out = os.path.join(build, "gpu-check")
    if "--out" in args:
        out = os.path.abspath(args[args.index("--out") + 1])
    os.makedirs(out, exist_ok=True)
    exe = lambda rel: os.path.join(build, rel)
    started = time.monotonic()
    rows = []  # (step, verdict, seconds, detail)

    # A GPU is here (the probe below said so): a step that skips itself
    # checked nothing, which is a failure of the check, unless `may_skip`
    # gives the reason it may (NCCL not built).
    def step(name, argv, limit_s, judge=None, may_skip=""):
        if not os.path.exists(argv[0]):
            verdict = "SKIP" if may_skip else "FAIL"
            detail = may_skip or f"{os.path.relpath(argv[0], build)} was not built"
            rows.append((name, verdict, 0.0, detail))
            print(f"gpu-check: {name}: {verdict} ({detail})", flush=True)
            return None
        print(f"gpu-check: {name} ...", flush=True)
        code, text, secs = run(argv, limit_s)
        with open(os.path.join(out, name.replace(" ", "_") + ".log"), "w") as f:
            f.write(text)
        if code is None:
            verdict, detail = "FAIL", f"no answer within {limit_s} s (a hang?)"
        elif code == SKIP:
            verdict = "FAIL"
            detail = "skipped itself on a machine with a GPU: " + (last_line(text, "SKIP:") or "")
        elif code != 0:
            verdict, detail = "FAIL", f"exit code {code}: {last_line(text)}"
        else:
            verdict, detail = "PASS", ""
        if judge is not None and verdict == "PASS":
            verdict, detail = judge(text)
        rows.append((name, verdict, secs, detail))
        print(f"gpu-check: {name}: {verdict} ({secs:.1f} s) {detail}", flush=True)
        if verdict == "FAIL":
            print("  " + "\n  ".join(text.strip().splitlines()[-15:]), flush=True)
        return text

    # 0. Is there a GPU at all? The CUDA tensor test answers 77 when not.
    # (Its main says so before doctest runs; --list-test-cases runs nothing.)
    probe = exe("tests/test_cuda_tensor")
    if not os.path.exists(probe):
        print(f"gpu-check: {probe} was not built: is {build} configured with CUDA "
              "(meson configure -Dcuda=enabled)?")
        return 1
    code, text, _ = run([probe, "--list-test-cases"], 120)
    if code != 0:
        reason = last_line(text, "SKIP:") or f"the probe exited with {code}: {last_line(text)}"
        print(f"gpu-check: skipped, nothing was checked: {reason}")
        return SKIP if code == SKIP else 1
    gpu = "a GPU"
    code, text, _ = run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                         "--format=csv,noheader"], 30) if shutil.which("nvidia-smi") else (1, "", 0)
    if code == 0 and text.strip():
        gpu = "; ".join(l.strip() for l in text.strip().splitlines())

    def judge_doctest(text):
        # "[doctest] test cases: 24 | 24 passed | 0 failed | 1 skipped"
        parts = [c.strip() for c in last_line(text, "test cases:").split("test cases:")[-1].split("|")]
        parts = [p for p in parts if p]
        return "PASS", f"{parts[0]} test cases: {', '.join(parts[1:])}" if parts else ""

    def judge_checker(text):
        return "PASS", last_line(text, "stage 03")

    step("unit: CUDA tensors", [exe("tests/test_cuda_tensor")], 120, judge_doctest)
    step("unit: NCCL group", [exe("tests/test_nccl")], 120, judge_doctest,
         may_skip="NCCL was not built (Meson's summary says why)")
    step("unit: Gloo staging CUDA", [exe("tests/test_gloo_cuda")], 120, judge_doctest)
    step("checker 03 on CUDA", [exe("tests/check_03_solution"), "--device", "cuda"], 240,
         judge_checker)

    def judge_demo(demo_json, trace):
        def judge(text):
            with open(demo_json) as f:
                demo = json.load(f)
            if not demo["final"]["matches_reference"]:
                return "FAIL", ("DDP on CUDA differs from the reference: " +
                                last_line(text, "verdict"))
            worst = max((s["max_abs_diff"] for s in demo["steps"]
                         if s.get("max_abs_diff") is not None), default=0.0)
            seen = overlap_from_trace(trace)
            if seen is None:
                return "FAIL", "the trace has no GPU spans (CUDA events)"
            total, early, hidden_ms = seen
            detail = (f"{demo['config']['backend']}: matches the reference (largest loss "
                      f"difference {worst:.1e}); {early} of {total} communication spans began while the "
                      f"GPU ran backward ({hidden_ms:.2f} ms inside it)")
            return ("PASS" if early > 0 else "FAIL"), detail
        return judge

    # W = 1 on NCCL (where built), W = 2 on one GPU through Gloo's staging.
    for world, backend in (("1", "auto"), ("2", "gloo")):
        demo_json = os.path.join(out, f"demo_03_w{world}.json")
        trace = os.path.join(out, f"demo_03_w{world}_trace.json")
        step(f"demo 03 on CUDA, W={world}, with a trace",
             [exe("lessons/demo_03"), "--device", "cuda", "--backend", backend,
              "--world-size", world, "--model", "deep", "--depth", "8", "--hidden", "256",
              "--batch", "64", "--steps", "5", "--json", demo_json, "--trace", trace],
             180, judge_demo(demo_json, trace))

    def judge_bench(text):
        try:
            data = json.loads(text[text.index("{"):])
        except ValueError:
            return "FAIL", "bench_gpu_step printed no JSON"
        runs = [b for b in data["benchmarks"] if b.get("run_type") == "iteration"]
        errors = [f"{b['name']}: {b.get('error_message', 'error')}" for b in runs
                  if b.get("error_occurred")]
        if errors or not runs:
            return "FAIL", "; ".join(errors) or "no benchmark ran"
        times = {b["name"]: (b["real_time"], b.get("time_unit", "ms")) for b in runs}
        detail = "; ".join(f"{n}: {t:.2f} {u}" for n, (t, u) in times.items())
        cpu = [t for n, (t, _) in times.items() if "device:0" in n]
        gpu = [t for n, (t, _) in times.items() if "device:1" in n]
        if cpu and gpu and gpu[0] > 0:
            detail += f" (GPU {cpu[0] / gpu[0]:.1f}x the CPU's speed)"
        return "PASS", detail

    step("bench: stage-03 step, GPU vs CPU",
         [exe("bench/bench_gpu_step"), "--benchmark_format=json"], 240, judge_bench)

    failed = [r for r in rows if r[1] == "FAIL"]
    total_s = time.monotonic() - started
    print()
    print(f"## ./kit gpu-check ({'FAILED' if failed else 'passed'}, {total_s:.0f} s)")
    print()
    print(f"GPU: {gpu}")
    print()
    print("| step | result | time | detail |")
    print("|---|---|---|---|")
    for name, verdict, secs, detail in rows:
        print(f"| {name} | {verdict} | {secs:.1f} s | {detail.replace('|', '/')} |")
    print()
    print(f"logs and the trace (open it in ui.perfetto.dev): {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
