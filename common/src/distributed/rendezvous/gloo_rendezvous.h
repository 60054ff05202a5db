// Private to libtensorplay: how the ranks of a ProcessGroupGloo meet and
// connect, in two steps (Note [Rendezvous in two steps] in
// gloo_rendezvous.cc): over file://, markers in the rendezvous directory
// first, so that a missing rank or a disagreement is named before Gloo sees
// the directory; then, for every rendezvous, Gloo's full mesh of TCP pairs
// and one barrier. Run by the group's constructors on the constructing
// thread, before the communication thread exists.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/device.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace tp::distributed::detail {

// Step 1 over file://: drops this rank's marker (holding `size`) in `dir`
// and returns once every rank of `size` has dropped its own. Throws
// tp::DistributedError when the directory already holds this rank's marker
// (reused, or two processes given one rank), when a marker says another
// world size, when a marker cannot be written (a full disk named as such),
// or when some rank has not arrived within `timeout` (listing who did and
// who did not). REQUIRES: `dir` passed prepare_rendezvous_dir.
void wait_for_all_ranks(const std::string& dir, int rank, int size,
                        std::chrono::milliseconds timeout);

// Turns a failure to connect into the message to throw.
using ExplainFailure = std::function<std::string(const std::exception&)>;

// Step 2: connects a full mesh of Gloo pairs on `device` through `store` and
// returns once every rank has (a barrier with tag make_tag(0, {}), which is
// no collective of the group). A failure is thrown with explain(failure) as
// its message; the type says whom to blame: tp::TimeoutError when Gloo
// timed out, tp::PeerFailedError when a connection broke (another rank left
// first), tp::DistributedError otherwise. A tp::DistributedError from the
// store passes unchanged: it already says what happened.
std::shared_ptr<gloo::Context> connect_mesh(gloo::rendezvous::Store& store,
                                            std::shared_ptr<gloo::transport::Device>& device,
                                            int rank, int size, std::chrono::milliseconds timeout,
                                            const ExplainFailure& explain);

// Whether a Gloo error's message speaks of a timeout: a gloo::IoException
// says so only in words. Also how the communication thread tells a
// collective that timed out from one whose connection broke.
bool mentions_timeout(const std::string& message);

}  // namespace tp::distributed::detail
