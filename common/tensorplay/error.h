// tensorplay errors: one exception hierarchy and one CHECK macro family.
//
// Contract:
//   - Every error the kit raises derives from tp::Error (a std::runtime_error),
//     so a caller can catch the whole family in one place.
//   - A message names the function, the rank when there is one, the cause and
//     the fix: "tp::matmul: shapes (3, 4) and (5, 2) cannot be multiplied;
//     the inner sizes 4 and 5 must match."
//   - TP_CHECK* macros append "[CHECK failed: <expr> (<lhs> vs <rhs>) at
//     file:line]" so a report from a student points at the exact line.
//   - Thread-safe: the macros only build a string and throw.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tp {

// Base of every error the kit throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown by exercise stubs: "stage 02: Bucket::add is not implemented yet".
class NotImplemented : public Error {
 public:
  using Error::Error;
};

// Anything that went wrong between processes: rendezvous, collectives, spawn.
class DistributedError : public Error {
 public:
  using Error::Error;
};

// A collective or a whole job ran past its deadline. The message names the
// collective, its sequence number and the rank that was waiting.
class TimeoutError : public DistributedError {
 public:
  using DistributedError::DistributedError;
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
