// torch.distributed-style free functions over one default process group.
//
// init_process_group checks everything it can on its own (a second init,
// world size, rank, backend, init method, the rendezvous directory) before
// any rank waits on another, so bad input is an error at once, never a hang.
#include "tensorplay/distributed/init.h"

#include <mutex>
#include <utility>

#include "rendezvous_dir.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"

namespace tp::distributed {

namespace {

constexpr const char* kInit = "tp::distributed::init_process_group";

// The default group, set by init_process_group and cleared by
// destroy_process_group. The mutex only makes a stray call from another
// thread safe; a rank normally calls all of these from its main thread.
std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default;  // guarded by g_mutex

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The directory named by "file://DIR". Other schemes get an error that says
// what works today.
std::string rendezvous_dir_of(const std::string& init_method, int rank) {
  const std::string file = "file://";
  if (starts_with(init_method, file)) {
    const std::string dir = init_method.substr(file.size());
    if (dir.empty()) {
      TP_THROW(DistributedError, kInit, ": rank ", rank, ": init_method '", init_method,
               "' names no directory; pass file://DIR, for example "
               "tp::TempDir().file_init_method()");
    }
    return dir;
  }
  for (const char* planned : {"env://", "redis://"}) {
    if (starts_with(init_method, planned)) {
      TP_THROW(DistributedError, kInit, ": rank ", rank, ": init_method '", init_method,
               "': ", planned,
               " is planned but not implemented yet; use file://DIR (all ranks on one "
               "machine), for example tp::TempDir().file_init_method()");
    }
  }
  TP_THROW(DistributedError, kInit, ": rank ", rank, ": unknown init_method '", init_method,
           "'; supported: file://DIR (env:// and redis://host:port are planned)");
}

}  // namespace

void init_process_group(const std::string& backend, int rank, int world_size,
                        const std::string& init_method, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_default) {
    TP_THROW(DistributedError, kInit, ": the default process group is already initialized "
             "(rank ", g_default->rank(), " of ", g_default->size(), ", backend ",
             g_default->backend_name(), "); call destroy_process_group() first");
  }
  if (world_size < 1) {
    TP_THROW(DistributedError, kInit, ": world_size must be >= 1 (got ", world_size,
             "); pass the number of ranks in the job");
  }
  if (rank < 0 || rank >= world_size) {
    TP_THROW(DistributedError, kInit, ": rank ", rank, " is out of range for world_size ",
             world_size, "; pass a rank in 0 .. ", world_size - 1);
  }
  if (backend == "nccl") {
    TP_THROW(DistributedError, kInit, ": rank ", rank,
             ": backend 'nccl' is not available: built without NCCL; reconfigure with "
             "-Dnccl=enabled");
  }
  if (backend != "gloo") {
    TP_THROW(DistributedError, kInit, ": rank ", rank, ": unknown backend '", backend,
             "'; supported backends: gloo (and nccl in a build with -Dnccl=enabled)");
  }
  if (timeout.count() <= 0) {
    TP_THROW(DistributedError, kInit, ": rank ", rank, ": timeout must be positive (got ",
             timeout.count(), " ms)");
  }
  const std::string dir = rendezvous_dir_of(init_method, rank);
  detail::prepare_rendezvous_dir(dir, rank, kInit);
  g_default = std::make_shared<ProcessGroupGloo>(dir, rank, world_size, GlooOptions{timeout});
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    group = std::move(g_default);
    g_default.reset();
  }
  // Dropped outside the lock: the destructor drains the queue and joins the
  // communication thread, which may take a while.
  group.reset();
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_default != nullptr;
}

std::shared_ptr<ProcessGroup> default_group() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_default) {
    TP_THROW(DistributedError, "tp::distributed: no default process group; call "
             "tp::distributed::init_process_group(\"gloo\", rank, world_size, "
             "\"file://DIR\") first");
  }
  return g_default;
}

int get_rank() { return default_group()->rank(); }
int get_world_size() { return default_group()->size(); }

namespace {

// torch.distributed's convention: the Work when async_op, else wait here.
// torch returns None after waiting; a completed Work instead keeps the
// natural dist::all_reduce(t)->wait() from dereferencing a null pointer.
std::shared_ptr<Work> finish(std::shared_ptr<Work> work, bool async_op) {
  if (!async_op) work->wait();
  return work;
}

}  // namespace

std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, bool async_op) {
  return finish(default_group()->allreduce(tensor, op), async_op);
}

std::shared_ptr<Work> broadcast(const Tensor& tensor, int src, bool async_op) {
  return finish(default_group()->broadcast(tensor, src), async_op);
}

std::shared_ptr<Work> all_gather(const std::vector<Tensor>& outputs, const Tensor& input,
                                 bool async_op) {
  return finish(default_group()->allgather(outputs, input), async_op);
}

std::shared_ptr<Work> barrier(bool async_op) {
  return finish(default_group()->barrier(), async_op);
}

}  // namespace tp::distributed
