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

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tensorplay/cuda/runtime.h"
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

}  // namespace cuda_test
