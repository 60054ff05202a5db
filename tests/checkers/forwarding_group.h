// A process group that hands every collective to the group it wraps: a
// second group object over the same ranks. Checkers derive from it to
// change one answer (check_08's ShortTimeout: a short timeout()) or use it
// as it is (check_09: joinables of "another" group). Included by
// check_NN.cc.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/distributed/process_group.h"

namespace forwarding_group {

class ForwardingGroup : public tp::distributed::ProcessGroup {
 public:
  explicit ForwardingGroup(std::shared_ptr<tp::distributed::ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  bool can_reduce(tp::Dtype dtype) const override { return inner_->can_reduce(dtype); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::shared_ptr<tp::distributed::Work> allreduce(const tp::Tensor& t,
                                                   tp::distributed::ReduceOp op) override {
    return inner_->allreduce(t, op);
  }
  std::shared_ptr<tp::distributed::Work> broadcast(const tp::Tensor& t, int root) override {
    return inner_->broadcast(t, root);
  }
  std::shared_ptr<tp::distributed::Work> allgather(const std::vector<tp::Tensor>& outputs,
                                                   const tp::Tensor& input) override {
    return inner_->allgather(outputs, input);
  }
  std::shared_ptr<tp::distributed::Work> barrier() override { return inner_->barrier(); }
  void synchronize() override { inner_->synchronize(); }
  void check_collective_count(const std::string& where) override {
    inner_->check_collective_count(where);
  }
  void skip_count_points(int64_t missed) override { inner_->skip_count_points(missed); }

 private:
  std::shared_ptr<tp::distributed::ProcessGroup> inner_;
};

}  // namespace forwarding_group
