#!/usr/bin/env python3
"""./kit gpu-check's own logic, as it would run on a machine with a GPU:
tools/gpu_check.py against a fake build directory whose programs are small
stand-ins (shell scripts) that answer as the real ones would on a GPU.

  - everything passing: exit 0, every row PASS, the overlap and the GPU's
    speed-up in the summary;
  - a demo whose all-reduces all start after backward's kernels ended (a
    DDP launching from the end-of-backward callback): that row FAILs, exit 1;
  - a step that skips itself (exit 77) once the probe found a GPU: FAIL;
  - a benchmark that reports an error: FAIL;
  - NCCL not built (no test_nccl): that row is SKIP with the reason, the
    check still passes.
The real programs' side (their exit codes, JSON and trace) is tested where
they run: tests/gpu/gpu_skip_test.py without a GPU, ./kit gpu-check with one.

Usage: gpu_check_flow_test.py SOURCE_DIR
"""
import os
import stat
import subprocess
import sys
import tempfile

DEMO = r'''#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
out = args[args.index("--json") + 1]
trace = args[args.index("--trace") + 1]
world = args[args.index("--world-size") + 1]
late = %(late)s
json.dump({"config": {"backend": "nccl" if world == "1" else "gloo"},
           "steps": [{"max_abs_diff": 3e-7}], "final": {"matches_reference": True}},
          open(out, "w"))
ar = 230 if late else 120
json.dump({"traceEvents": [
    {"ph": "X", "cat": "cuda", "name": "gpu backward", "pid": 0, "tid": 1000, "ts": 60, "dur": 200},
    {"ph": "X", "cat": "cuda", "name": "gpu graph done", "pid": 0, "tid": 1000, "ts": 200, "dur": 0},
    {"ph": "X", "cat": "cuda", "name": "gpu allreduce", "pid": 0, "tid": 1001, "ts": ar, "dur": 20}]},
    open(trace, "w"))
print("verdict: matches the reference")
'''

BENCH = r'''#!/usr/bin/env python3
import json
error = %(error)s
runs = [{"name": "BM_Stage03Step/device:0/real_time", "run_type": "iteration",
         "real_time": 40.0, "time_unit": "ms"},
        {"name": "BM_Stage03Step/device:1/real_time", "run_type": "iteration",
         "real_time": 2.0, "time_unit": "ms"}]
if error:
    runs[1] = {"name": runs[1]["name"], "run_type": "iteration", "error_occurred": True,
               "error_message": "cudaErrorIllegalAddress"}
print(json.dumps({"context": {}, "benchmarks": runs}))
'''


def script(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def fake_build(root, late=False, error=False, skipping="", nccl=True):
    ok = ("#!/bin/sh\necho '[doctest] test cases: 24 | 24 passed | 0 failed | 0 skipped'\n"
          "exit 0\n")
    script(os.path.join(root, "tests/test_cuda_tensor"), ok)
    script(os.path.join(root, "tests/test_gloo_cuda"), ok)
    if nccl:
        script(os.path.join(root, "tests/test_nccl"), ok)
    script(os.path.join(root, "tests/check_03_solution"), "#!/bin/sh\necho 'stage 03: every case matches the reference'\n")
    script(os.path.join(root, "lessons/demo_03"), DEMO % {"late": late})
    script(os.path.join(root, "bench/bench_gpu_step"), BENCH % {"error": error})
    if skipping:
        script(os.path.join(root, skipping), "#!/bin/sh\necho 'SKIP: no GPU after all'\nexit 77\n")


def run_check(source, **kw):
    with tempfile.TemporaryDirectory(prefix="tp-gpu-check-") as root:
        fake_build(root, **kw)
        p = subprocess.run([sys.executable, os.path.join(source, "tools", "gpu_check.py"), root],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        return p.returncode, p.stdout


def row(text, name):
    return next((l for l in text.splitlines() if l.startswith(f"| {name}")), "")


def main():
    source = os.path.abspath(sys.argv[1])
    failures = []

    def expect(what, cond, text):
        print(f"{'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(f"{what}:\n{text}")

    code, text = run_check(source)
    expect("all passing: exit 0", code == 0, text)
    expect("all passing: every row PASS", text.count("| PASS |") == 7 and "FAIL" not in text, text)
    expect("the overlap is reported", "1 of 1 communication spans began while" in text, text)
    expect("the speed-up is reported", "GPU 20.0x the CPU's speed" in text, text)
    expect("the unit tests' counts are reported", "24 test cases: 24 passed, 0 failed, 0 skipped" in text, text)
    expect("the checker's verdict is reported", "every case matches the reference" in text, text)

    code, text = run_check(source, late=True)
    expect("callback launches: exit 1", code == 1, text)
    expect("callback launches: the demo rows FAIL",
           "| FAIL |" in row(text, "demo 03 on CUDA, W=1") and "0 of 1" in text, text)

    code, text = run_check(source, skipping="tests/check_03_solution")
    expect("a step that skips itself on a GPU machine fails",
           code == 1 and "| FAIL |" in row(text, "checker 03 on CUDA"), text)

    code, text = run_check(source, error=True)
    expect("a benchmark error fails", code == 1 and "cudaErrorIllegalAddress" in text, text)

    code, text = run_check(source, nccl=False)
    expect("NCCL not built: SKIP with the reason, still passing",
           code == 0 and "| SKIP |" in row(text, "unit: NCCL group") and
           "NCCL was not built" in text, text)
    if failures:
        print("\n\n".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
