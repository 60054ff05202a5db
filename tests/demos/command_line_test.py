#!/usr/bin/env python3
"""A stage's demo and checker answer bad command lines clearly, before running.

    command_line_test.py DEMO_EXE CHECKER_EXE STAGE_H

Both parse through CLI11 with usage generated from the flags' declarations
(demo_command_line.cc, checker.cc, and the stage's StageSpec in STAGE_H). Checked here:
--help exits 0 and lists every flag, the stage's own in a group of their
own; a typo is a usage error (exit 2) that names the flag and suggests the
nearest one; a bad value names the flag, the range and the value; nothing
runs (no table, no verdict) when the command line is wrong; and a value the
check accepts is the value the flag gets ("2e0" is 2; given twice, the last).
Where the stage offers comm hooks, plans that cannot run or are mistakes
(PowerSGD's knobs not whole, without PowerSGD, or above the model's ranks;
a hook with --divide-by-active-ranks or with the reduce-scatter form) are
refused the same way, before any rank starts: no "CHECK failed" from a rank.
"""
import re
import subprocess
import sys


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def expect_usage_error(exe, args, *phrases):
    r = run(exe, *args)
    if r.returncode != 2:
        fail(f"{' '.join(args)}: exit {r.returncode}, expected 2 (a usage error); stderr: {r.stderr!r}")
    for phrase in phrases:
        if phrase not in r.stderr:
            fail(f"{' '.join(args)}: stderr lacks {phrase!r}: {r.stderr!r}")
    if "verdict" in r.stdout or "PASS" in r.stdout:
        fail(f"{' '.join(args)}: something ran before the usage error: {r.stdout[-500:]!r}")
    if "CHECK failed" in r.stderr or "rank 0" in r.stderr:
        fail(f"{' '.join(args)}: refused from inside a rank, not before the ranks start: "
             f"{r.stderr!r}")


def stage_flags(stage_h):
    """The flags the stage declares in its stage.h, by name."""
    text = open(stage_h).read()
    names = set(re.findall(r'"(--[a-z-]+)"', text))
    # The shared declarations the stage calls (stage_spec.h): their names.
    shared = {"bucket_cap_flags": ["--bucket-cap-mb", "--first-bucket-cap-mb"],
              "gradient_as_bucket_view_flag": ["--gradient-as-bucket-view"],
              "find_unused_parameters_flag": ["--find-unused-parameters"],
              "static_graph_flag": ["--static-graph"],
              "comm_hook_flags": ["--comm-hook", "--powersgd-rank", "--powersgd-start-iteration",
                                  "--powersgd-min-compression-rate"]}
    for call, flags in shared.items():
        if call + "<" in text:
            names.update(flags)
    return names


def main(demo, checker, stage_h):
    stage = re.search(r"demo_(\d\d)", demo).group(1)
    r = run(demo, "--help")
    if r.returncode != 0:
        fail(f"demo --help: exit {r.returncode}")
    for flag in ["--world-size", "--steps", "--batches", "--device", "--json", "--trace"]:
        if flag not in r.stdout:
            fail(f"demo --help does not list {flag}")
    own = stage_flags(stage_h)
    for flag in own:
        if flag not in r.stdout:
            fail(f"demo --help does not list the stage's flag {flag} (declared in {stage_h})")
    if own and f"Stage {stage}'s options:" not in r.stdout:
        fail(f"demo --help does not group the stage's own flags under 'Stage {stage}'s options'")

    expect_usage_error(demo, ["--stpes", "3"], "unknown flag '--stpes'", "did you mean --steps?")
    expect_usage_error(demo, ["--steps", "0"],
                       "--steps: expects a whole number from 1 to 100000, got '0'")
    expect_usage_error(demo, ["--world-size", "2.5"],
                       "--world-size: expects a whole number from 1 to 64, got '2.5'")
    expect_usage_error(demo, ["--lr", "nan"], "--lr: expects a number above 0, got 'nan'")
    expect_usage_error(demo, ["--dtype", "float16"],
                       "--dtype: expects float32 or float64, got 'float16'")
    expect_usage_error(demo, ["--batches", "3,x,1"], "--batches: expects a whole number",
                       "got 'x' in '3,x,1'")
    expect_usage_error(demo, ["--steps"],  # the value is missing
                       "--steps needs a value: a whole number from 1 to 100000")
    expect_usage_error(demo, ["--steps", "3", "--world-size"],
                       "--world-size needs a value: a whole number from 1 to 64")
    expect_usage_error(demo, ["--dtype"], "--dtype needs a value: float32 or float64")
    expect_usage_error(demo, ["stray"], "unexpected argument 'stray'")
    expect_usage_error(demo, ["--json", "--steps", "3"], "--json: expects a file name",
                       "was the file name left out?")
    expect_usage_error(demo, ["--trace", ""], "--trace: expects a file name, got ''")
    expect_usage_error(demo, ["-x"], "unknown flag '-x'")

    # What a check accepts is what the flag gets: "2e0" and "0x2" are 2, and
    # a flag given twice keeps its last value. One rank, so it is quick.
    r = run(demo, "--world-size", "1", "--steps", "5", "--steps", "2e0", "--batch", "0x2")
    header = r.stdout.splitlines()[0] if r.stdout else ""
    if r.returncode != 0 or "2 steps, batch 2 per rank" not in header:
        fail(f"--steps 5 --steps 2e0 --batch 0x2: exit {r.returncode}, header {header!r}, "
             f"stderr {r.stderr!r}; expected 2 steps of batch 2")
    if "--bucket-cap-mb" in own:
        expect_usage_error(demo, ["--bucket-cap-mb", "-1"],
                           "--bucket-cap-mb: expects a number from 1e-09 to 1e+06, got '-1'")

    if "--comm-hook" in own:
        # Plans no rank could run, or that are mistakes, are refused before the ranks start.
        expect_usage_error(demo, ["--comm-hook", "powersgd", "--powersgd-rank", "1.5"],
                           "--powersgd-rank: expects a whole number from 1 to 1000000, got '1.5'")
        expect_usage_error(demo, ["--comm-hook", "powersgd", "--powersgd-start-iteration", "2.5"],
                           "--powersgd-start-iteration: expects a whole number from 0 to "
                           "1000000000, got '2.5'")
        expect_usage_error(demo, ["--comm-hook", "powersgd", "--powersgd-rank", "100000"],
                           "--powersgd-rank 100000 is above every weight's min(n, m) in this "
                           "model (the largest is")
        expect_usage_error(demo, ["--powersgd-rank", "2"], "set PowerSGD's options, and the "
                           "comm hook is 'none': add --comm-hook powersgd, or drop them")
        expect_usage_error(demo, ["--comm-hook", "fp16", "--divide-by-active-ranks"],
                           "--divide-by-active-ranks with --comm-hook fp16: the hook decides")
    if "--reduce-scatter" in own and "--comm-hook" in own:
        expect_usage_error(demo, ["--reduce-scatter", "--comm-hook", "fp16"],
                           "--reduce-scatter with --comm-hook fp16: the reduce-scatter form "
                           "reduces in the optimizer")

    r = run(checker, "--help")
    if r.returncode != 0 or "--expect-fail" not in r.stdout or "--only" not in r.stdout:
        fail(f"checker --help: exit {r.returncode}, output {r.stdout!r}")
    expect_usage_error(checker, ["--lsit"], "checker: unknown flag '--lsit'", "did you mean --list?")
    expect_usage_error(checker, ["--repeat", "0"],
                       "--repeat: expects a whole number from 1 to 1000, got '0'")
    expect_usage_error(checker, ["--device", "gpu"], "--device: expects cpu or cuda, got 'gpu'")
    expect_usage_error(checker, ["--repeat"],
                       "--repeat needs a value: a whole number from 1 to 1000")
    expect_usage_error(checker, ["--collective-timeout", "50"],
                       "--collective-timeout: expects a whole number from 100 to 3600000, got '50'")
    print(f"ok: stage {stage}'s demo and checker list their flags and refuse bad ones by name")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
