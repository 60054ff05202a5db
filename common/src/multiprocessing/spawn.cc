// tp::multiprocessing::spawn: fork the ranks, watch them, join them.
//
// How the parent learns what happened to each rank:
//   - A pipe per rank carries the rank's report, written just before the
//     child exits: "ok\n" + payload, or "error <time_ns> <kind>\n" + message,
//     where time_ns and kind are the exception's tp::Error::time_ns() and
//     tp::ErrorKind ("Cause", "Consequence", "Stub", "Timeout"), e.g.
//     "error 81234567890 Consequence\ntp::PeerFailedError: allreduce #1 ...".
//   - waitpid() tells how the process ended: exit code or signal.
//   - A "status board", one anonymous MAP_SHARED mapping made before the
//     fork with a fixed slot per rank, holds the collective each rank waits
//     in now ("allreduce #3"), the last one it finished waiting in, and a
//     progress counter bumped at every change. Shared memory, not a pipe,
//     because the parent needs the statuses only when a job hangs or a
//     collective times out, and a rank must never block on reporting them.
//     The counters tell a slow job from a stuck one (Note [Progress, not a
//     deadline]).
//
// The parent polls the pipes and reaps with waitpid(WNOHANG) in one loop,
// so a rank writing a large payload is always being read (a full pipe would
// otherwise block it forever) and a crashed rank is noticed within a tick.
//
// Note [Interrupted jobs]
// Ctrl-C sends SIGINT to the whole foreground process group, `kill` sends
// SIGTERM to one process (./kit's, which is the demo's: ./kit execs it). A
// parent ended by the signal's default action would leave the job's
// rendezvous directory behind, and its ranks would die only by their
// PR_SET_PDEATHSIG. So while spawn runs, the parent catches SIGINT, SIGTERM
// and SIGHUP (InterruptGuard): the handler only records the signal; the join
// loop sees it within a tick, kills the ranks and reaps them, removes the
// process's temporary directories (TempDir::remove_all_live: no destructor
// runs in a process ended by a signal) and re-raises the signal with the
// previous disposition, so the process ends as the signal meant (exit status
// 128 + N to a shell) and a handler installed before spawn (doctest's) still
// runs. A signal the caller ignores (nohup's SIGHUP) stays ignored.
#include "tensorplay/multiprocessing/spawn.h"

#include <cblas.h>  // openblas_set_num_threads (OpenBLAS extension)
#include <cxxabi.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "rank_status.h"
#include "tensorplay/distributed/work.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::multiprocessing {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using rank_status::RankStatus;
// How often the parent looks at the children when no pipe has data.
constexpr milliseconds kTick{10};
// The longest wait for a failure's cause when only consequences have come
// (Note [Which rank failed first]).
constexpr milliseconds kCauseWait{5000};

// Set in a child right after fork; stay null / -1 in the parent.
RankStatus* g_status_board = nullptr;
int g_current_rank = -1;

// The signal that interrupted the job, 0 if none (Note [Interrupted jobs]).
volatile std::sig_atomic_t g_interrupt = 0;

extern "C" void record_interrupt(int sig) { g_interrupt = sig; }

// Catches SIGINT, SIGTERM and SIGHUP for the lifetime of one spawn() call
// and, once the ranks are ended, turns a caught one back into the signal
// (Note [Interrupted jobs]). Not reentrant, like spawn itself.
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupt = 0;
    for (std::size_t i = 0; i < kSignals.size(); ++i) {
      struct sigaction current {};
      ::sigaction(kSignals[i], nullptr, &current);
      if (current.sa_handler == SIG_IGN && (current.sa_flags & SA_SIGINFO) == 0) continue;
      struct sigaction catcher {};
      catcher.sa_handler = record_interrupt;
      sigemptyset(&catcher.sa_mask);
      installed_[i] = ::sigaction(kSignals[i], &catcher, &previous_[i]) == 0;
    }
  }

  // A signal that came after the job ended (the ranks are reaped by now)
  // still ends the process.
  ~InterruptGuard() {
    if (g_interrupt != 0) reraise();
    restore();
  }

  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // Call once no rank is left: removes the temporary directories, restores
  // the previous dispositions and raises the caught signal. Returns only if
  // a previous handler returned; the caller then throws.
  void reraise() {
    const int sig = g_interrupt;
    g_interrupt = 0;
    restore();
    TempDir::remove_all_live();
    std::fflush(nullptr);
    ::raise(sig);
  }

 private:
  void restore() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) {
      if (installed_[i]) ::sigaction(kSignals[i], &previous_[i], nullptr);
      installed_[i] = false;
    }
  }

  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> previous_{};
  std::array<bool, 3> installed_{};
};

// Nanoseconds on the steady clock, the clock of tp::Error::time_ns(): on
// Linux CLOCK_MONOTONIC, one clock for every process on the machine, so times
// from different ranks can be compared (see Note [Which rank failed first]).
int64_t now_ns() { return tp::detail::steady_now_ns(); }

std::string demangle(const char* mangled) {
  int status = 0;
  char* name = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string result = (status == 0 && name != nullptr) ? name : mangled;
  std::free(name);
  return result;
}

// "tp::TimeoutError: allreduce #3 on rank 2 timed out ...": the dynamic type
// tells a TimeoutError from a shape error at a glance.
std::string describe(const std::exception& e) {
  return demangle(typeid(e).name()) + ": " + e.what();
}

// write(2) until every byte is out; a report is lost only if the parent is
// gone, and then nobody is left to read it anyway.
void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<std::size_t>(n);
  }
}

// A rank starts with default signal handling: the parent (doctest, for one)
// may have installed crash handlers that would print a report from inside
// the child. With default handling a crash reaches the parent as "killed by
// signal N" and is reported once, there. SIGPIPE is the exception: it is
// ignored, as Python does, because Gloo writes to sockets with writev(), and
// a write to a rank that has already gone must become an error naming the
// collective ("connection to another rank broke"), not a silent kill of the
// rank that was still healthy.
void reset_signal_handling() {
  for (int sig = 1; sig < SIGRTMIN; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0) continue;
    const bool has_handler = (current.sa_flags & SA_SIGINFO) != 0 ||
                             (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
    if (has_handler) ::signal(sig, SIG_DFL);
  }
  ::signal(SIGPIPE, SIG_IGN);
  // spawn blocked every signal around fork (see Job::start); unblock them
  // now that no inherited handler is left to run.
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// The wait listener of a spawned rank (distributed/work.h): every wait in a
// collective is progress to the watch (Note [Progress, not a deadline]), and
// while it lasts the board shows "allreduce #3", the first clue, when a job
// hangs or a collective times out, to which collective a rank skipped. A
// wait that finds the work done already counts too, and its collective
// becomes the rank's last.
void report_wait(const distributed::WaitedCollective& what, bool waiting) {
  if (!waiting) {
    set_rank_waiting("");
    return;
  }
  std::string status = what.collective + " #" + std::to_string(what.seq);
  if (what.rank != g_current_rank) {
    status += " (group rank " + std::to_string(what.rank) + ")";  // a subgroup
  }
  set_rank_waiting(status, what.shape);
}

// The body of a child process. Never returns: returning would continue the
// parent's code (its main, its test runner) in the child.
[[noreturn]] void run_child(const RankFn& fn, int rank, int report_fd,
                            pid_t parent, const SpawnOptions& options) {
  // If the parent dies (killed, crashed), the kernel kills this rank too, so
  // no orphan keeps waiting in a collective. (Strictly, the signal fires when
  // the thread that forked exits; spawn runs on the parent's main thread.)
  // The getppid() check closes the race where the parent died before prctl().
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);

  reset_signal_handling();

  g_current_rank = rank;
  // Every wait in a collective shows on the status board (report_wait).
  distributed::set_wait_listener(&report_wait);
  // Ranks share the machine's cores; one OpenBLAS thread each by default so
  // W ranks do not oversubscribe the CPU W times over.
  openblas_set_num_threads(options.blas_threads);

  // A tp::Error brings the time and kind it was thrown with; anything else
  // gets the time it is caught and counts as this rank's own failure.
  const auto error_report = [](int64_t time_ns, ErrorKind kind, const std::string& message) {
    return "error " + std::to_string(time_ns) + " " + to_string(kind) + "\n" + message;
  };
  std::string report;
  int exit_code = 1;
  try {
    report = "ok\n" + fn(rank);
    exit_code = 0;
  } catch (const Error& e) {
    report = error_report(e.time_ns(), e.kind(), describe(e));
  } catch (const std::exception& e) {
    report = error_report(now_ns(), ErrorKind::Cause, describe(e));
  } catch (...) {
    report = error_report(now_ns(), ErrorKind::Cause,
                          "unknown exception (not derived from std::exception)");
  }
  write_all(report_fd, report);
  ::close(report_fd);
  std::fflush(nullptr);  // _exit skips stdio's flush; keep the rank's output
  ::_exit(exit_code);
}

// What the parent knows about one child.
struct Child {
  pid_t pid = -1;
  int fd = -1;                  // read end of the report pipe; -1 once closed
  std::string report;           // bytes read so far
  bool reaped = false;          // waitpid() returned for it
  int wait_status = 0;          // valid once reaped
  int64_t reaped_ns = 0;        // now_ns() when it was reaped; valid once reaped
  bool ended_by_spawn = false;  // still running when end_all() signalled it
};

// The outcome of a finished child, decoded from its report and exit status.
struct Outcome {
  bool ok = false;
  std::string payload;  // when ok
  // When failed: what happened, its kind and when, per Note [Which rank
  // failed first]. An exception brings its own time and kind; a signal, an
  // exit code or a missing result is a Cause at the time it was reaped.
  std::string message;
  ErrorKind kind = ErrorKind::Cause;
  int64_t failed_ns = 0;
  bool reported = false;  // the rank itself reported an exception
};

std::string signal_description(int sig) {
  const char* name = ::strsignal(sig);
  return "killed by signal " + std::to_string(sig) + " (" +
         (name != nullptr ? name : "unknown") + ")";
}

ErrorKind kind_from_name(const std::string& name) {
  for (ErrorKind kind : {ErrorKind::Consequence, ErrorKind::Stub, ErrorKind::Timeout}) {
    if (name == to_string(kind)) return kind;
  }
  return ErrorKind::Cause;
}

Outcome decode(const Child& child) {
  Outcome out;
  out.failed_ns = child.reaped_ns;
  const int st = child.wait_status;
  // A complete exception report wins over the way the process ended: a rank
  // that reported and was then ended by spawn's SIGTERM still failed as it said.
  const std::string& r = child.report;
  const std::size_t newline = r.find('\n');
  if (newline != std::string::npos && r.compare(0, 6, "error ") == 0) {
    // "error <time_ns> <kind>\n<message>"
    std::istringstream header(r.substr(6, newline - 6));
    int64_t time_ns = 0;
    std::string kind;
    if (header >> time_ns >> kind) {
      out.failed_ns = time_ns;
      out.kind = kind_from_name(kind);
    }
    out.message = r.substr(newline + 1);
    out.reported = true;
    return out;
  }
  if (WIFSIGNALED(st)) {
    out.message = signal_description(WTERMSIG(st));
    return out;
  }
  const int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (code != 0) {
    out.message = "exited with code " + std::to_string(code);
    return out;
  }
  if (r.compare(0, 3, "ok\n") == 0) {
    out.ok = true;
    out.payload = r.substr(3);
    return out;
  }
  // Exit code 0 but no report: something ended the process before fn
  // returned, almost always a call to exit() inside fn.
  out.message = "exited without reporting a result (did fn call exit()?)";
  return out;
}

// All the resources of one spawn() call. The destructor is the safety net
// for early exits (fork failure, an exception in the parent): no child
// outlives spawn(), no descriptor or mapping leaks.
class Job {
 public:
  Job(int nprocs, const SpawnOptions& options, InterruptGuard& interrupts)
      : options_(options), interrupts_(interrupts), children_(static_cast<std::size_t>(nprocs)) {
    const std::size_t bytes = sizeof(RankStatus) * static_cast<std::size_t>(nprocs);
    void* board = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (board == MAP_FAILED) {
      const int err = errno;
      throw SpawnError(-1, detail::cat("tp::multiprocessing::spawn: cannot map the status board (",
                                       std::strerror(err), ")"));
    }
    std::memset(board, 0, bytes);  // every status starts empty, every counter at 0
    board_ = static_cast<RankStatus*>(board);
    board_bytes_ = bytes;
  }

  ~Job() {
    for (Child& c : children_) {
      if (c.pid > 0 && !c.reaped) {
        ::kill(c.pid, SIGKILL);
        while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      if (c.fd >= 0) ::close(c.fd);
    }
    if (board_ != nullptr) ::munmap(board_, board_bytes_);
  }

  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  void start(const RankFn& fn);
  std::vector<std::string> join();

 private:
  int nprocs() const { return static_cast<int>(children_.size()); }
  std::string status_of(int rank) const;
  uint64_t progress() const;
  std::string others_when_failed(int blamed) const;
  void read_pipes(milliseconds wait);
  bool drain(Child& c);
  bool any_alive() const {
    return std::any_of(children_.begin(), children_.end(),
                       [](const Child& c) { return !c.reaped; });
  }
  bool reap_finished();
  void end_all();
  [[noreturn]] void throw_timeout();
  [[noreturn]] void throw_failure();
  void throw_if_interrupted();

  // The pieces of throw_failure(). What each rank was seen doing when a
  // rank failed, rank by rank: a status ("waiting in allreduce #3", "had
  // returned", "failed too"), the last collective it finished and its
  // size, and the size of the one it waits in.
  struct Sightings {
    std::vector<std::string> statuses, lasts, last_shapes, waiting_shapes;
  };
  // Gives the other ranks a moment to fail too (at most kCauseWait; less
  // once a failure other than a consequence is in), so the cause is among
  // the failures weighed.
  void settle_after_failure();
  Sightings look_at_ranks() const;
  // The failed rank to blame (blamed_before), and its outcome; -1 if none.
  int blame(Outcome& outcome) const;
  // `message` for a collective that timed out or a lost peer, with where
  // the others were and, when it can be told, the likely cause first.
  std::string explain_wait(const Sightings& seen, int blamed, std::string message) const;

  const SpawnOptions options_;
  InterruptGuard& interrupts_;
  std::vector<Child> children_;
  RankStatus* board_ = nullptr;
  std::size_t board_bytes_ = 0;
};

void Job::start(const RankFn& fn) {
  // Anything buffered in stdio now would be flushed by every child too.
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  // Block every signal while forking. A child must not run a handler it
  // inherited (doctest's, say) before run_child() has reset them; a SIGTERM
  // from spawn that lands in that window stays pending until the child
  // unblocks it with default handling in place, and then ends the child.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  struct RestoreMask {
    sigset_t mask;
    ~RestoreMask() { ::pthread_sigmask(SIG_SETMASK, &mask, nullptr); }
  } restore{previous};
  for (int rank = 0; rank < nprocs(); ++rank) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      const int err = errno;
      throw SpawnError(rank, detail::cat("tp::multiprocessing::spawn: cannot create the report pipe for rank ",
                                         rank, " (", std::strerror(err), ")"));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      throw SpawnError(rank, detail::cat("tp::multiprocessing::spawn: fork failed for rank ", rank,
                                         " (", std::strerror(err),
                                         "); lower nprocs or raise the process limit"));
    }
    if (pid == 0) {
      // Child: keep only its own write end; the read ends belong to the parent.
      ::close(fds[0]);
      for (int other = 0; other < rank; ++other) ::close(children_[other].fd);
      g_status_board = board_;
      run_child(fn, rank, fds[1], parent, options_);
    }
    ::close(fds[1]);
    // Non-blocking, so draining a pipe stops when it is empty instead of
    // waiting for a child that is still computing.
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    children_[rank].pid = pid;
    children_[rank].fd = fds[0];
  }
}

// What a rank is doing, from the board and the kernel: "waiting in
// allreduce #3", "not in a collective (last: allreduce #2)", "stopped
// (SIGSTOP or a debugger) while waiting in broadcast #1"...
std::string Job::status_of(int rank) const {
  const Child& c = children_[rank];
  return rank_status::describe(board_[rank], c.reaped ? -1 : c.pid);
}

// The sum of every rank's progress counter and of the ranks that ended.
uint64_t Job::progress() const {
  uint64_t sum = 0;
  for (int rank = 0; rank < nprocs(); ++rank) {
    sum += board_[rank].progress.load(std::memory_order_relaxed);
    if (children_[rank].reaped) ++sum;
  }
  return sum;
}

// Waits up to `wait` for report bytes, then reads whatever is there.
void Job::read_pipes(milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<Child*> owners;
  for (Child& c : children_) {
    if (c.fd >= 0) {
      fds.push_back(pollfd{c.fd, POLLIN, 0});
      owners.push_back(&c);
    }
  }
  // With no pipe open, poll() is just a sleep of one tick.
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (n <= 0) return;  // timeout, or EINTR: the caller loops anyway
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Child& c = *owners[i];
    if (drain(c)) {  // EOF: the child closed its end (it is exiting)
      ::close(c.fd);
      c.fd = -1;
    }
  }
}

// Appends whatever the child's pipe holds now to its report, without
// blocking; returns true at end of file.
bool Job::drain(Child& c) {
  char buffer[65536];
  for (;;) {
    const ssize_t got = ::read(c.fd, buffer, sizeof buffer);
    if (got > 0) {
      c.report.append(buffer, static_cast<std::size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return got == 0;  // otherwise EAGAIN: nothing more for now
  }
}

// Reaps every child that has ended; returns true if any did.
bool Job::reap_finished() {
  bool any = false;
  for (Child& c : children_) {
    if (c.reaped) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r != c.pid) continue;
    c.reaped = true;
    c.wait_status = status;
    c.reaped_ns = now_ns();
    any = true;
    // The child wrote its whole report before exiting, so it is all in the
    // pipe now; read it without waiting for EOF, which a grandchild holding
    // the write end could delay forever.
    if (c.fd >= 0) {
      drain(c);
      ::close(c.fd);
      c.fd = -1;
    }
  }
  return any;
}

// SIGTERM every live rank, give them kill_grace to go, then SIGKILL.
// Reading the pipes meanwhile lets ranks that failed at the same moment
// deliver their reports (see Note [Which rank failed first]).
void Job::end_all() {
  for (Child& c : children_) {
    if (c.reaped) continue;
    c.ended_by_spawn = true;
    ::kill(c.pid, SIGTERM);
  }
  const auto deadline = Clock::now() + options_.kill_grace;
  while (any_alive() && Clock::now() < deadline) {
    read_pipes(kTick);
    reap_finished();
  }
  for (Child& c : children_) {
    if (c.reaped) continue;
    ::kill(c.pid, SIGKILL);
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.reaped = true;
    c.wait_status = status;
    c.reaped_ns = now_ns();
  }
  reap_finished();  // drains and closes any pipe still open
}

// Note [Progress, not a deadline]
// A job is stuck when no rank makes progress, not when it runs long: a demo
// of 20000 steps takes minutes and is fine. So SpawnOptions::timeout bounds
// the time without progress: a rank starting or finishing a wait in a
// collective (set_rank_waiting) or ending. A hang in a collective ends
// sooner, by the collective's own timeout; this one catches the rest (every
// rank computing forever, a rank stopped while no peer waits on it, a
// collective with no timeout), and says what each rank was doing.
void Job::throw_timeout() {
  // Read the board before ending the ranks: it says where each one hangs.
  std::string running;
  std::string finished;
  int waiting = 0;
  int stopped = 0;
  int live = 0;
  for (int rank = 0; rank < nprocs(); ++rank) {
    const bool done = children_[rank].reaped;
    std::string& list = done ? finished : running;
    if (!list.empty()) list += ", ";
    list += "rank " + std::to_string(rank);
    if (done) continue;
    const std::string status = status_of(rank);
    list += " (" + status + ")";
    ++live;
    if (status.find("waiting in") != std::string::npos) ++waiting;
    if (status.rfind("stopped", 0) == 0) ++stopped;
  }
  end_all();
  std::string message = "tp::multiprocessing::spawn: no rank made progress for " +
                        std::to_string(options_.timeout.count()) +
                        " ms (SpawnOptions::timeout); still running: " + running;
  if (!finished.empty()) message += "; already finished: " + finished;
  message += ". ";
  Hang hang = Hang::kAllInCollective;
  if (stopped > 0) {
    hang = Hang::kRankStopped;
    message += "A stopped rank never joins a collective: continue it (kill -CONT) or end it.";
  } else if (waiting == 0) {
    hang = Hang::kNoneInCollective;
    message +=
        "No rank was in a collective: every rank was computing without end (a loop that "
        "never ends?), or waiting on something other than its peers.";
  } else if (waiting < live || !finished.empty()) {
    hang = Hang::kSomeInCollective;
    message +=
        "Ranks waiting in a collective wait for the ranks that are not in it: did those skip "
        "a collective (a rank that skipped a collective leaves the others waiting in it), or "
        "are they stuck computing?";
  } else {
    message +=
        "Every rank waited in a collective: if they wait in different ones, a rank skipped "
        "a collective or issued an extra one.";
  }
  throw SpawnError(-1, message, ErrorKind::Timeout, hang);
}

// Note [Which rank failed first]
// When one rank fails, its peers usually fail a moment later ("the connection
// to another rank broke" in the collective they were in), and the parent may
// read their reports first: the rank that caused it may still be unwinding.
// So the parent blames by what each failure is, then by when it happened:
//   1. Kind. A tp::PeerFailedError (ErrorKind::Consequence) says "another
//      rank failed first"; any other failure (Cause, Stub, Timeout) is blamed
//      before it. The kind travels in the report, so no message text is
//      matched.
//   2. Time, the earliest first. An exception's time is tp::Error::time_ns(),
//      taken when it was constructed, i.e. at the throw, on the machine-wide
//      monotonic clock: not when the rank's top-level catch ran, which comes
//      after unwinding, and unwinding may take long (destroying a process
//      group drains its queue, which can wait out a collective's timeout).
//      A non-tp exception has only the time it was caught. A rank killed by a
//      signal, exiting non-zero or exiting without a result brings no time:
//      it is a Cause at the time the parent reaped it (within a tick of the
//      end).
// Before deciding, the parent gives the other ranks a settle window
// (kill_grace, at most 500 ms) to fail on their own and report, since the
// SIGTERM that ends them would cut a report off; every failure reaped by then,
// crashes and exits included, is weighed. If by then every failure is a
// Consequence, the rank that caused them is still on its way out (a rank
// that closed its connections, then exits or crashes; on a loaded machine
// that can take longer than the window), so the window grows, up to
// kCauseWait in all, until a failure of another kind arrives or every rank
// has ended. Ranks that spawn itself ended are weighed only if they managed
// to report an exception: their signal or exit code is spawn's doing, not
// theirs. A Cause that takes longer than all that to unwind can still lose to
// its peers' Consequences; the message then says where the others were.
bool blamed_before(const Outcome& a, const Outcome& b) {
  const bool a_consequence = a.kind == ErrorKind::Consequence;
  const bool b_consequence = b.kind == ErrorKind::Consequence;
  if (a_consequence != b_consequence) return b_consequence;
  return a.failed_ns < b.failed_ns;
}

void Job::settle_after_failure() {
  const auto first = Clock::now();
  const auto settle = first + std::min(options_.kill_grace, milliseconds(500));
  const auto only_consequences = [this] {
    for (const Child& c : children_) {
      if (!c.reaped) continue;
      const Outcome o = decode(c);
      if (!o.ok && o.kind != ErrorKind::Consequence) return false;
    }
    return true;
  };
  while (any_alive()) {
    const auto now = Clock::now();
    if (now >= first + kCauseWait || (now >= settle && !only_consequences())) break;
    throw_if_interrupted();
    read_pipes(kTick);
    reap_finished();
  }
}

Job::Sightings Job::look_at_ranks() const {
  Sightings seen;
  for (int rank = 0; rank < nprocs(); ++rank) {
    seen.lasts.push_back(rank_status::last_collective(board_[rank]));
    seen.last_shapes.push_back(rank_status::last_shape(board_[rank]));
    seen.waiting_shapes.push_back(rank_status::waiting_shape(board_[rank]));
    const Child& c = children_[rank];
    if (!c.reaped) {
      seen.statuses.push_back(status_of(rank));
    } else if (decode(c).ok) {
      std::string last = status_of(rank);
      const std::size_t at = last.find(" (");
      seen.statuses.push_back("had returned" + (at == std::string::npos ? "" : last.substr(at)));
    } else {
      // Failed: weighed below; described by the collective it was last in,
      // which for a collective that timed out is that one.
      const std::string& last = seen.lasts[rank];
      seen.statuses.push_back("failed too" +
                              (last.empty() ? "" : " (last collective: " + last + ")"));
    }
  }
  return seen;
}

int Job::blame(Outcome& outcome) const {
  int blamed = -1;
  for (int rank = 0; rank < nprocs(); ++rank) {
    const Child& child = children_[rank];
    const Outcome o = decode(child);
    if (o.ok || (child.ended_by_spawn && !o.reported)) continue;
    if (blamed < 0 || blamed_before(o, outcome)) {
      blamed = rank;
      outcome = o;
    }
  }
  return blamed;
}

std::string Job::explain_wait(const Sightings& seen, int blamed, std::string message) const {
  // Which ranks were not in the collective that timed out, or where the
  // rank that broke the connection was.
  const std::vector<std::string>& statuses = seen.statuses;
  std::string others;
  bool returned = false;
  for (int rank = 0; rank < nprocs(); ++rank) {
    if (rank == blamed) continue;
    const bool verb_included = statuses[rank].rfind("had returned", 0) == 0 ||
                               statuses[rank].rfind("failed too", 0) == 0;
    others += (others.empty() ? "" : "; ") + ("rank " + std::to_string(rank) + " ") +
              (verb_included ? "" : "was ") + statuses[rank];
    returned = returned || statuses[rank].rfind("had returned", 0) == 0;
  }
  if (!others.empty()) {
    message += "\n  meanwhile: " + others;
    if (returned) {
      message +=
          "\n  a rank that returned while another waited in a collective issued fewer "
          "collectives than it: did it skip some (or did the waiting rank issue extra)?";
    }
  }
  message += rank_status::different_collectives(seen.lasts, seen.last_shapes);
  // First: the rank that failed only waited for this one. What each rank
  // issued last: the collective it waited in when it was looked at, else
  // the last it finished, and what that carried.
  std::vector<std::string> issued = seen.lasts, issued_shapes = seen.last_shapes;
  for (int rank = 0; rank < nprocs(); ++rank) {
    const std::size_t at = statuses[rank].find("waiting in ");
    if (at != std::string::npos) {
      issued[rank] = statuses[rank].substr(at + 11);
      issued_shapes[rank] = seen.waiting_shapes[rank];
    }
  }
  const std::string cause = rank_status::likely_cause(statuses, issued, issued_shapes, blamed);
  if (cause.empty()) return message;
  return "tp::multiprocessing::spawn: " + cause + "\n  " +
         message.substr(std::string("tp::multiprocessing::spawn: ").size());
}

void Job::throw_failure() {
  settle_after_failure();
  // Where the others are, read before they are ended: for a collective that
  // timed out, the rank that was not in it is the one to look at. What each
  // collective carried is read in the same pass, so that a wait that ends
  // meanwhile cannot pair one collective's name with the next one's size.
  const Sightings seen = look_at_ranks();
  end_all();
  Outcome blamed_outcome;
  const int blamed = blame(blamed_outcome);
  if (blamed < 0) {  // unreachable: the failure that led here was reaped before end_all()
    throw SpawnError(-1, "tp::multiprocessing::spawn: a rank failed but none could be blamed");
  }
  std::string message = "tp::multiprocessing::spawn: rank " + std::to_string(blamed) +
                        " failed: " + blamed_outcome.message;
  if (blamed_outcome.kind == ErrorKind::Timeout ||
      blamed_outcome.kind == ErrorKind::Consequence) {
    message = explain_wait(seen, blamed, std::move(message));
  } else if (const std::string named = rank_status::cause_named_in(blamed_outcome.message);
             !named.empty() && named.rfind("rank " + std::to_string(blamed) + " ", 0) != 0) {
    // The rank that failed found another at fault (its collective count).
    message = "tp::multiprocessing::spawn: " + named + " (rank " + std::to_string(blamed) +
              " found it)\n  " + message.substr(std::string("tp::multiprocessing::spawn: ").size());
  }
  throw SpawnError(blamed, message, blamed_outcome.kind);
}

// A caught SIGINT/SIGTERM/SIGHUP: kill and reap every rank at once (the job
// is being abandoned, so there is nothing to wait for), then end this
// process by the signal (Note [Interrupted jobs]).
void Job::throw_if_interrupted() {
  const int sig = g_interrupt;
  if (sig == 0) return;
  for (Child& c : children_) {
    if (c.reaped) continue;
    ::kill(c.pid, SIGKILL);
    while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    c.reaped = true;
  }
  interrupts_.reraise();
  throw SpawnError(-1, detail::cat("tp::multiprocessing::spawn: interrupted by signal ", sig, " (",
                                   ::strsignal(sig), "); every rank was ended"));
}

std::vector<std::string> Job::join() {
  // Note [Progress, not a deadline]: the deadline moves with every progress.
  auto deadline = Clock::now() + options_.timeout;
  uint64_t seen = progress();
  for (;;) {
    throw_if_interrupted();
    if (const uint64_t now_progress = progress(); now_progress != seen) {
      seen = now_progress;
      deadline = Clock::now() + options_.timeout;
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) throw_timeout();
    read_pipes(std::min(kTick, left));
    if (!reap_finished()) continue;
    // Which failure to blame is decided in throw_failure(), once the others
    // have had their settle window (Note [Which rank failed first]).
    bool all_done = true;
    for (const Child& c : children_) {
      if (!c.reaped) {
        all_done = false;
      } else if (!decode(c).ok) {
        throw_failure();
      }
    }
    if (all_done) break;
  }
  std::vector<std::string> payloads;
  payloads.reserve(children_.size());
  for (const Child& c : children_) payloads.push_back(decode(c).payload);
  return payloads;
}

}  // namespace

std::vector<std::string> spawn_processes(const RankFn& fn, int nprocs,
                                         const SpawnOptions& options) {
  if (g_current_rank != -1) {
    TP_THROW(Error, "tp::multiprocessing::spawn: called inside rank ", g_current_rank,
             " of a spawned job; spawn is not reentrant, start all ranks from the parent");
  }
  if (nprocs < 1) {
    TP_THROW(Error, "tp::multiprocessing::spawn: nprocs must be >= 1 (got ", nprocs,
             "); pass the number of ranks to start");
  }
  if (options.timeout.count() <= 0) {
    TP_THROW(Error, "tp::multiprocessing::spawn: SpawnOptions::timeout must be positive (got ",
             options.timeout.count(), " ms)");
  }
  if (options.kill_grace.count() < 0) {
    TP_THROW(Error, "tp::multiprocessing::spawn: SpawnOptions::kill_grace must be >= 0 (got ",
             options.kill_grace.count(), " ms)");
  }
  if (options.blas_threads < 1) {
    TP_THROW(Error, "tp::multiprocessing::spawn: SpawnOptions::blas_threads must be >= 1 (got ",
             options.blas_threads, ")");
  }
  InterruptGuard interrupts;  // before the Job: destroyed after it
  Job job(nprocs, options, interrupts);
  job.start(fn);
  return job.join();
}

void set_rank_waiting(std::string_view collective, std::string_view shape) {
  if (g_status_board == nullptr || g_current_rank < 0) return;
  rank_status::set_waiting(g_status_board[g_current_rank], collective, shape);
}

int current_rank() { return g_current_rank; }

}  // namespace tp::multiprocessing
