// Checks shared by the stage checkers: counted collectives, bucket
// assignment, and order on the trace.
//
// Contract:
//   - Each predicate reads one case's results (CaseRun) and returns findings
//     (empty when it holds), each naming the rank, the step and the measured
//     fact. The likely cause is the stage's: it is passed in, so nothing here
//     names a stage's methods.
//   - Order checks use the trace's total order (Event::begin_order /
//     end_order), never wall-clock time, so they hold on a loaded machine;
//     a collective counts as finished once a wait() on it has returned, not
//     when the communication thread happened to be done, so they give the
//     same verdict on every run.
//   - A count rule broken at W = 1 says that it holds at W = 1 too.
//     They need RunConfig::trace and refuse to pass a run without a trace.
//   - Counts come from RankResult::allreduces_per_micro / broadcasts_per_micro
//     (the collectives a rank issued from the start of micro-batch i to its
//     end, the optimizer step of a step's last micro-batch included).
//   - A stage's checker lists its checks of a case as one table,
//     first_findings({...}): the first check that finds something is the
//     diagnosis, and no check can be left out of the chain by accident.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "tensorplay/train/compare.h"
#include "tensorplay/train/config.h"
#include "tensorplay/train/results.h"

namespace tp::train {

// What one checker case produced.
struct CaseRun {
  const RunConfig& config;
  const ReferenceResult& reference;
  const std::vector<RankResult>& ranks;
  size_t num_params() const { return reference.final_params.size(); }
  size_t num_buffers() const {
    return reference.final_buffers.empty() ? 0 : reference.final_buffers[0].size();
  }
};

enum class Collective { AllReduce, Broadcast };

// The DDP constructor issued exactly `broadcasts` broadcasts and
// `allreduces` all-reduces on every rank, and `allgathers` all-gathers when
// given (the model-consistency check).
std::vector<Finding> check_construction_counts(const CaseRun& run, uint64_t broadcasts,
                                               uint64_t allreduces,
                                               const std::string& broadcast_cause,
                                               std::optional<uint64_t> allgathers = {});

// Every micro-batch i that rank r ran issued expected(step, micro) collectives
// of `kind`. `expectation` describes the rule in words ("one per parameter
// on the last micro-batch of a step, none on the others"); `cause` is the
// likely cause when it fails.
std::vector<Finding> check_counts_per_micro(
    const CaseRun& run, Collective kind,
    const std::function<uint64_t(int64_t step, int64_t micro)>& expected,
    const std::string& expectation, const std::string& cause);

// Per optimizer step: expected all-reduces over the step's micro-batches.
std::vector<Finding> check_allreduces_per_step(const CaseRun& run, uint64_t expected,
                                               const std::string& expectation,
                                               const std::string& cause);

// No collective at all in a micro-batch that is not the last of its step
// (gradient accumulation: no_sync, or a stage that syncs after backward),
// except the buffer broadcasts of the first one when the plan syncs buffers
// every step (BufferSync::EveryStep).
std::vector<Finding> check_quiet_until_last_micro_batch(const CaseRun& run,
                                                        const std::string& cause);

// Stages that sync after backward: every all-reduce of step s is queued
// after step s's last backward has finished, and is waited for (a wait() on
// it returns) before step s's optimizer step starts: Note [Finished means
// waited for] in predicates.cc.
std::vector<Finding> check_sync_between_backward_and_step(const CaseRun& run,
                                                          const Advice& advice);

// Stages that sync inside backward (overlap): in every step, every all-reduce
// queued during the syncing backward is queued before the autograd engine's
// "graph done" mark, i.e. from a hook while backward still computes, not
// from the end-of-backward callbacks; bucket b's all-reduce leaves before
// the engine produces the next gradient after the last one buckets 0..b
// need (Note [Launch deadlines] in predicates.cc; the engine's "grad ready"
// marks say which parameter, through RankResult::param_ids) when `buckets`
// is given, else only "the first leaves before the last gradient"; and each
// is waited for before the optimizer step starts. All-reduces are paired with
// their step by sequence number, so one that runs after its step ended
// still counts against it. `launch_cause` and `wait_cause` are the stage's
// advice for each failure.
// `trailing`: all-reduces a stage launches after its buckets in the same
// backward (stage 05's used-map), which must also leave before the graph is
// done. A parameter the syncing micro-batch did not reach on this rank
// (RankResult::unreached_per_micro) counts as ready at the first gradient.
std::vector<Finding> check_overlap(const CaseRun& run,
                                   const std::vector<std::vector<int64_t>>& buckets,
                                   const std::string& launch_cause,
                                   const std::string& wait_cause, size_t trailing = 0);

// Stages that sync inside backward: every all-reduce launched during a
// step's syncing backward is waited for before that backward returns (the
// end-of-backward callback waits for them), so .grad is final when
// backward() returns.
std::vector<Finding> check_synced_when_backward_returns(const CaseRun& run,
                                                        const std::string& cause);

// The all-reduces of every step are launched in bucket order: the k-th
// carries bucket k's bytes (the "bytes" argument of "allreduce queued"), then
// one of each of `trailing_bytes` (all-reduces after the buckets, such as
// stage 05's used-map), and there are no others.
std::vector<Finding> check_launch_order(const CaseRun& run,
                                        const std::vector<std::vector<int64_t>>& buckets,
                                        const std::string& cause,
                                        const std::vector<int64_t>& trailing_bytes = {});

// In every step with two or more all-reduces, all are launched before the
// first wait() on any of them (Work::wait's "wait" span), so they queue back
// to back on the communication thread instead of one at a time.
std::vector<Finding> check_launched_before_first_wait(const CaseRun& run,
                                                      const std::string& cause);

// gradient_as_bucket_view, checked on what the rank's .grad tensors are
// (RankResult::grad_storage), not on what the stage says it did: with
// `as_view`, the parameters of one bucket have their gradients in one
// storage and different buckets in different ones; without, no two
// parameters share a gradient's storage. A parameter without a gradient
// (unused on every rank) is left out.
std::vector<Finding> check_grad_storage(const CaseRun& run,
                                        const std::vector<std::vector<int64_t>>& buckets,
                                        bool as_view, const std::string& cause);

// No gradient copied twice: in every step, the bytes Tensor::copy_ wrote
// into the storages the gradients live in (RankResult::
// grad_copy_bytes_per_micro, summed over the step's micro-batches) are at
// most the bytes of all the parameters' gradients. Without
// gradient_as_bucket_view the copy back from the bucket writes each .grad
// once; with it, the hook's copy into the slot is the copy into .grad, and a
// copy back would write the slot onto itself, a second time.
std::vector<Finding> check_grad_copies(const CaseRun& run, const std::string& cause);

// The bucket rule (stage 02 on): parameters in reverse registration order,
// the order their gradients become ready; each dtype has its own open
// bucket (a bucket is one flat tensor of one dtype), which closes once it
// holds at least its cap of bytes (so it may overshoot by its last tensor);
// each dtype's first bucket's cap is first_bucket_cap_mb, its later ones'
// bucket_cap_mb (MiB, truncated to whole bytes). Buckets are listed in the
// order they close; those still open at the end follow, by dtype (float32
// before float64). Returns the parameter indices of each bucket, each
// bucket's in the order they were added. This is PyTorch's
// compute_bucket_assignment_by_size once it has rebuilt its buckets in
// gradient-ready order after the first iteration (it keys the open buckets
// by dtype and device and leaves the order of the ones still open at the
// end unspecified; its very first assignment fills buckets in registration
// order and reverses the list, so there the small bucket goes last). A
// non-empty `order` replaces reverse registration order: the parameters in
// the order a stage rebuilds its buckets in (stage 06).
std::vector<std::vector<int64_t>> expected_buckets(const Snapshot& params, double bucket_cap_mb,
                                                   double first_bucket_cap_mb,
                                                   const std::vector<int64_t>& order = {});
// The same for the case's model (the reference's parameters and dtypes).
std::vector<std::vector<int64_t>> expected_buckets(const CaseRun& run, double bucket_cap_mb,
                                                   double first_bucket_cap_mb,
                                                   const std::vector<int64_t>& order = {});
// A parameter's bytes: its elements times its dtype's size.
uint64_t bytes_of(const ParamValues& param);
// The bytes each bucket's flat tensor holds: its parameters' bytes.
std::vector<int64_t> bucket_bytes(const Snapshot& params,
                                  const std::vector<std::vector<int64_t>>& buckets);

// The value of argument `name` of a trace event, or -1 when it has none.
int64_t arg_of(const trace::Event& e, const char* name);

// The innermost span of `events` around the event `e`, on e's thread, other
// than the step's own ("forward", "hook", "callbacks", ...); null when none.
const trace::Event* span_around(const std::vector<trace::Event>& events, const trace::Event& e);

// The size of every all-reduce: in each step a rank ran, its all-reduces
// carry, in any order, exactly the bytes of `expected(step)` (bucket_bytes
// of the step's buckets, and whatever else the stage all-reduces then: the
// join notify, the used-map), read from the trace's "allreduce queued"
// events. A bucket's flat tensor must hold its parameters' elements and no
// more: one sized in bytes gives the right averages while every all-reduce
// moves 4x (float64: 8x) the data, which the finding then says; an
// all-reduce queued in forward is no bucket's (join's count), and the
// finding says that instead. `what` names the expected list in the fact
// ("the 3 buckets").
std::vector<Finding> check_allreduce_sizes(
    const CaseRun& run, const std::function<std::vector<int64_t>(int64_t step)>& expected,
    const std::string& what, const std::string& cause);

// Every rank reports the same buckets (RankResult::buckets), equal to
// `expected`; a rank's bucket that mixes dtypes is named as such.
std::vector<Finding> check_buckets(const CaseRun& run,
                                   const std::vector<std::vector<int64_t>>& expected,
                                   const std::string& cause);

// One check of a case, as a stage's checker lists it: its findings, none
// when it holds. A check that applies only to some options returns none
// for the others.
using CaseCheck = std::function<std::vector<Finding>()>;

// Runs `checks` in order and returns the findings of the first that has
// any (a later check would only describe the same failure again, in other
// words), or none when every check holds.
std::vector<Finding> first_findings(std::initializer_list<CaseCheck> checks);

}  // namespace tp::train
