// Helpers for the CUDA test executables (test_nccl, test_gloo_cuda), which
// have their own main(): they skip (exit code 77, Meson's SKIP) with a
// message when no CUDA device is usable.
//
// Note [No CUDA in the parent]
// spawn() forks its ranks, and CUDA cannot be used in a child forked after
// the parent initialised CUDA (every call fails with "initialization
// error"). tp::cuda::is_available() is safe (it asks in a child of its own:
// Note [Asking in a child] in common/src/cuda/runtime.cc), but anything
// that makes a CUDA tensor, stream or event is not. So the test process
// itself never uses CUDA: it asks a spawned rank whether CUDA works, and
// every case that uses CUDA runs in spawned ranks, even with one rank.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/error.h"
#include "tensorplay/tensor.h"
#include "tensorplay/multiprocessing/spawn.h"

namespace cuda_test {

// What a spawned rank found: the number of usable devices, and why none.
struct Probe {
  int devices = 0;
  std::string reason;
};

inline Probe probe() {
  // Built without CUDA: nothing to initialise, and nothing to fork for.
  if (!tp::cuda::is_built()) return Probe{0, tp::cuda::unavailable_reason()};
  const std::string answer = tp::multiprocessing::spawn(
      [](int) {
        return tp::cuda::is_available() ? std::to_string(tp::cuda::device_count())
                                        : "0 " + tp::cuda::unavailable_reason();
      },
      1)[0];
  Probe p;
  p.devices = std::stoi(answer);
  if (p.devices == 0) p.reason = answer.substr(answer.find(' ') + 1);
  return p;
}

// The number of usable devices, as main() found it.
inline int g_devices = 0;
inline int devices() { return g_devices; }

// main() of a CUDA test executable named `name`.
inline int main(const char* name, int argc, char** argv) {
  const Probe p = probe();
  if (p.devices == 0) {
    std::printf("SKIP: %s: no GPU here: %s\n", name, p.reason.c_str());
    return 77;
  }
  g_devices = p.devices;
  doctest::Context context(argc, argv);
  return context.run();
}

// "[1.000000, 2.000000]", for messages.
inline std::string join(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + "]";
}

// t's values as the caller's current stream sees them, compared exactly:
// cpu() copies on the current stream and waits for that stream only, never
// for the device, so a result not ordered before that stream shows as a
// wrong value. Throws tp::Error naming `what` and the spawned rank.
inline void expect_values(const tp::Tensor& t, const std::vector<double>& expected,
                          const std::string& what) {
  const std::vector<double> got = t.cpu().to_vector();
  if (got != expected) {
    throw tp::Error(what + " on rank " + std::to_string(tp::multiprocessing::current_rank()) +
                    ": expected " + join(expected) + ", got " + join(got));
  }
}

}  // namespace cuda_test
