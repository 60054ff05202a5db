// tp::trace::DeviceSpan: timeline spans of GPU work, timed by CUDA events.
//
// A host span (trace.h) measures when the host *queued* work; on a GPU that
// says little, since a kernel or an NCCL all-reduce runs later, on its
// stream. A DeviceSpan records a timing event on a stream at construction
// and another at destruction: it spans the work queued on that stream in
// between, as the GPU ran it. device_events() turns the finished spans into
// trace Events on rows of their own ("gpu-compute-stream",
// "gpu-communication-stream"), on the same clock as the host spans, so Perfetto
// and render_ascii show backward kernels and all-reduces side by side.
//
// Contract:
//   - Records only while tracing is on (trace::enabled()) and a GPU is
//     usable (cuda::is_available()); otherwise construction and destruction
//     do nothing and touch no CUDA API. Open one only around work queued on
//     a CUDA stream: on a GPU machine a span opened by CPU-only code would
//     time the default stream's (empty) work.
//   - Names are "gpu <what>" ("gpu backward", "gpu allreduce") and the
//     category is "cuda": the checkers' trace predicates, which read the
//     host spans "backward" and "allreduce", never mistake one for the other.
//   - device_events() blocks until every recorded span's end event has
//     completed, converts them (microseconds since trace::enable(), like host
//     spans), forgets them and returns them. The clock is tied to the host's
//     by one event recorded on an idle stream and waited for at the first
//     span after enable(): good to a few microseconds, enough to see overlap.
//     Their begin_order/end_order are 0: device spans have no place in the
//     host's total order.
//   - Thread-safe: any thread may open and close DeviceSpans (the NCCL
//     group's issuing thread, the Gloo group's communication thread).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tensorplay/cuda/runtime.h"
#include "tensorplay/trace.h"

namespace tp::trace {

class DeviceSpan {
 public:
  // `row` names the stream's timeline row ("compute stream"). With `when`
  // false it records nothing (a CPU run of code that also runs on a GPU).
  DeviceSpan(const char* name, const cuda::Stream& stream, const char* row,
             std::initializer_list<Arg> args = {}, bool when = true);
  ~DeviceSpan();
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;

 private:
  int64_t index_ = -1;  // id of its pending entry; -1: not recording
  cuda::Stream stream_;
};

// The finished device spans since the last call (see the contract).
std::vector<Event> device_events();

}  // namespace tp::trace
