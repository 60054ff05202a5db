// tp::cuda without CUDA: the kit was configured without the `cuda` feature
// (or Meson found no nvcc). is_built() and is_available() say so; every other
// call throws with the reason, so code that asks for a CUDA tensor on such a
// build fails on the line that asked, with the fix.
#include "tensorplay/cuda/runtime.h"

#include "tensorplay/error.h"

namespace tp::cuda {

namespace {
constexpr const char* kReason =
    "tensorplay was built without CUDA (Meson found no nvcc, or the build was configured "
    "with -Dcuda=disabled); install the CUDA toolkit and reconfigure, or run on the CPU";

[[noreturn]] void unavailable(const char* fn) { TP_THROW(Error, "tp::cuda::", fn, ": ", kReason); }
}  // namespace

bool is_built() { return false; }
bool is_available() { return false; }
std::string unavailable_reason() { return kReason; }
int device_count() { return 0; }
int current_device() { unavailable("current_device"); }
void set_device(int) { unavailable("set_device"); }
void synchronize_device() { unavailable("synchronize_device"); }
std::string device_name(int) { unavailable("device_name"); }

struct Stream::Owner {};
Stream Stream::create(int) { unavailable("Stream::create"); }
StreamHandle Stream::handle() const { return nullptr; }
void Stream::wait(const Event&) const { unavailable("Stream::wait"); }
void Stream::synchronize() const { unavailable("Stream::synchronize"); }
Stream current_stream() { return Stream(); }
StreamGuard::StreamGuard(const Stream& stream) : previous_(stream) { unavailable("StreamGuard"); }
StreamGuard::~StreamGuard() = default;

struct Event::Owner {};
Event::Event(bool) { unavailable("Event"); }
EventHandle Event::handle() const { unavailable("Event::handle"); }
void Event::record(const Stream&) const { unavailable("Event::record"); }
bool Event::query() const { unavailable("Event::query"); }
void Event::synchronize() const { unavailable("Event::synchronize"); }
float Event::elapsed_ms(const Event&) const { unavailable("Event::elapsed_ms"); }

Allocation allocate(std::size_t) { unavailable("allocate"); }
void deallocate(const Allocation&) noexcept {}
std::shared_ptr<void> allocate_pinned(std::size_t) { unavailable("allocate_pinned"); }
void copy_async(void*, const void*, std::size_t, const Stream&) { unavailable("copy_async"); }

}  // namespace tp::cuda
