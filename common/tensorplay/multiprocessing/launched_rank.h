// tp::multiprocessing: what a rank started by a launcher (tools/tprun) tells
// it. spawn() forks its ranks and hears from them through pipes and a status
// board (spawn.h); a launcher sees its ranks only from outside (exit status,
// stderr), so it names two files in each rank's environment:
//
//   TP_STATUS_FILE  what the rank is doing: report_to_launcher() maps it, and
//                   from then on every wait in a collective shows there
//                   ("waiting in allreduce #3", "not in a collective (last:
//                   allreduce #2)"), as on spawn's board. When a collective
//                   times out, tprun reads the other ranks' statuses, and
//                   their process states (stopped, running), to say which
//                   rank was not in it.
//   TP_ERROR_FILE   why it failed (torchrun's TORCHELASTIC_ERROR_FILE, in
//                   small): record_error(e) writes there.
//
// Contract:
//   - report_to_launcher(): when TP_STATUS_FILE names a file of the status's
//     size (tprun makes it), maps it and sets this process's wait listener
//     (set_wait_listener, distributed/work.h) to write there. Without
//     TP_STATUS_FILE it does nothing. A file it cannot map is skipped with one
//     line on stderr saying why: the rank runs on, its launcher just knows
//     less. Call it once, at the start of the rank, before its first
//     collective; not inside a spawned rank (spawn sets its own listener).
//   - record_error(e): when TP_ERROR_FILE is set, writes there, replacing
//     what was there:
//         line 1: the error's kind (Cause, Consequence, Stub, Timeout; a
//                 non-tp exception is a Cause) and the steady-clock time in
//                 ns when it was thrown (tp::Error::time_ns(); for others,
//                 now), separated by a space;
//         rest:   the message.
//     When the status file is mapped, the kind and time go there too, and,
//     when the error file cannot be written (a full disk, a read-only folder,
//     a directory in its place), why not: the launcher then still blames by
//     kind and time, and says the file could not be written. The launcher
//     blames the rank that failed first by kind, then by time, as spawn()
//     does for its children (Note [Which rank failed first] in spawn.cc): a
//     rank that lost its peer does not hide the peer's fault. Without
//     TP_ERROR_FILE it does nothing. It never throws: it runs in a rank's
//     last catch block.
//   - Both are for the rank's main thread; neither allocates in the wait
//     listener, which any thread waiting on a collective may run.
#pragma once

#include <exception>

namespace tp::multiprocessing {

void report_to_launcher();

void record_error(const std::exception& error);

}  // namespace tp::multiprocessing
