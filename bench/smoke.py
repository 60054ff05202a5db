#!/usr/bin/env python3
"""Smoke test of bench/: every benchmark runs once, and the report reads them.

Usage: smoke.py BUILD_BENCH_DIR REPORT_PY TORCH_DDP_PY HOOK_LOSSES_PY DEMO_08 ZERO_MEMORY_PY DEMO_09

Runs each benchmark program that ./kit bench runs (bench/programs.txt)
with --smoke=1 (one iteration of every benchmark, no warm-up) at the first
world size ./kit bench uses (bench_allreduce at each), writing Google
Benchmark JSON into a temporary folder under the names report.py reads; then
torch_ddp.py --smoke if PyTorch is importable (optional: skipped otherwise);
hook_losses.py for 5 steps (demo_08 once per comm hook); then report.py on
that folder. It fails if a program fails, if a program's JSON lacks a
benchmark the report needs, if lesson 10's step-time table gives a set-up
other units or collectives per step than bench_fsdp counted, or if the report cannot
make its summary and figures. The times mean nothing; that nothing rotted is what it
tests.
"""

import json
import os
import subprocess
import sys
import tempfile

from programs import programs

# The benchmarks each program's JSON must contain, by name prefix, for every
# program of bench/programs.txt (the list of them: a program listed there
# without an entry here, or one here that is not listed, fails the test).
NEEDED = {
    "bench_ops": ["BM_"],
    "bench_allreduce": ["BM_KitHandoff", "BM_CountCheck", "BM_Allreduce/4",
                        "BM_Allreduce/67108864"],
    "bench_sync": ["BM_Stage01SyncGrads/64", "BM_Stage02SyncGrads/64", "BM_OneFlatAllreduce/64",
                   "BM_Stage02BucketCap/10", "BM_Stage02BucketCap/102400"],
    "bench_step": ["BM_StepNoDDP", "BM_StepStage01", "BM_StepStage02/cap_kib:0",
                   "BM_StepStage03/cap_kib:0", "BM_SyncShareStage01/batch:256",
                   "BM_SyncShareStage02/cap_kib:0/batch:1", "BM_OverlapPair/cap_kib:0/batch:64",
                   "BM_AccumulateNoSync/micro:8", "BM_AccumulateSyncEvery/micro:1"],
    "bench_hooks": ["BM_StepStage08Hook/hook:none", "BM_StepStage08Hook/hook:fp16",
                    "BM_StepStage08Hook/hook:powersgd_r4", "BM_HookRound"],
    "bench_zero": ["BM_StepStage09/opt:sgd", "BM_StepStage09/opt:zero",
                   "BM_StepStage09/opt:zero_rs", "BM_ZeroRound"],
    "bench_fsdp": ["BM_StepStage10/setup:ddp", "BM_StepStage10/setup:no_shard",
                   "BM_StepStage10/setup:full", "BM_StepStage10/setup:full_blocks",
                   "BM_FsdpRound"],
}
# Run at every world size the list gives it (so that allreduce.png's line
# per world size is drawn for more than one); the others, to keep the test
# short, at their first only.
EVERY_SIZE = {"bench_allreduce"}


def smoke_runs():
    """[(Program, world size or None, benchmarks needed)]: bench/programs.txt's
    programs, in its order, at the world sizes the smoke runs them at."""
    listed = [p.name for p in programs()]
    unknown = [name for name in listed if name not in NEEDED]
    unlisted = [name for name in NEEDED if name not in listed]
    if unknown or unlisted:
        sys.exit(f"smoke: bench/programs.txt and smoke.py's NEEDED disagree: "
                 f"listed without the benchmarks they must run: {unknown or 'none'}; "
                 f"in NEEDED but not listed: {unlisted or 'none'}")
    runs = []
    for program in programs():
        sizes = program.world_sizes if program.name in EVERY_SIZE else program.world_sizes[:1]
        runs += [(program, w, NEEDED[program.name]) for w in sizes or [None]]
    return runs


LESSON_10 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lessons", "10-fsdp",
                         "README.md")


def check_fsdp_counts(path):
    """Lesson 10's step-time table gives each set-up's units and collectives
    per step, counts: they must be what bench_fsdp counted (`units`, "-" for
    a DDP; `collectives`, per step)."""
    with open(LESSON_10) as f:
        text = f.read()
    lines = text[text.index("## Step time, measured"):].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| set-up | units")), None)
    if start is None:
        sys.exit("smoke: lesson 10's \"Step time, measured\" has no table whose header begins "
                 "'| set-up | units'")
    table = []  # the header and the rows up to the first line that is not the table's
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    columns = [c.strip() for c in table[0].strip("|").split("|")]
    units, collectives = columns.index("units"), columns.index("collectives per step")
    want = {}
    for line in table:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) > max(units, collectives):
            count = 0.0 if cells[units] in ("-", "\u2013") else float(cells[units])
            want[cells[0].split("`")[1]] = (count, float(cells[collectives]))
    with open(path) as f:
        got = {b["name"].split(":")[1].split("/")[0]: (b["units"], b["collectives"])
               for b in json.load(f)["benchmarks"]
               if b["name"].startswith("BM_StepStage10/setup:")}
    if not want or want != got:
        sys.exit(f"smoke: lesson 10's step-time table says (units, collectives per step) {want}; "
                 f"bench_fsdp counted {got}")


def fail(message):
    """Ends a bench test with its reason, as the suite's tests report one."""
    print(f"FAIL: {message}")
    sys.exit(1)


def expect_refused(script, cases, code=None):
    """Runs `script` (a bench/ Python script) with each case's arguments and
    exits the test unless it fails (with exit `code`, when given) saying the
    case's words: [(args, words)]."""
    for args, words in cases:
        r = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        if (r.returncode == 0 if code is None else r.returncode != code) or words not in r.stdout:
            sys.exit(f"FAIL: {os.path.basename(script)} {' '.join(args)}: exit {r.returncode}, "
                     f"want {code or 'an error'} with {words!r}; said:\n{r.stdout}")


def python_with(module):
    """A Python that can import `module`: Debian's (where apt puts packages) or ours."""
    for candidate in ("/usr/bin/python3", sys.executable):
        if os.path.exists(candidate) and subprocess.run(
                [candidate, "-c", f"import {module}"], capture_output=True).returncode == 0:
            return candidate
    return None


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout[-4000:], flush=True)
    if done.returncode != 0:
        sys.exit(f"smoke: {os.path.basename(cmd[0] if not cmd[0].endswith('python3') else cmd[1])}"
                 f" failed with exit code {done.returncode}")
    return done.stdout


def main():
    bench_dir, report_py, torch_py, hook_losses_py, demo_08, zero_memory_py, demo_09 = \
        sys.argv[1:8]
    with tempfile.TemporaryDirectory(prefix="tp-bench-smoke-") as out:
        for program, w, needed in smoke_runs():
            name = program.results_file(w)
            path = os.path.join(out, name)
            cmd = [os.path.join(bench_dir, program.name), f"--benchmark_out={path}",
                   "--benchmark_out_format=json"]
            if w:
                cmd += ["--smoke=1", f"--world-size={w}"]
            else:
                cmd += ["--benchmark_min_time=0"]
            run(cmd)
            with open(path) as f:
                names = [b["name"] for b in json.load(f)["benchmarks"]]
            for prefix in needed:
                if not any(n == prefix or n.startswith(prefix + "/") or
                           (prefix.endswith("_") and n.startswith(prefix)) for n in names):
                    sys.exit(f"smoke: {name} has no benchmark {prefix}; it has {names}")
            if program.name == "bench_fsdp":
                check_fsdp_counts(path)
        torch_python = python_with("torch")
        if torch_python:
            run([torch_python, torch_py, "--smoke", "--world-size=2",
                 "--out=" + os.path.join(out, "torch_ddp.w2.json")])
            # One of ./kit bench's alternating rounds.
            run([os.path.join(bench_dir, "bench_step"), "--smoke=1",
                 "--benchmark_filter=BM_StepNoDDP|BM_StepStage03/cap_kib:0",
                 "--benchmark_out=" + os.path.join(out, "round1.bench_step.json"),
                 "--benchmark_out_format=json"])
            run([torch_python, torch_py, "--smoke", "--world-size=2", "--only-default-caps",
                 "--out=" + os.path.join(out, "round1.torch_ddp.json")])
        else:
            print("smoke: PyTorch not installed: torch_ddp.py not run (it is optional)")
        run([sys.executable, hook_losses_py, demo_08, "--steps=5",
             "--out=" + os.path.join(out, "hook_losses.json")])
        run([sys.executable, zero_memory_py, demo_08, demo_09, "--world-sizes=1,2",
             "--out=" + os.path.join(out, "zero_memory.json")])
        plot_python = python_with("matplotlib")
        if not plot_python:
            sys.exit("smoke: no Python here can import matplotlib; ./kit installs "
                     "python3-matplotlib (apt-get install python3-matplotlib)")
        text = run([plot_python, report_py, out])
        if torch_python and "stage 03 / PyTorch DDP" not in text:
            sys.exit("smoke: the report lacks the rounds of stage 03 against PyTorch's DDP")
        # Every target must have been measured (PyTorch's only where it is
        # installed): a renamed counter or benchmark inside report.py shows
        # up here as "not measured".
        targets = [line for line in text[text.index("## Targets"):].splitlines()[4:]
                   if line.startswith("|")]
        unmeasured = [t for t in targets if "not measured" in t and
                      not ("PyTorch" in t and not torch_python)]
        if len(targets) != 5 or unmeasured:
            sys.exit("smoke: the report's targets are incomplete:\n" + "\n".join(targets))
        for section in ("One all-reduce against its size", "alpha-beta fit to the medians, kit", "hand-off alone",
                        "Bucket-cap sweep", "sync hidden by 03", "share of the step against the batch",
                        "Gradient accumulation (stage 04)", "## Targets", "Smoke run",
                        "Communication hooks: bytes and step time", "| fp16_compress_hook |",
                        "Communication hooks: loss per step",
                        "ZeRO: step time and bytes per step", "| ZeRO, reduce-scatter form |",
                        "ZeRO: memory per rank",
                        "FSDP: step time, bytes and peak memory", "| FSDP FULL_SHARD, a unit per block |"):
            if section not in text:
                sys.exit(f"smoke: the report lacks '{section}'")
        for figure in ("allreduce.png", "sync.png", "step.png", "hooks.png", "hook_losses.png",
                       "zero.png"):
            path = os.path.join(out, figure)
            if not os.path.exists(path) or os.path.getsize(path) < 1000:
                sys.exit(f"smoke: the report did not draw {figure}")
    print("smoke: every benchmark ran and the report read them")


if __name__ == "__main__":
    main()
