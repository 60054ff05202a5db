// tp::multiprocessing::record_error: how a rank started by a launcher tells
// it why it failed (torchrun's TORCHELASTIC_ERROR_FILE, in small).
//
// Contract:
//   - When the environment names a file in TP_ERROR_FILE (tools/tprun sets
//     one per rank), record_error(e) writes there, replacing what was there:
//         line 1: the error's kind (Cause, Consequence, Stub, Timeout; a
//                 non-tp exception is a Cause) and the steady-clock time in
//                 ns when it was thrown (tp::Error::time_ns(); for others,
//                 now), separated by a space;
//         rest:   the message.
//     The launcher blames the rank that failed first by kind, then by time,
//     as spawn() does for its children (Note [Which rank failed first] in
//     spawn.cc): a rank that lost its peer does not hide the peer's fault.
//   - Without TP_ERROR_FILE it does nothing. It never throws: it runs in a
//     rank's last catch block; a file it cannot write is skipped (the
//     launcher then has the rank's stderr).
#pragma once

#include <exception>

namespace tp::multiprocessing {

void record_error(const std::exception& error);

}  // namespace tp::multiprocessing
