#!/usr/bin/env python3
"""Runs a lesson demo with --json and checks the numbers it reports.

    demo_json_test.py DEMO_EXE [--expect-worker] [--runs-on-cuda]

The JSON must list every rank at every step, agree with the printed table,
and show DDP matching the reference within the tolerance it states. A second
run with gradient accumulation and the buffered model checks the
per-micro-batch record: K losses per step on every rank, and all-reduces only
on the micro-batch that syncs. The header names the seed mode of each run.
A demo that offers --worker (lesson 01: the lesson's own rank worker) must
give, through the worker, the same losses as through the kit's trainer.
Every rank's memory (tp::memory) is in the JSON and in the printed table,
and with momentum the optimizer state is exactly the parameters' bytes (a
sharded optimizer's ranks: their states add up to it).
--device cuda on a stage without the cuda capability is a usage error
(exit 2) that says which stage runs on CUDA, on any machine; a stage with it
(--runs-on-cuda: stage 03) is not refused for that reason.
"""
import json
import os
import subprocess
import sys
import tempfile

WORLD, STEPS = 3, 5
EXPECT_WORKER = False  # --expect-worker: the demo must have --worker (lesson 01)
RUNS_ON_CUDA = False  # --runs-on-cuda: the stage declares the cuda capability (stage 03)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def main(demo):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.json")
        trace_path = os.path.join(tmp, "trace.json")
        run = subprocess.run([demo, "--world-size", str(WORLD), "--steps", str(STEPS), "--json", path,
                              "--trace", trace_path],
                             capture_output=True, text=True, timeout=240)
        print(run.stdout, run.stderr)
        if run.returncode != 0:
            fail(f"the demo exited with {run.returncode}")
        data = json.load(open(path))
        trace = json.load(open(trace_path))["traceEvents"]
    header = run.stdout.splitlines()[0] if run.stdout else ""
    if not header.endswith(", shared seed"):
        fail(f"the header does not name the seed mode (shared seed): {header!r}")

    # All-reduces per step: the same on every rank in every step, at least
    # one and at most one per parameter (stage 01: one per parameter; a
    # bucketed stage: one per bucket, which its checker counts exactly).
    # final.allreduces_per_step lists each rank's count in step 0.
    counts = data["final"]["allreduces_per_step"] + [c for r in data["ranks"] for c in r["allreduces_per_micro"]]
    n = counts[0] if counts else 0
    # A fully sharded stage (FSDP) all-reduces nothing: it all-gathers each
    # unit and reduce-scatters its gradient instead, the same counts on every
    # rank in every step, and the demo prints them.
    sharded = [c for r in data["ranks"] for c in r["reduce_scatters_per_micro"]]
    if n == 0 and sharded and all(c == sharded[0] > 0 for c in sharded):
        gathers = [c for r in data["ranks"] for c in r["allgathers_per_micro"]]
        if any(c != gathers[0] for c in gathers) or gathers[0] < sharded[0]:
            fail(f"all-gathers per step and rank {gathers}: expected one count, at least the "
                 f"{sharded[0]} reduce-scatters (a unit is gathered before it is reduced)")
        if "all-gathers and reduce-scatters in step 0 on rank 0: " \
                f"{gathers[0]} of" not in run.stdout:
            fail("the demo does not print step 0's all-gathers and reduce-scatters")
        print(f"ok: no all-reduces; {gathers[0]} all-gathers and {sharded[0]} reduce-scatters "
              "per step on every rank")
    elif any(c != n for c in counts) or not 1 <= n <= data["final"]["num_parameters"]:
        fail(f"all-reduces per step and rank {counts}: expected one count, from 1 to "
             f"{data['final']['num_parameters']} (one per parameter, or per bucket)")

    # The trace: every rank's main and comm threads, and as many all-reduce
    # spans per step on each rank as the JSON counts.
    names = {(e["pid"], e["args"]["name"]) for e in trace if e["ph"] == "M"}
    for rank in range(WORLD):
        if (rank, "main") not in names or (rank, "comm") not in names:
            fail(f"the trace lacks rank {rank}'s main or comm thread: {sorted(names)}")
        # Only those inside a training step: a stage may communicate after
        # the loop too (stage 07's join() ends with two all-reduces).
        steps = [(e["ts"], e["ts"] + e["dur"]) for e in trace
                 if e["pid"] == rank and e["ph"] == "X" and e["name"] == "step"]
        spans = [e for e in trace if e["pid"] == rank and e["ph"] == "X" and e["name"] == "allreduce"
                 and any(begin <= e["ts"] <= end for begin, end in steps)]
        if len(spans) != n * STEPS:
            fail(f"rank {rank}: {len(spans)} allreduce spans in the trace, expected {n * STEPS}")
    if "timeline of step" not in run.stdout:
        fail("--trace printed no ASCII timeline")

    tol = data["config"]["tolerance"]
    if data["config"]["world_size"] != WORLD or len(data["steps"]) != STEPS:
        fail("config or step count does not match the command line")
    for step in data["steps"]:
        for key in ("reference_rank_losses", "ddp_rank_losses"):
            if len(step[key]) != WORLD:
                fail(f"step {step['step']}: {key} lists {len(step[key])} ranks, expected {WORLD}")
        worst = max(abs(d - r) for d, r in zip(step["ddp_rank_losses"], step["reference_rank_losses"]))
        if abs(worst - step["max_abs_diff"]) > 1e-12:
            fail(f"step {step['step']}: max_abs_diff {step['max_abs_diff']} but the ranks differ by {worst}")
        for d, r in zip(step["ddp_rank_losses"], step["reference_rank_losses"]):
            if abs(d - r) > tol * max(1.0, abs(r)):
                fail(f"step {step['step']}: DDP loss {d} vs reference {r} beyond tolerance {tol}")
        mean = sum(step["reference_rank_losses"]) / WORLD
        if abs(mean - step["reference_loss"]) > 1e-12 * max(1.0, abs(mean)):
            fail(f"step {step['step']}: reference_loss is not the mean of the ranks' losses")

    final = data["final"]
    if len(final["rank_param_norms"]) != WORLD:
        fail("final.rank_param_norms does not list every rank")
    if final["max_param_diff_vs_reference"] > tol:
        fail(f"final parameters differ from the reference by {final['max_param_diff_vs_reference']}")
    if final["max_param_diff_between_ranks"] > tol:
        fail("ranks end with different parameters")
    if not final["matches_reference"]:
        fail("the demo says DDP does not match the reference")

    # The printed table must show the same numbers: rank 0's DDP loss column.
    rows = [line.split() for line in run.stdout.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 7]
    if len(rows) != STEPS:
        fail(f"the table has {len(rows)} step rows, expected {STEPS}")
    for row, step in zip(rows, data["steps"]):
        if abs(float(row[2]) - step["ddp_rank_losses"][0]) > 5e-7:
            fail(f"table row {row[0]}: rank 0 DDP loss {row[2]} vs JSON {step['ddp_rank_losses'][0]}")
    print(f"ok: {STEPS} steps x {WORLD} ranks match the reference within {tol}; "
          f"max |param diff| {final['max_param_diff_vs_reference']:.2e}")
    check_memory_table(run.stdout, data)
    check_memory(demo)
    check_accumulation(demo)
    check_worker(demo, data)
    check_write_errors(demo)
    check_diverging_reference(demo)
    check_launch_mistakes(demo)
    check_cuda_refusal(demo)


def memory_rows(stdout):
    """The "memory per rank" table's rows, each [rank, params, grads, state,
    peak] as numbers (KiB); None when the demo printed no such table."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("memory per rank")]
    if not starts:
        return None
    rows = []
    for line in lines[starts[0] + 2:]:  # past the title and the column names
        words = line.split()
        if len(words) != 5 or not words[0].isdigit():
            break
        rows.append([int(words[0])] + [float(w) for w in words[1:]])
    return rows


def check_memory_table(stdout, data):
    """Every rank's memory, measured by tp::memory, in the JSON and in the
    printed table (KiB, one decimal), with the same numbers."""
    rows = memory_rows(stdout)
    if rows is None:
        fail("the demo printed no 'memory per rank' table")
    if [r[0] for r in rows] != list(range(WORLD)):
        fail(f"the memory table lists ranks {[r[0] for r in rows]}, expected 0 to {WORLD - 1}")
    keys = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "peak_model_state_bytes")
    for row, rank in zip(rows, data["ranks"]):
        m = rank["memory"]
        if m is None:
            fail(f"rank {rank['rank']}: no memory record in the JSON")
        for cell, key in zip(row[1:], keys):
            if abs(cell - m[key] / 1024) > 0.05 + 1e-9:
                fail(f"rank {rank['rank']}: the table shows {cell} KiB for {key}, the JSON {m[key]} B")
        if m["parameter_bytes"] <= 0:
            fail(f"rank {rank['rank']}: {m['parameter_bytes']} parameter bytes")
        if data["config"]["momentum"] == 0 and m["optimizer_state_bytes"] != 0:
            fail(f"rank {rank['rank']}: SGD without momentum holds {m['optimizer_state_bytes']} B of state")
        live = m["parameter_bytes"] + m["gradient_bytes"] + m["optimizer_state_bytes"]
        if m["peak_model_state_bytes"] < live:
            fail(f"rank {rank['rank']}: peak model state {m['peak_model_state_bytes']} B below what is live, {live} B")
    print(f"ok: memory per rank in the table and the JSON: {data['ranks'][0]['memory']}")


def check_memory(demo, world=4):
    """With momentum, SGD keeps one buffer per parameter: optimizer state ==
    parameter bytes on every rank, and the same numbers on every rank (plain
    DDP replicates the whole model state)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.json")
        run = subprocess.run([demo, "--world-size", str(world), "--steps", "2", "--momentum", "0.9",
                              "--json", path], capture_output=True, text=True, timeout=240)
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            fail(f"the demo with --momentum 0.9 exited with {run.returncode}")
        data = json.load(open(path))
    mems = [r["memory"] for r in data["ranks"]]
    if len(mems) != world or any(m is None for m in mems):
        fail(f"with momentum, not every rank has a memory record: {mems}")
    if any(r.get("shard_partition") for r in data["ranks"]):
        # A sharded optimizer (stage 09): each parameter's state on exactly
        # one rank, so the ranks' states add up to the model.
        total = sum(m["optimizer_state_bytes"] for m in mems)
        if total != mems[0]["parameter_bytes"]:
            fail(f"a sharded optimizer's ranks hold {total} B of optimizer state in all for "
                 f"{mems[0]['parameter_bytes']} B of parameters; expected the same: {mems}")
        print(f"ok: with momentum the ranks' shards of optimizer state add up to the parameters: "
              f"{[m['optimizer_state_bytes'] for m in mems]}")
        return
    for rank, m in enumerate(mems):
        if m["optimizer_state_bytes"] != m["parameter_bytes"]:
            fail(f"rank {rank}: momentum 0.9 holds {m['optimizer_state_bytes']} B of optimizer "
                 f"state for {m['parameter_bytes']} B of parameters; expected the same")
        if not 0 < m["gradient_bytes"] <= m["parameter_bytes"]:
            fail(f"rank {rank}: {m['gradient_bytes']} B of gradients for {m['parameter_bytes']} B "
                 f"of parameters")
    # The peaks may differ by a tensor the communication thread let go of a
    # moment later on one rank; what is live at the end may not.
    live = [{k: v for k, v in m.items() if not k.startswith("peak_")} for m in mems]
    if any(m != live[0] for m in live):
        fail(f"plain DDP replicates the model state, but the ranks differ: {mems}")
    print(f"ok: with momentum every rank's optimizer state is its parameter bytes: {mems[0]}")


def check_worker(demo, trainer_data):
    """The lesson's worker trains exactly what the kit's trainer does: same
    losses on every rank at every step, bit for bit (same operations, same
    order), and no collective counts (a worker records none)."""
    usage = subprocess.run([demo, "--help"], capture_output=True, text=True, timeout=60).stdout
    if "--worker" not in usage:
        if EXPECT_WORKER:  # the lesson has a worker exercise: its flag must not vanish
            fail("this lesson's demo has no --worker flag (its DemoSpec lost its worker)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.json")
        run = subprocess.run([demo, "--world-size", str(WORLD), "--steps", str(STEPS), "--json", path,
                              "--worker"], capture_output=True, text=True, timeout=240)
        print(run.stdout, run.stderr)
        if run.returncode != 0:
            fail(f"the demo with --worker exited with {run.returncode}")
        data = json.load(open(path))
    if "the lesson's worker" not in run.stdout.splitlines()[0]:
        fail("with --worker the header does not say the lesson's worker ran")
    if "all-reduces in step 0" in run.stdout:
        fail("with --worker the demo shows collective counts, which a worker does not record")
    if memory_rows(run.stdout) is not None or any(r["memory"] is not None for r in data["ranks"]):
        fail("with --worker the demo shows memory, which a worker does not measure")
    mine = [r["micro_batch_losses"] for r in data["ranks"]]
    trainer = [r["micro_batch_losses"] for r in trainer_data["ranks"]]
    if mine != trainer:
        fail(f"the worker's losses differ from the trainer's: {mine} vs {trainer}")
    if not data["final"]["matches_reference"]:
        fail("with --worker the demo says the run does not match the reference")
    print(f"ok: --worker gives the trainer's losses on {WORLD} ranks, bit for bit")


def check_diverging_reference(demo):
    """A learning rate so large that the single-process reference itself
    overflows: the demo must say so, and not blame DDP."""
    run = subprocess.run([demo, "--momentum", "100", "--lr", "10", "--steps", "5"],
                         capture_output=True, text=True, timeout=240)
    out = run.stdout
    if "the reference itself diverged" not in out or "learning rate is too large" not in out:
        fail(f"a diverging reference is not named as such:\n{out[-1500:]}")
    if "DIFFERS" in out or "later step" in out:
        fail(f"a diverging reference is blamed on DDP:\n{out[-1500:]}")
    print("ok: a reference that diverges (lr 10, momentum 100) is named, DDP not blamed")


def check_write_errors(demo):
    """An output file that cannot be written is an error naming the path and
    the reason: a bad path before the run, a full disk (/dev/full) after it."""
    missing = "/nonexistent-tp-dir/demo.json"
    run = subprocess.run([demo, "--steps", "2", "--json", missing], capture_output=True, text=True,
                         timeout=240)
    if run.returncode == 0 or missing not in run.stderr or "No such file" not in run.stderr:
        fail(f"--json {missing}: exit {run.returncode}, stderr: {run.stderr!r}")
    if "verdict" in run.stdout:
        fail(f"--json {missing}: the demo ran before saying it cannot write the file")
    if os.path.exists("/dev/full"):
        for flag in ("--json", "--trace"):
            run = subprocess.run([demo, "--world-size", "2", "--steps", "2", flag, "/dev/full"],
                                 capture_output=True, text=True, timeout=240)
            if run.returncode == 0 or "/dev/full" not in run.stderr or "No space" not in run.stderr:
                fail(f"{flag} /dev/full: exit {run.returncode}, stderr: {run.stderr!r}")
            if run.stderr.count("demo ") > 1:
                fail(f"{flag} /dev/full: the message repeats its prefix: {run.stderr!r}")
    print("ok: an unwritable --json/--trace path is named with the reason, a bad path before the run")


def check_launch_mistakes(demo):
    """Started as one rank of a launched job the wrong way: RANK set without
    --init-method (each process would run a whole job), or --init-method
    file:// (what the demo does itself). Both are usage errors (exit 2) that
    say what to pass, before anything runs."""
    env = dict(os.environ, RANK="1")
    run = subprocess.run([demo, "--steps", "1"], capture_output=True, text=True, timeout=60,
                         env=env)
    if run.returncode != 2 or "RANK=1 is set" not in run.stderr or \
            "pass --init-method env://" not in run.stderr or "verdict" in run.stdout:
        fail(f"RANK=1 without --init-method: exit {run.returncode}, stderr: {run.stderr!r}")
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    run = subprocess.run([demo, "--init-method", "file:///tmp/x"], capture_output=True,
                         text=True, timeout=60, env=env)
    if run.returncode != 2 or "--init-method file:// is what demo " not in run.stderr:
        fail(f"--init-method file://: exit {run.returncode}, stderr: {run.stderr!r}")
    print("ok: RANK without --init-method, and --init-method file://, are usage errors that say why")


def check_accumulation(demo, k=3, steps=2):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "demo.json")
        run = subprocess.run([demo, "--world-size", "2", "--steps", str(steps), "--micro-batches", str(k),
                              "--model", "buffered", "--per-rank-seed", "--json", path],
                             capture_output=True, text=True, timeout=240)
        print(run.stdout, run.stderr)
        if run.returncode != 0 and "needs no_sync" in run.stderr:
            # A stage that syncs inside backward and has no no_sync() must
            # refuse accumulation, and say so; that refusal is what we check.
            print(f"ok: the stage refuses K = {k} micro-batches without no_sync, saying why")
            return
        if run.returncode != 0:
            fail(f"the demo with --micro-batches {k} exited with {run.returncode}")
        data = json.load(open(path))
    header = run.stdout.splitlines()[0] if run.stdout else ""
    if not header.endswith(", per-rank seeds"):
        fail(f"with --per-rank-seed the header does not say per-rank seeds: {header!r}")
    if data["config"]["micro_batches"] != k or data["config"]["model"] != "BufferedMLP":
        fail(f"config does not echo the knobs: {data['config']}")
    for rank in data["ranks"]:
        if len(rank["micro_batch_losses"]) != k * steps:
            fail(f"rank {rank['rank']}: {len(rank['micro_batch_losses'])} micro-batch losses, expected {k * steps}")
        # The syncing micro-batch's count (6 parameters: from 1 to 6 all-reduces;
        # a fully sharded stage reduce-scatters each unit instead).
        key, what = "allreduces_per_micro", "all-reduces"
        if not any(rank[key]) and any(rank["reduce_scatters_per_micro"]):
            key, what = "reduce_scatters_per_micro", "reduce-scatters"
        n = rank[key][k - 1] if len(rank[key]) >= k else 0
        if not 1 <= n <= 6:
            fail(f"rank {rank['rank']}: {n} {what} on the syncing micro-batch, expected 1 to 6")
        expected = ([0] * (k - 1) + [n]) * steps
        if rank[key] != expected:
            fail(f"rank {rank['rank']}: {what} per micro-batch {rank[key]}, expected {expected}")
        for s, step in enumerate(data["steps"]):
            mean = sum(rank["micro_batch_losses"][s * k:(s + 1) * k]) / k
            if abs(mean - step["ddp_rank_losses"][rank["rank"]]) > 1e-12:
                fail(f"step {s}: the step loss of rank {rank['rank']} is not the mean of its micro-batches")
    if not data["final"]["matches_reference"]:
        fail("with accumulation and buffers the demo says DDP does not match the reference")
    print(f"ok: K = {k} micro-batches per step recorded on every rank, {what} only on the last")


def check_cuda_refusal(demo):
    """A CPU-only stage refuses --device cuda before anything runs, and before
    asking whether this machine has a GPU, so the answer is the same on every
    machine. Stage 03 gets past that check (and then trains on a GPU, or
    says this machine has none)."""
    cpu_only = "this stage runs on the CPU only (it does not declare the cuda capability)"
    run = subprocess.run([demo, "--device", "cuda", "--world-size", "1", "--steps", "1"],
                         capture_output=True, text=True, timeout=240)
    if RUNS_ON_CUDA:
        if cpu_only in run.stderr:
            fail(f"a stage that runs on CUDA refuses --device cuda as CPU-only: {run.stderr!r}")
        print("ok: --device cuda is not refused as CPU-only by a stage that runs on CUDA")
        return
    stage = os.path.basename(demo).split("_")[1]  # demo_04 -> 04
    if run.returncode != 2 or f"demo {stage}: tp::train: {cpu_only}" not in run.stderr or \
            "stage 03 is the stage that runs on CUDA" not in run.stderr or "verdict" in run.stdout:
        fail(f"--device cuda on a CPU-only stage: exit {run.returncode}, stderr: {run.stderr!r}")
    print("ok: --device cuda on a CPU-only stage is a usage error naming the stage that runs on CUDA")


if __name__ == "__main__":
    EXPECT_WORKER = "--expect-worker" in sys.argv[2:]
    RUNS_ON_CUDA = "--runs-on-cuda" in sys.argv[2:]
    main(sys.argv[1])
