// record_error: a failing rank's kind, time and message for its launcher.
#include "tensorplay/multiprocessing/error_file.h"

#include <cstdio>
#include <cstdlib>

#include "tensorplay/error.h"

namespace tp::multiprocessing {

void record_error(const std::exception& error) {
  const char* path = std::getenv("TP_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  ErrorKind kind = ErrorKind::Cause;
  int64_t time_ns = detail::steady_now_ns();
  if (const auto* tp_error = dynamic_cast<const Error*>(&error)) {
    kind = tp_error->kind();
    time_ns = tp_error->time_ns();
  }
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  std::fprintf(f, "%s %lld\n%s\n", to_string(kind), static_cast<long long>(time_ns),
               error.what());
  std::fclose(f);
}

}  // namespace tp::multiprocessing
