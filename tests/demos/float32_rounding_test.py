#!/usr/bin/env python3
"""A correct DDP is never told it differs because float32 rounding grew.

Issue: stage 02's solution at lr 0.5 with momentum 0.9 over 500 steps drifts
from the reference in float32 (on the kit's development machine the losses
first differ at step 359 and the parameters end 8.7e-3 apart), and the demo
said "DIFFERS", blaming "what carries over between steps". The demo now
re-runs a float32 run that differs in float64 (Note [Rounding or a bug] in
common/tensorplay/train/demo.h), where this plan matches to 2e-16.

Checks, on `demo_02 --lr 0.5 --momentum 0.9 --steps 500`:
  - the verdict is not DIFFERS;
  - where the float32 run differed (it did on the machine this was written
    on; how far rounding grows depends on the CPU's OpenBLAS kernel), the
    float64 re-run ran, matched, and the verdict says rounding, in the table
    and in the JSON;
  - the demo says so before the re-run, with the flag that skips it; with
    --no-float64-rerun it does not re-run, and its verdict says rounding
    is not ruled out (JSON: float64_rerun_skipped);
  - a float64 plan is never re-run (there is nothing finer to ask).

Run: float32_rounding_test.py build/lessons/demo_02
"""
import json
import os
import subprocess
import sys
import tempfile

PLAN = ["--lr", "0.5", "--momentum", "0.9", "--steps", "500"]


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def run(demo, flags, json_path):
    done = subprocess.run([demo] + flags + ["--json", json_path], capture_output=True, text=True,
                          timeout=500)
    if done.returncode != 0:
        print(done.stdout, done.stderr)
        fail(f"{' '.join([demo] + flags)} exited with {done.returncode}")
    with open(json_path) as f:
        return done.stdout, json.load(f)


def main():
    demo = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out, data = run(demo, PLAN, os.path.join(tmp, "f32.json"))
        final = data["final"]
        if "verdict: DIFFERS" in out:
            fail("a correct DDP is told it differs:\n" + out[out.index("verdict:"):])
        if final["matches_reference"]:
            print("ok: float32 matched the reference within its tolerance on this CPU: nothing "
                  "to re-run (the rounding path was not exercised here)")
        else:
            rerun = final["float64_rerun"]
            if not rerun or not rerun["matches"] or not final["float32_rounding"]:
                fail(f"the float32 run differs, but the float64 re-run did not confirm "
                     f"rounding: {rerun}, float32_rounding {final['float32_rounding']}")
            if "verdict: matches the reference in float64; in float32 it drifts by rounding" \
                    not in out:
                fail("the table's verdict does not say rounding:\n" + out[out.index("verdict:"):])
            print(f"ok: the float32 run ends {final['max_param_diff_vs_reference']:.2e} from the "
                  f"reference; the float64 re-run {rerun['max_param_diff']:.2e}: rounding")
            if "re-running it in float64" not in out or "--no-float64-rerun skips it" not in out:
                fail("the demo did not say, before the re-run, that it re-runs and how to skip it")
            # The same plan with the re-run skipped: told as it is, and said so.
            out, data = run(demo, PLAN + ["--no-float64-rerun"], os.path.join(tmp, "skip.json"))
            if "re-running" in out or data["final"]["float64_rerun"] is not None or \
                    not data["final"]["float64_rerun_skipped"] or \
                    "not re-run in float64 (--no-float64-rerun)" not in out:
                fail("--no-float64-rerun: the re-run ran, or the verdict does not say it was "
                     "skipped:\n" + out[out.index("verdict:"):])
            print("ok: --no-float64-rerun skips the re-run and says rounding is not ruled out")
        out, data = run(demo, PLAN[:2] + ["--steps", "5", "--dtype", "float64"],
                        os.path.join(tmp, "f64.json"))
        if data["final"]["float64_rerun"] is not None or "re-running" in out:
            fail("a float64 run was re-run")
        print("ok: a float64 run is not re-run")


if __name__ == "__main__":
    main()
