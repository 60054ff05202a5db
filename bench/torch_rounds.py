#!/usr/bin/env python3
"""PyTorch's side of bench_hooks', bench_zero's and bench_overlap's rounds:
the same steps, interleaved the same way, with PyTorch 1.13's
DistributedDataParallel.

    torch_rounds.py --round hooks|zero|overlap [--world-size 2] [--batch 64]
                    [--out FILE] [--smoke] [--init-method env://]

A round (bench/ranked_benchmark.h's interleaved_round) builds every
variant's model first, warms each up, then per iteration runs one training
step of each variant in an order rotated by one every iteration, and
reports per variant "<label>_ms", its median step, and
"<label>_over_<first>", the median over iterations of its step over the
first variant's in the same iteration. This one does the same, in Python,
on the same workload as bench/torch_ddp.py (deep_mlp(16, 128, 64, 4):
130 parameter tensors, 4.2 MB of float32; 64 random rows per rank; one
compute thread per rank; Gloo):

  --round hooks   BM_TorchHookRound, beside bench_hooks' BM_HookRound:
                  none (DDP's own all-reduce), allreduce (allreduce_hook),
                  fp16 (fp16_compress_hook), powersgd_r1 and powersgd_r4
                  (powerSGD_hook, matrix_approximation_rank 1 and 4,
                  start_powerSGD_iter 2 as the kit's bench, PyTorch's other
                  defaults: error feedback, warm start, min_compression_rate
                  2; one group per bucket: Note [PowerSGD's groups]). Plain
                  SGD, lr 1e-3.
  --round zero    BM_TorchZeroRound, beside bench_zero's BM_ZeroRound, SGD
                  with momentum 0.9: sgd (every rank steps everything) and
                  zero_broadcast (ZeroRedundancyOptimizer with
                  parameters_as_bucket_view: each rank's updated shard goes
                  out as one broadcast from its owner, as the kit's
                  zero_broadcast). PyTorch 1.13 has no all-gather form and
                  no reduce-scatter form; its default (one broadcast per
                  parameter) is zero_per_parameter.
  --round overlap BM_TorchOverlapRound, beside bench_overlap's
                  BM_OverlapRound, plain SGD, lr 1e-3: overlap (DDP at its
                  default caps: a first bucket of 1 MiB, then 25 MiB),
                  overlap_512k (both caps 512 KiB: bucket_cap_mb 0.5, and
                  the first bucket through dist._DEFAULT_FIRST_BUCKET_BYTES,
                  which DDP reads when it is built: PyTorch 1.13 has no
                  argument for it), overlap_512k_1thread (the same on a Gloo
                  group of one worker thread, as the kit's one communication
                  thread: PyTorch's groups have 2, so two buckets' all-reduces
                  can run at once; Note [One Gloo thread]) and no_ddp (the
                  model alone). PyTorch has no after_backward (stage 02) to
                  set beside the kit's.

Warm-up: 5 steps of each variant right after it is built (PyTorch's DDP
rebuilds its buckets after its first step; PowerSGD compresses from its
third); the kit's rounds build every variant first, then warm each up for
4 (hooks) or 3 (zero) steps. Iterations: 80 / W, at least 10, as the
kit's rounds.

Output (--out): Google Benchmark's JSON layout, one benchmark named after
the round with those counters and the context's "variants" (the labels in
order), as the kit's rounds write it, so bench/link_rounds.py reads both
alike. Rank 0 writes and prints.

Launched (--init-method env://): one rank of a job a launcher started
(tools/tprun): RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the
environment. bench/link_rounds.py --torch runs it so on a shaped link,
each run right after the kit's.

Optional: needs Debian's python3-torch; the kit never requires it.
"""

import argparse
import json
import os
import sys
import time

from atomic_file import write_text
from torch_ddp import add_init_method, deep_mlp, launched_rank, quantile, run_ranks

WARMUP = 5
POWERSGD_START = 2  # bench_hooks.cc's kPowerSGDStart
ROUNDS = {"hooks": "BM_TorchHookRound", "zero": "BM_TorchZeroRound",
          "overlap": "BM_TorchOverlapRound"}
MAX_BUCKETS = 4  # PowerSGD's groups (Note [PowerSGD's groups]); the model has 2 buckets


def hook_variants(torch):
    """[(label, make(module) -> (ddp, optimizer))] of the hooks round."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    def with_hook(register):
        def make(module):
            ddp = torch.nn.parallel.DistributedDataParallel(module)
            register(ddp)
            return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)
        return make

    def powersgd_at(rank):
        # Note [PowerSGD's groups]: PyTorch 1.13's powerSGD_hook launches its
        # P and Q all-reduces from the callbacks of its futures, on Gloo's
        # thread, while the autograd thread launches the next bucket's first
        # all-reduce. On one group the two take Gloo's tags in an order the
        # ranks need not share, and Gloo aborts ("op.preamble.length <=
        # op.nbytes"): seen here at rank 1 with the model's two buckets. So
        # each bucket gets a state on a group of its own (made before the
        # first step, in the same order on every rank), the same layout and
        # the same work as one state (each state's random_seed is 0, so the
        # buckets' first Q draws share a seed: no matter for the time);
        # every state counts the iterations (powerSGD_hook counts them on
        # the last bucket).
        groups = [torch.distributed.new_group() for _ in range(MAX_BUCKETS)]

        def register(ddp):
            states = [powersgd.PowerSGDState(process_group=group,
                                             matrix_approximation_rank=rank,
                                             start_powerSGD_iter=POWERSGD_START)
                      for group in groups]

            def hook(_, bucket):
                if bucket.index() >= MAX_BUCKETS:
                    raise RuntimeError(f"torch_rounds.py: bucket {bucket.index()}: more "
                                       f"than {MAX_BUCKETS} buckets (MAX_BUCKETS)")
                future = powersgd.powerSGD_hook(states[bucket.index()], bucket)
                if bucket.is_last():  # the hook counted its own state's
                    for i, state in enumerate(states):
                        if i != bucket.index():
                            state.maybe_increase_iter(bucket)
                return future
            ddp.register_comm_hook(None, hook)
        return register

    return [("none", with_hook(lambda ddp: None)),
            ("allreduce", with_hook(lambda ddp: ddp.register_comm_hook(
                None, default_hooks.allreduce_hook))),
            ("fp16", with_hook(lambda ddp: ddp.register_comm_hook(
                None, default_hooks.fp16_compress_hook))),
            ("powersgd_r1", with_hook(powersgd_at(1))),
            ("powersgd_r4", with_hook(powersgd_at(4)))]


def zero_variants(torch):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def with_optimizer(make_optimizer):
        def make(module):
            ddp = torch.nn.parallel.DistributedDataParallel(module)
            return ddp, make_optimizer(ddp.parameters())
        return make

    def zero(bucket_view):
        return with_optimizer(lambda params: ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.SGD, parameters_as_bucket_view=bucket_view,
            lr=1e-3, momentum=0.9))

    return [("sgd", with_optimizer(lambda params: torch.optim.SGD(params, lr=1e-3,
                                                                  momentum=0.9))),
            ("zero_broadcast", zero(True)),
            ("zero_per_parameter", zero(False))]


def one_thread_group(torch):
    """A Gloo group over every rank with one worker thread.

    Note [One Gloo thread]: ProcessGroupGloo runs a collective on one of its
    worker threads, 2 by default, so DDP's next bucket can start its
    all-reduce while the one before is still on the wire; the kit's
    process group runs one collective at a time on its one communication
    thread (lesson 03). This group lets the round show what that difference
    costs. PyTorch 1.13 has no public option for the count (new_group
    refuses pg_options for gloo: "GLOO options not supported"), so the
    group is built from ProcessGroupGloo's private _Options, much as
    init_process_group builds its own: on the default group's store under
    a prefix of its own, with PyTorch's default timeout, one device per
    interface GLOO_SOCKET_IFNAME names (the shaped link's), else the
    host's. It is not registered with torch.distributed (dist.get_rank(group)
    and DDP's join() would not know it); DDP's step needs neither."""
    dist = torch.distributed
    options = dist.ProcessGroupGloo._Options()
    interfaces = [i for i in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if i]
    options._devices = ([dist.ProcessGroupGloo.create_device(interface=i) for i in interfaces]
                        or [dist.ProcessGroupGloo.create_default_device()])
    options._threads = 1
    options._timeout = dist.default_pg_timeout
    store = dist.PrefixStore("one_gloo_thread", dist.distributed_c10d._get_default_store())
    return dist.ProcessGroupGloo(store, dist.get_rank(), dist.get_world_size(), options)


def overlap_variants(torch):
    dist = torch.distributed
    one_thread = one_thread_group(torch)  # before any variant: every rank in the same order

    def ddp_at(cap_kib, group=None):
        def make(module):
            if cap_kib is None:
                ddp = torch.nn.parallel.DistributedDataParallel(module, process_group=group)
            else:
                default_first = dist._DEFAULT_FIRST_BUCKET_BYTES
                dist._DEFAULT_FIRST_BUCKET_BYTES = cap_kib * 1024
                try:
                    ddp = torch.nn.parallel.DistributedDataParallel(
                        module, process_group=group, bucket_cap_mb=cap_kib / 1024)
                finally:
                    dist._DEFAULT_FIRST_BUCKET_BYTES = default_first
            return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)
        return make

    def alone(module):
        return module, torch.optim.SGD(module.parameters(), lr=1e-3)

    return [("overlap", ddp_at(None)), ("overlap_512k", ddp_at(512)),
            ("overlap_512k_1thread", ddp_at(512, one_thread)), ("no_ddp", alone)]


def interleaved_round(steps, iterations):
    """{label}_ms and {label}_over_{first} over `iterations` rotated rounds
    of `steps` ([(label, step())]), as ranked_benchmark.h's."""
    n = len(steps)
    ms = [[] for _ in steps]
    over_first = [[] for _ in steps]
    first = 0
    for _ in range(iterations):
        now = [0.0] * n
        for k in range(n):
            s = (first + k) % n
            start = time.perf_counter()
            steps[s][1]()
            now[s] = (time.perf_counter() - start) * 1e3
        first = (first + 1) % n
        for s in range(n):
            ms[s].append(now[s])
            over_first[s].append(now[s] / now[0])
    counters = {}
    for s, (label, _) in enumerate(steps):
        counters[f"{label}_ms"] = quantile(ms[s], 0.5)
        if s > 0:
            counters[f"{label}_over_{steps[0][0]}"] = quantile(over_first[s], 0.5)
    return counters


def rank_main(rank, args, init_method):
    import torch
    torch.set_num_threads(1)
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=args.world_size)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 16, generator=generator)
    y = torch.randn(args.batch, 4, generator=generator)
    variants = {"hooks": hook_variants, "zero": zero_variants,
                "overlap": overlap_variants}[args.round](torch)
    steps = []
    for label, make in variants:
        torch.manual_seed(0)
        ddp, optimizer = make(deep_mlp(torch))

        def step(ddp=ddp, optimizer=optimizer):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
        for _ in range(0 if args.smoke else WARMUP):
            step()
        steps.append((label, step))
    dist.barrier()  # every rank's variants built before the first is timed
    iterations = 1 if args.smoke else max(10, 80 // args.world_size)
    name = ROUNDS[args.round]
    result = {"name": name, "run_name": name, "run_type": "iteration",
              "iterations": iterations, "time_unit": "ms",
              **interleaved_round(steps, iterations)}
    if rank == 0:
        print(f"{name}, {args.world_size} ranks: " + ", ".join(
            f"{label} {result[f'{label}_ms']:.1f} ms" for label, _ in steps), flush=True)
        if args.out:
            context = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "library": f"torch {torch.__version__}",
                       "world_size": str(args.world_size), "cores": str(os.cpu_count()),
                       "batch": str(args.batch), "smoke": "1" if args.smoke else "0",
                       "variants": ",".join(label for label, _ in steps)}
            write_text(args.out, json.dumps({"context": context, "benchmarks": [result]},
                                            indent=2))
    dist.barrier()  # rank 0 has written the round: every rank is done
    # Every rank leaves here without tearing anything down: with several
    # DDPs and a ZeroRedundancyOptimizer still alive, PyTorch 1.13's
    # teardown once aborted rank 0 ("terminate called without an active
    # exception") after the round was written, failing a test over nothing
    # it measures.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round", required=True, choices=sorted(ROUNDS),
                        help="hooks (beside bench_hooks), zero (beside bench_zero) or "
                             "overlap (beside bench_overlap)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="rows per rank (default 64)")
    parser.add_argument("--out", help="write the round here (Google Benchmark's JSON layout)")
    parser.add_argument("--smoke", action="store_true",
                        help="one iteration, no warm-up (tests): the times mean nothing")
    add_init_method(parser)
    args = parser.parse_args()
    launched = launched_rank(parser, args)
    if not 2 <= args.world_size <= 16 or not 1 <= args.batch <= 4096:
        parser.error("--world-size must be 2 to 16 and --batch 1 to 4096")
    return run_ranks("torch_rounds.py", rank_main, args, launched)


if __name__ == "__main__":
    sys.exit(main())
