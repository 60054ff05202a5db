#!/usr/bin/env python3
"""gpu-check's overlap measure can fail: tools/gpu_check.py's
overlap_from_trace on hand-made traces of one rank's last step.

  - communication launched from the hooks (an all-reduce that begins on
    the GPU before backward's kernels end, "gpu graph done") counts as early;
  - communication launched from the end-of-backward callback (everything
    after "gpu graph done", though still inside the host's backward span)
    counts as late: a DDP that does not overlap gets 0 early spans;
  - Gloo's host spans and the compute rows are not communication;
  - a trace without GPU spans gives None (nothing to judge).

Usage: gpu_check_overlap_test.py SOURCE_DIR
"""
import json
import os
import sys
import tempfile


def span(name, ts, dur, cat="cuda", pid=0):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": 1000, "ts": ts, "dur": dur}


def main():
    sys.path.insert(0, os.path.join(os.path.abspath(sys.argv[1]), "tools"))
    import gpu_check

    def measure(events):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"traceEvents": events}, f)
        try:
            return gpu_check.overlap_from_trace(f.name)
        finally:
            os.unlink(f.name)

    step = [span("gpu forward", 0, 50), span("gpu backward", 60, 200),
            span("gpu graph done", 200, 0)]  # kernels end at 200, callback waits to 260
    hooks = measure(step + [span("gpu allreduce", 120, 30), span("gpu allreduce", 205, 20),
                            span("allreduce", 100, 90, cat="comm")])
    callback = measure(step + [span("gpu allreduce", 205, 20), span("gpu allreduce", 230, 20),
                               span("allreduce", 100, 90, cat="comm")])
    staged = measure(step + [span("gpu copy to host", 150, 10), span("gpu copy to device", 240, 10)])
    checks = [
        ("launched from hooks", hooks, (2, 1, 0.03)),
        ("launched from the callback", callback, (2, 0, 0.0)),
        ("Gloo staging copies", staged, (2, 1, 0.01)),
        ("no GPU spans", measure([span("allreduce", 1, 2, cat="comm")]), None),
    ]
    failed = False
    for what, got, want in checks:
        ok = got == want if want is None or got is None else (
            got[0] == want[0] and got[1] == want[1] and abs(got[2] - want[2]) < 1e-9)
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {got} (expected {want})")
        failed |= not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
