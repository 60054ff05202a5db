// tensorplay errors: one exception hierarchy and one CHECK macro family.
//
// Contract:
//   - Every error the kit raises derives from tp::Error (a std::runtime_error),
//     so a caller can catch the whole family in one place.
//   - A message names the function, the rank when there is one, the cause and
//     the fix: "tp::matmul: shapes (3, 4) and (5, 2) cannot be multiplied;
//     the inner sizes 4 and 5 must match."
//   - Every tp::Error carries a kind() (what the failure means when several
//     ranks fail together) and a time_ns(): the steady clock at construction,
//     i.e. at the throw, not when a handler catches it after unwinding.
//     tp::multiprocessing::spawn blames a failed job's rank by these two,
//     never by message text. Both are fixed at construction and survive
//     copies, rethrows through std::exception_ptr and slicing to tp::Error.
//   - Cheap to copy: a shared message (std::runtime_error's), an enum and an
//     integer.
//   - TP_CHECK* macros append "[CHECK failed: <expr> (<lhs> vs <rhs>) at
//     file:line]" so a report from a student points at the exact line.
//   - Thread-safe: the macros only build a string and throw.
#pragma once

#include <chrono>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tp {

// What a failure says about who is to blame.
enum class ErrorKind {
  Cause,        // this rank's own failure (the default)
  Consequence,  // failed because another rank failed first: a broken connection,
                // a process group stopped by an earlier failure (tp::PeerFailedError)
  Stub,         // an exercise stub that is not filled in yet (tp::NotImplemented)
  Timeout,      // a deadline passed (tp::TimeoutError)
};

// "Cause", "Consequence", "Stub" or "Timeout": the enumerator's name.
inline const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Cause: return "Cause";
    case ErrorKind::Consequence: return "Consequence";
    case ErrorKind::Stub: return "Stub";
    case ErrorKind::Timeout: return "Timeout";
  }
  return "Cause";  // unreachable for a valid enumerator
}

namespace detail {

// Nanoseconds on the steady clock. On Linux that is CLOCK_MONOTONIC: one
// clock for every process on the machine, so times taken by different ranks
// can be compared.
inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace detail

// Base of every error the kit throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(message, ErrorKind::Cause) {}

  ErrorKind kind() const { return kind_; }
  // When this error was constructed (detail::steady_now_ns()).
  int64_t time_ns() const { return time_ns_; }

 protected:
  // For the subclasses that mean something other than a Cause.
  Error(const std::string& message, ErrorKind kind)
      : std::runtime_error(message), kind_(kind), time_ns_(detail::steady_now_ns()) {}

 private:
  ErrorKind kind_;
  int64_t time_ns_;
};

// Thrown by exercise stubs: "stage 02: Bucket::add is not implemented yet".
// Kind Stub.
class NotImplemented : public Error {
 public:
  explicit NotImplemented(const std::string& message) : Error(message, ErrorKind::Stub) {}
};

// Anything that went wrong between processes: rendezvous, collectives, spawn.
class DistributedError : public Error {
 public:
  explicit DistributedError(const std::string& message) : Error(message) {}

 protected:
  DistributedError(const std::string& message, ErrorKind kind) : Error(message, kind) {}
};

// A collective ran past its deadline. The message names the collective, its
// sequence number and the rank that was waiting. Kind Timeout. (A spawned
// job in which no rank makes progress for too long is a SpawnError whose
// kind() is Timeout.)
class TimeoutError : public DistributedError {
 public:
  explicit TimeoutError(const std::string& message)
      : DistributedError(message, ErrorKind::Timeout) {}
};

// This rank failed because another rank failed first: the connection to it
// broke, or the process group had already stopped after an earlier failure.
// Kind Consequence: spawn blames a rank with any other kind first.
class PeerFailedError : public DistributedError {
 public:
  explicit PeerFailedError(const std::string& message)
      : DistributedError(message, ErrorKind::Consequence) {}
};

namespace detail {

// Streams every argument into one string: cat("rank ", 3, " of ", 4).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

inline std::string check_suffix(const char* expr, const char* file, int line) {
  return cat(" [CHECK failed: ", expr, " at ", file, ":", line, "]");
}

template <typename A, typename B>
std::string check_op_suffix(const char* expr, const A& a, const B& b,
                            const char* file, int line) {
  return cat(" [CHECK failed: ", expr, " (", a, " vs ", b, ") at ", file, ":",
             line, "]");
}

}  // namespace detail
}  // namespace tp

// Throws ExcType with the streamed message: TP_THROW(tp::Error, "bad ", x).
#define TP_THROW(ExcType, ...) throw ExcType(::tp::detail::cat(__VA_ARGS__))

// TP_CHECK(cond, message parts...) throws tp::Error when cond is false.
#define TP_CHECK(cond, ...)                                              \
  do {                                                                   \
    if (!(cond)) {                                                       \
      throw ::tp::Error(::tp::detail::cat(__VA_ARGS__) +                 \
                        ::tp::detail::check_suffix(#cond, __FILE__, __LINE__)); \
    }                                                                    \
  } while (0)

// TP_CHECK_OP(==, a, b, message parts...) also records both values.
#define TP_CHECK_OP(op, a, b, ...)                                           \
  do {                                                                       \
    const auto& tp_check_a_ = (a);                                           \
    const auto& tp_check_b_ = (b);                                           \
    if (!(tp_check_a_ op tp_check_b_)) {                                     \
      throw ::tp::Error(::tp::detail::cat(__VA_ARGS__) +                     \
                        ::tp::detail::check_op_suffix(#a " " #op " " #b,     \
                                                      tp_check_a_, tp_check_b_, \
                                                      __FILE__, __LINE__));  \
    }                                                                        \
  } while (0)

#define TP_CHECK_EQ(a, b, ...) TP_CHECK_OP(==, a, b, __VA_ARGS__)
#define TP_CHECK_NE(a, b, ...) TP_CHECK_OP(!=, a, b, __VA_ARGS__)
#define TP_CHECK_LT(a, b, ...) TP_CHECK_OP(<, a, b, __VA_ARGS__)
#define TP_CHECK_LE(a, b, ...) TP_CHECK_OP(<=, a, b, __VA_ARGS__)
#define TP_CHECK_GT(a, b, ...) TP_CHECK_OP(>, a, b, __VA_ARGS__)
#define TP_CHECK_GE(a, b, ...) TP_CHECK_OP(>=, a, b, __VA_ARGS__)
