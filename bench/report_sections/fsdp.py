"""Stage 10's FSDP beside stage 09's DDP and ZeRO (bench_fsdp): step time,
bytes per step and peak memory of each set-up. Its figure, fsdp.png, is
bench/fsdp_figure.py's (./kit bench --link fsdp redraws it on its own).
"""

from report_sections.results import by_world_size, ms, variant_runs

# bench_fsdp.cc's set-ups, in the order it runs them; the first is what the
# round's ratios divide by.
FSDP_SETUPS = [("ddp", "DDP (stage 09, plain SGD)"),
               ("zero_rs", "ZeRO, reduce-scatter form (stage 09)"),
               ("no_shard", "FSDP NO_SHARD, a unit per Linear"),
               ("grad_op", "FSDP SHARD_GRAD_OP, a unit per Linear"),
               ("full_no_prefetch", "FSDP FULL_SHARD, a unit per Linear, no prefetch"),
               ("full", "FSDP FULL_SHARD, a unit per Linear"),
               ("full_fwd_prefetch", "FSDP FULL_SHARD, a unit per Linear, forward_prefetch"),
               ("grad_op_blocks", "FSDP SHARD_GRAD_OP, a unit per block"),
               ("full_blocks_no_prefetch", "FSDP FULL_SHARD, a unit per block, no prefetch"),
               ("full_blocks", "FSDP FULL_SHARD, a unit per block"),
               ("full_blocks_fwd_prefetch", "FSDP FULL_SHARD, a unit per block, forward_prefetch")]


def report_fsdp(results, report):
    report.add("## FSDP: step time, bytes and peak memory (bench_fsdp, stage 10)", "")
    measured = by_world_size(results, "bench_fsdp")
    for w, result in measured:
        table = []
        for _, name, run, _, over in variant_runs(result, FSDP_SETUPS, "BM_StepStage10/setup",
                                                  "BM_FsdpRound"):
            table.append([name, f"{run['peak_model_state_bytes'] / 1e3:.0f}",
                          f"{run['allreduce_bytes'] / 1e3:.0f}",
                          f"{run['allgather_bytes'] / 1e3:.0f}",
                          f"{run['reduce_scatter_bytes'] / 1e3:.0f}",
                          f"{run['collectives']:.0f}", f"{ms(run):.2f}",
                          f"{over:.2f}x" if over is not None else "-"])
        report.add(f"### {w} ranks", "")
        report.table(["set-up", "peak params+grads+state kB", "kB all-reduced",
                      "kB all-gathered", "kB reduce-scattered", "collectives per step",
                      "step p50 ms", "interleaved / DDP"], table)
    if measured:
        report.add("- the deep model of bench_hooks (130 tensors, 4.2 MB), momentum 0.9; the "
                   "peak is the most the rank held at once in parameters, gradients and "
                   "optimizer state; the bytes are what each collective was handed per step and "
                   "rank; a block (16 Linears) is one unit: 4 blocks and the last Linear", "")
    else:
        report.add("Not measured (bench_fsdp.w*.json missing).", "")
