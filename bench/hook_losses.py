#!/usr/bin/env python3
"""Loss curves of stage 08 with each built-in communication hook.

Trains stage 08 through its demo (lessons/08-comm-hooks, `demo_08 --json`)
once per hook: no hook, allreduce_hook, fp16_compress_hook, and
powerSGD_hook at ranks 1 and 4 (starting at iteration 2, as
bench/bench_hooks.cc), every run with the same model, data, seed and
learning rate, so that the runs differ only by the hook. The demo's default
model, MiniMLP, learns at its defaults (300 steps: from 0.11 to about
0.03); its deep model does not (16 layers of 32 at lr 0.05: flat at 0.04),
so MiniMLP it is, unless flags after -- say otherwise. Records rank 0's
loss at every step (its micro-batch's loss before that step's update) and
the bytes rank 0 all-reduced in the last step, and writes them to --out
(bench/results/hook_losses.json by default), whole or not at all
(atomic_file.py). bench/report.py tables and draws them (hook_losses.png).

Not run: bf16_compress_hook. Gloo has no bfloat16 sum; the hook's
all-reduce throws saying so (solutions/08-comm-hooks/default_hooks.h).

Output:
  {"config": {steps, world_size, model, batch_size, lr, powersgd_start_iteration,
              demo_args},
   "runs": [{"hook", "label", "losses": [rank 0's loss per step],
             "reference_losses": [the reference trainer's, per step],
             "allreduce_bytes_last_step", "matches_reference", "approximation"}]}
A loss the demo could not report (not finite) is null.

Run: python3 bench/hook_losses.py build/lessons/demo_08
       [--steps N] [--world-size W] [--out FILE] [-- more demo flags]
./kit bench runs it with the defaults (about 10 s on 2 cores).
"""

import argparse
import json
import os
import sys
import tempfile

from atomic_file import write_text
from demo_json import run_demo

# (label, demo flags): the label names the run in the results and the figure.
POWERSGD_START = 2  # as bench_hooks.cc's kPowerSGDStart
HOOKS = [
    ("none", ["--comm-hook", "none"]),
    ("allreduce", ["--comm-hook", "allreduce"]),
    ("fp16", ["--comm-hook", "fp16"]),
    ("powersgd_r1", ["--comm-hook", "powersgd", "--powersgd-rank", "1",
                     "--powersgd-start-iteration", str(POWERSGD_START)]),
    ("powersgd_r4", ["--comm-hook", "powersgd", "--powersgd-rank", "4",
                     "--powersgd-start-iteration", str(POWERSGD_START)]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo", help="the demo_08 program (build/lessons/demo_08)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "hook_losses.json"),
        help="where the results go (default bench/results/hook_losses.json)")
    parser.epilog = "Flags after -- go to every demo_08 run (--model deep, --lr 0.1, ...)."
    argv = sys.argv[1:]
    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    common = ["--steps", str(args.steps), "--world-size", str(args.world_size)] + demo_args

    runs = []
    config = None
    with tempfile.TemporaryDirectory(prefix="tp-hook-losses-") as tmp:
        for label, flags in HOOKS:
            print(f"hook_losses.py: {label}: {args.steps} steps at {args.world_size} ranks",
                  flush=True)
            data = run_demo("hook_losses.py", args.demo, common + flags, os.path.join(tmp, label + ".json"))
            config = config or data["config"]
            final = data["final"]
            runs.append({
                "hook": flags[1],
                "label": label,
                "losses": [s["ddp_rank_losses"][0] for s in data["steps"]],
                "reference_losses": [s["reference_loss"] for s in data["steps"]],
                "allreduce_bytes_last_step": final["allreduce_bytes_last_step"],
                "matches_reference": final["matches_reference"],
                "approximation": final["approximation"],
            })
    result = {"config": {"steps": config["steps"], "world_size": config["world_size"],
                         "model": config["model"], "batch_size": config["batch_size"],
                         "lr": config["lr"], "powersgd_start_iteration": POWERSGD_START,
                         "demo_args": common},
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    none = runs[0]["losses"]
    for run in runs:
        last = run["losses"][-1]
        print(f"hook_losses.py: {run['label']:12s} loss {run['losses'][0]:.4g} -> "
              f"{last:.4g} (no hook: {none[-1]:.4g}); "
              f"{run['allreduce_bytes_last_step']} bytes in the last step")
    print(f"hook_losses.py: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
