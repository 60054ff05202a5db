#!/usr/bin/env python3
"""Memory per rank of plain DDP (stage 08) and ZeRO (stage 09), W = 1 to 4.

Trains the deep model with momentum 0.9 through the two stages' demos
(`demo_08 --json`, `demo_09 --json`, and `demo_09 --reduce-scatter`) at each
world size, and records what each rank's tensors held, as the library
counted them on the tensor storage (tp::memory, in the demo's JSON): the
optimizer state at the end, the parameters, the gradients, and the peak of
parameters + gradients + state. The runs are short (4 steps): the state
exists from the first step on and does not grow. Writes --out
(bench/results/zero_memory.json by default), whole or not at all
(atomic_file.py); bench/report.py tables and draws it (zero_memory.png).

Output:
  {"config": {model, steps, momentum, demo_args},
   "runs": [{"stage": "08" | "09", "form": "ddp" | "zero" | "zero_rs",
             "world_size", "matches_reference",
             "ranks": [{"rank", "parameter_bytes", "gradient_bytes",
                        "optimizer_state_bytes", "peak_model_state_bytes"}]}]}

Run: python3 bench/zero_memory.py build/lessons/demo_08 build/lessons/demo_09
       [--out FILE] [--world-sizes 1,2,3,4]
./kit bench runs it (a few seconds).
"""

import argparse
import json
import os
import sys
import tempfile

from atomic_file import write_text
from demo_json import run_demo

COMMON = ["--model", "deep", "--momentum", "0.9", "--steps", "4"]
FORMS = [("08", "ddp", []), ("09", "zero", []), ("09", "zero_rs", ["--reduce-scatter"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("demo_08", help="the demo_08 program (build/lessons/demo_08)")
    parser.add_argument("demo_09", help="the demo_09 program (build/lessons/demo_09)")
    parser.add_argument("--world-sizes", default="1,2,3,4", help="default 1,2,3,4")
    parser.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "zero_memory.json"),
        help="where the results go (default bench/results/zero_memory.json)")
    args = parser.parse_args()
    demos = {"08": args.demo_08, "09": args.demo_09}
    runs = []
    with tempfile.TemporaryDirectory(prefix="tp-zero-memory-") as tmp:
        for w in [int(x) for x in args.world_sizes.split(",")]:
            for stage, form, flags in FORMS:
                data = run_demo("zero_memory.py", demos[stage], COMMON + ["--world-size", str(w)] + flags,
                                os.path.join(tmp, f"{form}.w{w}.json"))
                ranks = []
                for r in data["ranks"]:
                    if r.get("memory") is None:
                        sys.exit(f"zero_memory.py: demo_{stage} reported no memory for rank "
                                 f"{r['rank']}")
                    ranks.append(dict(rank=r["rank"], **r["memory"]))
                runs.append({"stage": stage, "form": form, "world_size": w,
                             "matches_reference": data["final"]["matches_reference"],
                             "ranks": ranks})
                state = [r["optimizer_state_bytes"] for r in ranks]
                print(f"zero_memory.py: W = {w}, {form:8s} optimizer state per rank: "
                      f"{', '.join(f'{b / 1024:.1f}' for b in state)} KiB", flush=True)
    result = {"config": {"model": "deep", "steps": 4, "momentum": 0.9, "demo_args": COMMON},
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    write_text(args.out, json.dumps(result, indent=1) + "\n")
    print(f"zero_memory.py: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
