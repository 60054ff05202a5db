// What a launched rank tells its launcher (launched_rank.h): its status, in
// the file TP_STATUS_FILE names, and its failure, in TP_ERROR_FILE.
#include "tensorplay/multiprocessing/launched_rank.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "rank_status.h"
#include "tensorplay/distributed/work.h"
#include "tensorplay/error.h"

namespace tp::multiprocessing {

namespace {

using rank_status::RankStatus;

// This process's status in the launcher's file; null until
// report_to_launcher() maps it.
RankStatus* g_status = nullptr;
// This rank's number in the job (RANK); -1 if unset.
int g_rank = -1;

// The wait listener of a launched rank: the same status text as spawn's
// ranks show ("allreduce #3"), written into the mapped file. A fixed buffer,
// not a std::string: no allocation on the waiting thread.
void report_wait(const distributed::WaitedCollective& what, bool waiting) {
  if (g_status == nullptr) return;
  if (!waiting) {
    rank_status::set_waiting(*g_status, "");
    return;
  }
  char text[sizeof g_status->waiting];
  if (g_rank >= 0 && what.rank != g_rank) {  // a subgroup: its numbers are its own
    std::snprintf(text, sizeof text, "%s #%llu (group rank %d)", what.collective.c_str(),
                  static_cast<unsigned long long>(what.seq), what.rank);
  } else {
    std::snprintf(text, sizeof text, "%s #%llu", what.collective.c_str(),
                  static_cast<unsigned long long>(what.seq));
  }
  rank_status::set_waiting(*g_status, text, what.shape);
}

}  // namespace

void report_to_launcher() {
  const char* path = std::getenv("TP_STATUS_FILE");
  if (path == nullptr || *path == '\0' || g_status != nullptr) return;
  const auto skip = [path](const std::string& why) {
    std::fprintf(stderr,
                 "tp::multiprocessing::report_to_launcher: cannot use TP_STATUS_FILE=%s (%s); "
                 "this rank runs on, but its launcher will not see where it waits\n",
                 path, why.c_str());
  };
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    skip(std::strerror(errno));
    return;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(RankStatus))) {
    ::close(fd);
    skip("it is smaller than a status, " + std::to_string(sizeof(RankStatus)) + " bytes");
    return;
  }
  void* mapped = ::mmap(nullptr, sizeof(RankStatus), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays
  if (mapped == MAP_FAILED) {
    skip(std::strerror(err));
    return;
  }
  g_status = static_cast<RankStatus*>(mapped);
  // Progress 1 before any wait: the launcher tells "reports, has not waited
  // yet" from "never reported" (a program that does not call this).
  g_status->progress.fetch_add(1, std::memory_order_relaxed);
  const char* rank = std::getenv("RANK");
  g_rank = rank != nullptr ? std::atoi(rank) : -1;
  distributed::set_wait_listener(&report_wait);
}

void record_error(const std::exception& error) {
  const char* path = std::getenv("TP_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  ErrorKind kind = ErrorKind::Cause;
  int64_t time_ns = tp::detail::steady_now_ns();
  if (const auto* tp_error = dynamic_cast<const Error*>(&error)) {
    kind = tp_error->kind();
    time_ns = tp_error->time_ns();
  }
  // Into the error file: a write error can hide in fopen, in fprintf or only
  // in fclose (a full disk shows when the buffer is flushed).
  std::string problem;
  if (std::FILE* f = std::fopen(path, "w"); f == nullptr) {
    problem = std::strerror(errno);
  } else {
    const bool written = std::fprintf(f, "%s %lld\n%s\n", to_string(kind),
                                      static_cast<long long>(time_ns), error.what()) >= 0;
    const int write_errno = errno;
    if (std::fclose(f) != 0 || !written) problem = std::strerror(written ? errno : write_errno);
  }
  if (g_status != nullptr) {
    rank_status::copy_into(g_status->kind, to_string(kind));
    rank_status::copy_into(g_status->error_file_problem, problem);
    g_status->failed_ns.store(time_ns, std::memory_order_release);
  }
}

}  // namespace tp::multiprocessing
