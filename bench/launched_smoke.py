#!/usr/bin/env python3
"""A ranked benchmark run launched: 2 ranks started by tools/tprun, env://.

    launched_smoke.py TPRUN BENCH_STEP BENCH_ALLREDUCE BENCH_OVERLAP TORCH_DDP

Runs `tprun --nproc-per-node 2 -- BENCH_STEP --init-method=env:// --smoke=1`
on loopback (a free port; one iteration of BM_StepNoDDP and one
BM_OverlapPair) and checks that rank 0 alone wrote the results, that they
say 2 launched ranks (init_method env://), that every benchmark ran with
its counters (BM_OverlapPair's per-stage phases, which bench/link_bench.py
reads), and that the launch mistakes are refused before anything starts:
RANK set without --init-method, --init-method=file://, and a --world-size
that disagrees with the launcher's WORLD_SIZE. Then what bench/link_bench.py
runs besides: bench_step --cap-sweep=1 (every cap of BM_CapSweep, whose
bucket counts must be those link_bench.py's prediction models),
bench_allreduce launched (the kit's all-reduce alone, raw Gloo said to be
not measured), bench_overlap's round launched (as bench/link_rounds.py
--program overlap runs it: every set-up's median and ratio) and, where a
python here imports torch (link_bench's torch_python), torch_ddp.py
launched and torch_rounds.py's three rounds (bench/link_rounds.py runs them
beside bench_hooks, bench_zero and bench_overlap).
Some seconds; the times mean nothing.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile

TPRUN, BENCH, ALLREDUCE, OVERLAP, TORCH_DDP = sys.argv[1:6]
TORCH_ROUNDS = os.path.join(os.path.dirname(os.path.abspath(TORCH_DDP)), "torch_rounds.py")
FILTER = "--benchmark_filter=BM_StepNoDDP|BM_OverlapPair/cap_kib:0/batch:16/"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import link_bench  # noqa: E402
from smoke import fail  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(command):
    return subprocess.run([sys.executable, TPRUN, "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "--", *command],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)


def launch(extra, out, program=BENCH, bench_filter=FILTER):
    return launch_command([program, bench_filter, "--smoke=1", f"--benchmark_out={out}",
                           "--benchmark_out_format=json", *extra])


def check_round(counters, context, variants, what):
    """A round's counters name every variant's median and its ratio to the
    first, and its context the variants in order, as link_rounds.py reads
    them."""
    want = [f"{v}_ms" for v in variants] + [f"{v}_over_{variants[0]}" for v in variants[1:]]
    if context.get("variants") != ",".join(variants) or \
            any(name not in counters for name in want) or context.get("world_size") != "2":
        fail(f"{what}: context {context}, counters {sorted(counters)}")


def check_torch_rounds(python):
    """torch_rounds.py's three rounds, launched, one iteration: every
    variant's median and its ratio to the first, as link_rounds.py reads
    them."""
    for round_name, variants in (("hooks", ["none", "allreduce", "fp16", "powersgd_r1",
                                            "powersgd_r4"]),
                                 ("zero", ["sgd", "zero_broadcast", "zero_per_parameter"]),
                                 ("overlap", ["overlap", "overlap_512k",
                                              "overlap_512k_1thread", "no_ddp"])):
        with tempfile.TemporaryDirectory(prefix="tp-torch-rounds-") as tmp:
            out = os.path.join(tmp, "round.json")
            result = results_of(launch_command(
                [python, TORCH_ROUNDS, "--round", round_name, "--init-method", "env://",
                 "--smoke", "--out", out]), out, f"torch_rounds.py --round {round_name}")
        check_round(result["benchmarks"][0], result["context"], variants,
                    f"torch_rounds.py --round {round_name}")
        print(f"ok: torch_rounds.py --round {round_name} launched: {', '.join(variants)}")


def results_of(r, out, what):
    if r.returncode != 0:
        fail(f"{what} failed (exit {r.returncode}):\n{r.stdout[-3000:]}")
    with open(out) as f:
        return json.load(f)


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "rank0.json")
    r = launch(["--init-method=env://"], out)
    if r.returncode != 0:
        fail(f"the launched run failed (exit {r.returncode}):\n{r.stdout[-3000:]}")
    with open(out) as f:
        results = json.load(f)
    context = results["context"]
    if context.get("init_method") != "env://" or context.get("world_size") != "2":
        fail(f"the results say init_method={context.get('init_method')}, "
             f"world_size={context.get('world_size')}, not env:// and 2")
    names = [b["name"].split("/iterations")[0] for b in results["benchmarks"]]
    if names != ["BM_StepNoDDP", "BM_OverlapPair/cap_kib:0/batch:16"]:
        fail(f"ran {names}")
    pair = results["benchmarks"][1]
    missing = [c for c in ("s02_ms", "s03_ms", "sync02_ms", "fwd02_ms", "bwd02_ms", "fwd03_ms",
                           "bwd03_ms") if c not in pair]
    if missing:
        fail(f"BM_OverlapPair lacks the counters {missing}")
    print(f"ok: 2 launched ranks ran {names}; rank 0 wrote the results")

    cases = [
        ([], "--init-method is not given"),
        (["--init-method=file:///tmp/x"], "--init-method file:// is what bench_step does"),
        (["--init-method=env://", "--world-size=3"], "--world-size=3 disagrees with WORLD_SIZE=2"),
    ]
    for extra, want in cases:
        r = launch(extra, os.path.join(tmp, "bad.json"))
        if r.returncode == 0 or want not in r.stdout:
            fail(f"{extra or 'no --init-method'}: exit {r.returncode}, and the output does not "
                 f"say '{want}':\n{r.stdout[-2000:]}")
        print(f"ok: {extra or 'no --init-method'} is refused: {want}")

    out = os.path.join(tmp, "sweep.json")
    sweep = results_of(launch(["--init-method=env://", "--cap-sweep=1"], out,
                              bench_filter="--benchmark_filter=BM_CapSweep/"), out,
                       "bench_step --cap-sweep=1")
    if [b["name"].split("/iterations")[0] for b in sweep["benchmarks"]] != \
            ["BM_CapSweep/batch:64"]:
        fail(f"bench_step --cap-sweep=1 ran {[b['name'] for b in sweep['benchmarks']]}")
    try:  # as link_bench.py reads it, bucket counts checked against its model
        caps = [r.cap_kib for r in link_bench.sweep_rows(sweep, None, 0.0, 0.0)]
    except (KeyError, RuntimeError) as e:
        fail(f"BM_CapSweep's counters do not read as link_bench.py needs: {e!r}")
    if caps != [64, 128, 256, 512, 1024, 2048, 4096]:
        fail(f"BM_CapSweep ran at caps {caps}")
    print(f"ok: BM_CapSweep at {caps} KiB, bucket counts as link_bench.py models them")

    out = os.path.join(tmp, "allreduce.json")
    allreduce = results_of(launch(["--init-method=env://"], out, program=ALLREDUCE,
                                  bench_filter="--benchmark_filter=BM_Allreduce"), out,
                           "bench_allreduce launched")
    runs = allreduce["benchmarks"]
    if "not measured" not in allreduce["context"].get("raw_gloo", "") or len(runs) != 13 or \
            any("kit_p50_us" not in b or "gloo_p50_us" in b for b in runs):
        fail(f"bench_allreduce launched: context raw_gloo "
             f"{allreduce['context'].get('raw_gloo')!r}, {len(runs)} sizes, counters "
             f"{sorted(runs[0]) if runs else None}")
    print("ok: bench_allreduce launched measures the kit's all-reduce at 13 sizes, raw Gloo "
          "said to be not measured")

    out = os.path.join(tmp, "overlap.json")
    overlap = results_of(launch(["--init-method=env://"], out, program=OVERLAP,
                                bench_filter="--benchmark_filter=^BM_OverlapRound"), out,
                         "bench_overlap launched")
    if [b["name"].split("/iterations")[0] for b in overlap["benchmarks"]] != ["BM_OverlapRound"]:
        fail(f"bench_overlap ran {[b['name'] for b in overlap['benchmarks']]}")
    check_round(overlap["benchmarks"][0], overlap["context"],
                ["overlap", "after_backward", "overlap_512k", "no_ddp"], "bench_overlap")
    print("ok: bench_overlap's round launched: overlap, after_backward, overlap_512k, no_ddp")

    python = link_bench.torch_python()  # Debian's python3-torch is /usr/bin/python3's
    if python is None:
        print("skipped: torch_ddp.py and torch_rounds.py launched (no python here imports "
              "torch)")
    else:
        out = os.path.join(tmp, "torch.json")
        torch = results_of(launch_command([python, TORCH_DDP, "--init-method", "env://",
                                           "--only-default-caps", "--smoke", "--out", out]),
                           out, "torch_ddp.py launched")
        names = [b["name"] for b in torch["benchmarks"]]
        if names != ["BM_TorchStepNoDDP", "BM_TorchStepDDP/cap_kib:0"] or \
                torch["context"]["world_size"] != "2":
            fail(f"torch_ddp.py launched ran {names} at world size "
                 f"{torch['context']['world_size']}")
        print(f"ok: torch_ddp.py launched ran {names} on 2 ranks")
        check_torch_rounds(python)
print("PASS")
