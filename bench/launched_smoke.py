#!/usr/bin/env python3
"""A ranked benchmark run launched: 2 ranks started by tools/tprun, env://.

    launched_smoke.py TPRUN BENCH_STEP

Runs `tprun --nproc-per-node 2 -- BENCH_STEP --init-method=env:// --smoke=1`
on loopback (a free port; one iteration of BM_StepNoDDP and one
BM_OverlapPair) and checks that rank 0 alone wrote the results, that they
say 2 launched ranks (init_method env://), that every benchmark ran with
its counters (BM_OverlapPair's per-stage phases, which bench/link_bench.py
reads), and that the launch mistakes are refused before anything starts:
RANK set without --init-method, --init-method=file://, and a --world-size
that disagrees with the launcher's WORLD_SIZE. A few seconds; the times
mean nothing.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile

TPRUN, BENCH = sys.argv[1], sys.argv[2]
FILTER = "--benchmark_filter=BM_StepNoDDP|BM_OverlapPair/cap_kib:0/batch:16/"


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(extra, out):
    return subprocess.run([sys.executable, TPRUN, "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "--", BENCH, FILTER, "--smoke=1",
                           f"--benchmark_out={out}", "--benchmark_out_format=json", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120)


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
print("PASS")
