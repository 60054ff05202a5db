// What a rank's own error means in a static_graph case whose model takes
// the same route in every iteration. Shared by checkers 06 to 09, whose
// stages carry static_graph (Note [Static graph] in their ddp.cc).
//
// A stage checks static_graph's promise itself and throws when it breaks
// ("the graph changed, or the record of the first iteration is not what it
// found"). The rank cannot tell which; the checker can: in these cases the
// graph never changes, so such an error blames the record the student's
// stage kept, not the model. Any other error of a rank is left to its own
// message.
#pragma once

#include <string>
#include <vector>

namespace static_graph_cause {

// The likely cause, for CheckCase/Scenario::if_a_rank_throws: `record` says
// where this case's record is made.
inline std::string record_not_graph(const std::string& record) {
  return "a rank failed: its message above says why. This case's model takes the same route "
         "in every iteration on each rank, so static_graph's promise holds: if the message "
         "says the graph changed, it did not, and what the first synced iteration recorded is "
         "wrong. " + record + " (Note [Static graph])";
}

// Where a rank that trained its first synced iteration records it.
inline const std::string kRecordNotGraph = record_not_graph(
    "After it, finish_backward keeps the parameters its forward left unused on this rank "
    "(first_unused_: the first hook clears unused_) as static_unused_ and static_unused_here_, "
    "and the all-reduced used-map as static_used_");

// Where each rank records it when one rank joined before it (Join).
inline const std::string kShadowedRecordNotGraph = record_not_graph(
    "A rank that trained it records it in finish_backward (first_unused_ as static_unused_ "
    "and static_unused_here_, the all-reduced used-map as static_used_); a rank that joined "
    "before it, in the shadow step: static_used_ from that iteration's all-reduced used-map "
    "(the active ranks' counts), static_unused_ empty and static_unused_here_ all zeros, as "
    "it ran no forward (Note [Join])");

// Gives every static_graph case of `cases` the likely cause kRecordNotGraph.
template <typename Case>
void blame_the_record(std::vector<Case>& cases) {
  for (Case& c : cases) {
    if (c.options.static_graph) c.if_a_rank_throws = kRecordNotGraph;
  }
}

}  // namespace static_graph_cause
