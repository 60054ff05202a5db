// What a rank's own error means in a static_graph case whose model takes
// the same route in every iteration. Shared by checkers 06 to 09, whose
// stages carry static_graph (Note [Static graph] in their ddp.cc).
//
// A stage checks static_graph's promise itself and throws when it breaks
// ("the graph changed, or the record of the first iteration is not what it
// found"). The rank cannot tell which; the checker can: in these cases the
// graph never changes, so such an error blames the record the student's
// finish_backward kept, not the model.
#pragma once

#include <string>
#include <vector>

namespace static_graph_cause {

inline const std::string kRecordNotGraph =
    "a rank failed: its message above says why. This case's model takes the same route in "
    "every iteration on each rank, so static_graph's promise holds: if the message says the "
    "graph changed, it did not; what the first synced iteration recorded is wrong. After it, "
    "keep the parameters its forward left unused on this rank (first_unused_: the first hook "
    "clears unused_) as static_unused_ and static_unused_here_, and the all-reduced used-map "
    "as static_used_ (Note [Static graph])";

// Gives every static_graph case of `cases` that likely cause.
template <typename Case>
void blame_the_record(std::vector<Case>& cases) {
  for (Case& c : cases) {
    if (c.options.static_graph) c.if_a_rank_throws = kRecordNotGraph;
  }
}

}  // namespace static_graph_cause
