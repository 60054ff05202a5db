// What a DDP stage declares about itself, so one trainer can drive them all.
//
// Contract:
//   - Every stage's DistributedDataParallel has
//       static constexpr tp::train::Capabilities capabilities{...};
//     The trainer (ddp_trainer.h) reads it at compile time and never guesses
//     from method names: a stage-03 DDP that keeps a sync_grads() for
//     debugging is not synced twice, because it declares syncs_in_backward.
//   - Exactly one of syncs_after_backward and syncs_in_backward is true.
//   - Each flag names the member the stage must then have; the concept
//     DataParallelModel (ddp_trainer.h) requires it, so a stage that declares
//     a flag without the member fails to compile with the concept's name in
//     the message, not at run time.
#pragma once

namespace tp::train {

struct Capabilities {
  // Stages 01-02: gradients are averaged by ddp.sync_grads(), which the
  // trainer calls after the backward of each step's last micro-batch.
  bool syncs_after_backward = false;
  // Stage 03 on: hooks average the gradients inside backward; the trainer
  // calls nothing extra.
  bool syncs_in_backward = false;
  // Stage 04 on: `auto guard = ddp.no_sync();` makes the forward and
  // backward run under it accumulate locally without communicating. The
  // trainer uses it for every micro-batch of a step but the last.
  bool no_sync = false;
  // Stage 07: `ddp.join(body)` runs body (this rank's training loop) and then
  // shadows the collectives of the ranks still training until all have
  // joined. Needed for uneven inputs.
  bool join = false;
  // Stage 05 on: can train a model whose parameters may get no gradient
  // (find_unused_parameters). Without it, the trainer refuses such a plan
  // (ModelKind::Branchy) before starting any rank.
  bool unused_parameters = false;
  // Stage 02 on: `ddp.bucket_assignment()` returns the parameter indices
  // (named_parameters() order) of each bucket, in bucket order, as
  // std::vector<std::vector<int64_t>>, so checkers can check the rule.
  bool buckets = false;
  // Stage 03: trains on CUDA tensors (RunConfig::device cuda, `--device
  // cuda`). No member: the DDP keeps every tensor it allocates (its buckets)
  // on the parameters' device, and touches tensor memory only through ops
  // and the process group, never through data_ptr<>() on the host. Without
  // it, the trainer refuses a CUDA plan before starting any rank.
  bool cuda = false;
  // Stage 08: after constructing the DDP, the trainer calls
  // `register_builtin_hook(ddp, options)`, found by argument-dependent
  // lookup in the stage's namespace, with the run's options
  // (run_options_t<D>, stage_spec.h: stage 08's RunOptions): it registers
  // the built-in communication hook they name (the demo's --comm-hook), or
  // none.
  bool comm_hooks = false;
  // Stage 09: the optimizer is the stage's, sharded across the ranks. The
  // trainer builds it with `make_optimizer(ddp, sgd_options, options)`
  // (argument-dependent lookup, like register_builtin_hook; the run's
  // options, as there), which returns
  // a std::unique_ptr to an object with step(), zero_grad(bool),
  // partition() (each rank's parameter indices) and params_with_state();
  // on uneven inputs it runs the loop under `join_with_optimizer(ddp,
  // optimizer, options, body)` instead of ddp.join(body), since a joined
  // rank must shadow the optimizer's collectives too.
  bool sharded_optimizer = false;
  // Stage 10 (FSDP): the parameters themselves are sharded. parameters() are
  // this rank's shards (the optimizer, the kit's SGD, steps them), and
  // named_parameters() the model's own parameters, whose values exist only
  // while gathered: the trainer reads them inside `auto full =
  // ddp.summon_full_params();`, a collective every rank makes at the same
  // points (after construction, after the first step, at the end).
  bool fully_sharded = false;
};

}  // namespace tp::train
