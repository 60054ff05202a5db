#!/usr/bin/env python3
"""PyTorch's DDP step under its profiler: the trace overlap_trace.py reads
beside the kit's demo traces.

    torch_trace.py --trace FILE [--world-size 2] [--batch 256] [--steps 8]
                   [--cap-kib N] [--init-method env://]

Trains bench/torch_ddp.py's workload (deep_mlp(16, 128, 64, 4), random
rows, plain SGD, one compute thread per rank, Gloo) with PyTorch 1.13's
DistributedDataParallel for 5 untimed steps (DDP rebuilds its buckets
after the first), then --steps steps under torch.profiler (CPU), each step
inside record_function("step") and its backward inside
record_function("backward"), as the kit's trainer names its spans. At
--cap-kib N both caps are N KiB (bucket_cap_mb, and the first bucket
through dist._DEFAULT_FIRST_BUCKET_BYTES, as torch_rounds.py does); by
default PyTorch's (1 MiB, then 25 MiB).

What PyTorch's profiler records of DDP (1.13, CPU, Gloo): on the training
thread, "c10d::allreduce_" where the Reducer launches a bucket and
autograd's "autograd::engine::evaluate_function: ..." per node; on one of
ProcessGroupGloo's worker threads, "gloo:all_reduce" from the collective's
start to its end. It records no thread CPU time. And it adds its own cost to
every op, so a profiled backward is slower than bench/torch_rounds.py's:
read shares and order, not the step.

Output: one Chrome trace, FILE, with every rank's events, each rank's pid
being its rank (rank 0 gathers the others' files after a barrier).
Launched (--init-method env://): one rank of a job tools/tprun started,
as torch_ddp.py; bench/on_link.py runs it so on a shaped link.

Optional: needs Debian's python3-torch; the kit never requires it.
"""

import argparse
import json
import os
import sys

from atomic_file import write_text
from torch_ddp import add_init_method, deep_mlp, launched_rank, run_ranks

WARMUP = 5


def rank_main(rank, args, init_method):
    import torch
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=args.world_size)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 16, generator=generator)
    y = torch.randn(args.batch, 4, generator=generator)
    torch.manual_seed(0)
    default_first = dist._DEFAULT_FIRST_BUCKET_BYTES
    if args.cap_kib:
        dist._DEFAULT_FIRST_BUCKET_BYTES = args.cap_kib * 1024
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(
            deep_mlp(torch), bucket_cap_mb=args.cap_kib / 1024 if args.cap_kib else 25)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = default_first
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        with torch.profiler.record_function("backward"):
            loss.backward()
        optimizer.step()

    for _ in range(WARMUP):
        step()
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(args.steps):
            with torch.profiler.record_function("step"):
                step()
        # The last step's last all-reduce ends its span on a Gloo thread just
        # after the training thread stops waiting for it; a barrier, queued
        # behind it on those threads, keeps the profile open until it has.
        dist.barrier()
    part = f"{args.trace}.rank{rank}"
    profile.export_chrome_trace(part)
    dist.barrier()  # every rank's part written
    if rank == 0:
        events = []
        for r in range(args.world_size):
            path = f"{args.trace}.rank{r}"
            with open(path) as f:
                loaded = json.load(f)
            for e in loaded["traceEvents"] if isinstance(loaded, dict) else loaded:
                e["pid"] = r  # one row per rank, as the kit's traces
                events.append(e)
            os.remove(path)
        write_text(args.trace, json.dumps({"traceEvents": events}) + "\n")
        print(f"torch_trace.py: wrote {args.trace} ({args.steps} profiled steps, "
              f"{args.world_size} ranks)", flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as torch_rounds.py: PyTorch 1.13's teardown is not what this measures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, help="write the merged Chrome trace here")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--batch", type=int, default=256, help="rows per rank (default 256)")
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (default 8)")
    parser.add_argument("--cap-kib", type=int, default=0,
                        help="both caps in KiB (default 0: PyTorch's, 1 MiB then 25 MiB)")
    add_init_method(parser)
    args = parser.parse_args()
    launched = launched_rank(parser, args)
    if not 2 <= args.world_size <= 16 or not 1 <= args.batch <= 4096 or \
            not 1 <= args.steps <= 1000 or args.cap_kib < 0:
        parser.error("--world-size takes 2 to 16, --batch 1 to 4096, --steps 1 to 1000 and "
                     "--cap-kib 0 or more")
    args.trace = os.path.abspath(args.trace)
    return run_ranks("torch_trace.py", rank_main, args, launched)


if __name__ == "__main__":
    sys.exit(main())
