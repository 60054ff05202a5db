// Private to libtensorplay: one rank's status, in memory its parent can read
// while the rank runs. spawn() maps one per forked rank (the "status board",
// spawn.cc); tools/tprun makes one file per rank it launches, which the rank
// maps (launched_rank.h). A rank writes its own; the parent only reads.
//
// Why shared memory: the parent needs a rank's status only when the job
// hangs or fails, and a rank must never block, or fail, on reporting it. A
// write to mapped memory cannot fail, not even on a full disk.
//
// Note [The status layout]
// tools/tprun reads RankStatus from Python (struct.unpack_from), so its
// layout is fixed here and asserted below: offsets 0 progress (uint64),
// 8 waiting (char[120]), 128 last (char[120]), 248 failed_ns (int64),
// 256 kind (char[16]), 272 error_file_problem (char[128]), 400
// waiting_shape (char[40]), 440 last_shape (char[40]); 480 bytes.
// Every string ends at its first '\0', and its last byte always stays '\0',
// so a reader never runs off the end even while the rank writes; a torn read
// shows a mangled name at worst, in an error message.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tp::multiprocessing::rank_status {

struct RankStatus {
  std::atomic<uint64_t> progress;  // bumped at every change of `waiting`, and once when a
                                   // launched rank maps its file (launched_rank.cc)
  char waiting[120];               // the collective it waits in now, "" if none
  char last[120];                  // the last collective it finished waiting in
  // The failure a launched rank recorded (record_error), for a launcher that
  // cannot read its error file; unused under spawn, whose pipes carry it.
  // `kind` is written first, then failed_ns (release): a reader that sees a
  // time sees the kind.
  std::atomic<int64_t> failed_ns;  // the error's steady-clock time; 0: none
  char kind[16];                   // "Cause", "Consequence", "Stub", "Timeout"
  char error_file_problem[128];    // why TP_ERROR_FILE could not be written, "" if it was
  // What `waiting` and `last` carry (Work::shape: "1733 float32"), so that
  // two ranks' collectives of one number and name that differ in size show.
  char waiting_shape[40];
  char last_shape[40];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int64_t>::is_always_lock_free,
              "a status is shared between processes: its counters must be lock-free");
static_assert(offsetof(RankStatus, waiting) == 8 && offsetof(RankStatus, last) == 128 &&
                  offsetof(RankStatus, failed_ns) == 248 && offsetof(RankStatus, kind) == 256 &&
                  offsetof(RankStatus, error_file_problem) == 272 &&
                  offsetof(RankStatus, waiting_shape) == 400 &&
                  offsetof(RankStatus, last_shape) == 440 && sizeof(RankStatus) == 480,
              "tools/tprun reads this layout (Note [The status layout])");

// `text`, cut to fit, always '\0'-terminated.
template <std::size_t N>
void copy_into(char (&field)[N], std::string_view text) {
  const std::size_t n = text.size() < N - 1 ? text.size() : N - 1;
  text.copy(field, n);
  field[n] = '\0';
}

// The rank now waits in `collective` ("allreduce #3"), which carries
// `shape` ("1733 float32"); "" when the wait ends, which makes the
// collective it waited in its last.
void set_waiting(RankStatus& status, std::string_view collective, std::string_view shape = "");

// What the rank is doing, from its status and the kernel's state of `pid`
// (-1: not looked up, the rank has ended): "waiting in allreduce #3", "not
// in a collective (last: allreduce #2)", "stopped (SIGSTOP), waiting in
// broadcast #1"...
std::string describe(const RankStatus& status, pid_t pid);

// The last collective the rank finished waiting in ("allreduce #2"), or "",
// and what it carried ("1733 float32"), or "".
std::string last_collective(const RankStatus& status);
std::string last_shape(const RankStatus& status);
// What the collective the rank waits in now carries, or "".
std::string waiting_shape(const RankStatus& status);

// Given each rank's last collective ("allreduce #2", "" for none) and what
// it carried (`shapes`, "" where unknown), a line naming the ranks whose
// collectives of one number differ, e.g. "\n  the ranks issued different
// collectives as #2: barrier on rank 0, allreduce on rank 1; ...", or, where
// only the sizes differ, "allreduce of 3 float32 on rank 0, allreduce of 4
// float32 on rank 1"; "" when none do. Gloo pairs a collective by its
// number and what it is, sizes included (Note [Gloo tags]), so such ranks
// wait for each other until their timeout, each in its own collective.
std::string different_collectives(const std::vector<std::string>& lasts,
                                  const std::vector<std::string>& shapes);

// When rank `blamed` only timed out or lost its peer: the rank the others'
// `statuses` (as spawn words them: "stopped (SIGSTOP), ...", "not in a
// collective (...)", "waiting in ...", "had returned (...)", "failed too")
// and `issued` (what each rank issued last: the collective it waits in, else
// the last it finished; `shapes`, what that carried) single out as the
// cause, e.g. "rank 1 is the likely cause: it issued barrier as #3 where
// ranks 0 and 2 issued allreduce" (or "allreduce of 4 float32 as #3 where
// ranks 0 and 2 issued allreduce of 3 float32"), or "". The one rank
// stopped; the one rank that issued another collective (or one of another
// size) under a number at least two others agree on; the one rank outside any collective,
// or returned, while every other waited in one of the job's own (a
// subgroup's wait, "(group rank N)", is not a wait for `blamed`). Two ranks
// that disagree single out neither. tools/tprun's likely_cause says the
// same, in the same words, for launched ranks.
std::string likely_cause(const std::vector<std::string>& statuses,
                         const std::vector<std::string>& issued,
                         const std::vector<std::string>& shapes, int blamed);

// When a rank's own error names another as the likely cause (a rank that
// found the collective counts differ: "rank 1 is the likely cause: by the
// end of step 2 it had issued 8 collectives ..."), that sentence, up to its
// first ". " or line end; "" when the message names none. spawn and tprun
// lead their report with it, as with likely_cause.
std::string cause_named_in(const std::string& message);

// The state letter of /proc/<pid>/stat: 'T' stopped (SIGSTOP, SIGTSTP), 't'
// stopped by a debugger, 'R' running, 'S' sleeping...; '?' if unreadable.
char process_state(pid_t pid);

}  // namespace tp::multiprocessing::rank_status
