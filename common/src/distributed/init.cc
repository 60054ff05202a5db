// torch.distributed-style free functions: make_process_group, and one
// default process group built by it.
//
// make_process_group (and so init_process_group) checks everything it can
// on its own (world size, rank, backend, init method and its environment
// variables, the rendezvous directory; init_process_group also a second
// init) before any rank waits on another, so bad input is an error at once,
// never a hang. What only the ranks together can check (a rank missing, two
// ranks with one rank number, world sizes that disagree) is the
// rendezvous's job (ProcessGroupGloo, ProcessGroupNCCL), bounded by the
// timeout. Backend "nccl" is built by nccl_backend.h's make_nccl_group,
// which a build without NCCL replaces by a stand-in that says why not.
#include "tensorplay/distributed/init.h"

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <utility>

#include "rendezvous/dir_store.h"
#include "nccl_backend.h"
#include "rendezvous/network.h"
#include "rendezvous/rendezvous_dir.h"
#include "rendezvous/store_rendezvous.h"
#include "tensorplay/distributed/launcher_env.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/distributed/redis_store.h"
#include "tensorplay/distributed/tcp_store.h"
#include "tensorplay/error.h"

namespace tp::distributed {

using tp::detail::cat;

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

// Where the ranks meet, as parsed from init_method and the environment.
struct InitMethod {
  enum class Scheme { File, Env, Redis } scheme = Scheme::File;
  std::string dir;      // File: the rendezvous directory
  std::string host;     // Env: the master (rank 0 hosts the store); Redis: the server
  int port = 0;
  std::string job_id;   // Redis: the prefix of every key; Env: TP_JOB_ID, checked by the store
  std::string origin;   // for messages: "MASTER_ADDR=a, MASTER_PORT=p" or "tcp://a:p"
  std::string host_what = "MASTER_ADDR";  // how messages name `host`
};

// What a launcher gave `name` (launcher_env.h: torchrun's variable, else
// Slurm's); an error naming both when neither is set.
LauncherValue env_value(const char* who, const char* name, int rank,
                                const std::string& why) {
  if (auto value = from_launcher(name)) return *value;
  const std::string slurm = slurm_counterparts(name);
  TP_THROW(DistributedError, who, rank >= 0 ? cat(": rank ", rank) : std::string(), ": ",
           why, " reads ", name, " from the environment, but it is not set",
           slurm.empty() ? std::string() : cat(" (nor is Slurm's ", slurm, ")"), "; set ", name,
           " on every rank, or start the job with tprun, which sets MASTER_ADDR, "
           "MASTER_PORT, RANK and WORLD_SIZE");
}

// `text` as a whole number in [low, high]; an error naming `what` otherwise.
int parse_int(const char* who, const std::string& text, int low, int high, const std::string& what,
              int rank) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < low || v > high) {
    TP_THROW(DistributedError, who, rank >= 0 ? cat(": rank ", rank) : std::string(), ": ",
             what, "='", text,
             "' is not a whole number from ", low, " to ", high);
  }
  return static_cast<int>(v);
}

// "host:port" or "[v6 address]:port" -> host, port.
void split_host_port(const char* who, const std::string& text, const std::string& init_method,
                     int rank, std::string& host, int& port) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    TP_THROW(DistributedError, who, ": rank ", rank, ": init_method '", init_method,
             "' names no host and port; pass ", init_method.substr(0, init_method.find("//") + 2),
             "HOST:PORT");
  }
  host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  port = parse_int(who, text.substr(colon + 1), 1, 65535, "the port of '" + init_method + "'",
                   rank);
}

InitMethod parse_init_method(const char* who, const std::string& init_method, int rank) {
  InitMethod m;
  if (starts_with(init_method, "file://")) {
    m.dir = init_method.substr(7);
    if (m.dir.empty()) {
      TP_THROW(DistributedError, who, ": rank ", rank, ": init_method '", init_method,
               "' names no directory; pass file://DIR, for example "
               "tp::TempDir().file_init_method()");
    }
    return m;
  }
  if (init_method == "env://") {
    m.scheme = InitMethod::Scheme::Env;
    const LauncherValue host = env_value(who, "MASTER_ADDR", rank, "env://");
    m.host = host.value;
    const std::string port = env_value(who, "MASTER_PORT", rank, "env://").value;
    m.port = parse_int(who, port, 1, 65535, "MASTER_PORT", rank);
    m.origin = cat("env:// with MASTER_ADDR=", m.host,
                   host.variable == "MASTER_ADDR" ? "" : " (from " + host.variable + ")",
                   ", MASTER_PORT=", port);
    if (host.variable != "MASTER_ADDR") m.host_what = "the master (from " + host.variable + ")";
    // Note [One job per store]
    if (auto job = from_launcher("TP_JOB_ID")) m.job_id = job->value;
    return m;
  }
  if (starts_with(init_method, "tcp://")) {  // env:// with the address inline
    m.scheme = InitMethod::Scheme::Env;
    split_host_port(who, init_method.substr(6), init_method, rank, m.host, m.port);
    m.origin = init_method;
    m.host_what = "the host of " + init_method;
    // Note [One job per store]
    if (auto job = from_launcher("TP_JOB_ID")) m.job_id = job->value;
    return m;
  }
  if (starts_with(init_method, "redis://")) {
    m.scheme = InitMethod::Scheme::Redis;
    std::string rest = init_method.substr(8);
    const std::size_t slash = rest.find('/');
    if (slash != std::string::npos) {
      m.job_id = rest.substr(slash + 1);
      rest = rest.substr(0, slash);
    }
    split_host_port(who, rest, init_method, rank, m.host, m.port);
    if (m.job_id.empty()) {
      const char* job = std::getenv("TP_JOB_ID");
      if (job == nullptr || *job == '\0') {
        TP_THROW(DistributedError, who, ": rank ", rank, ": init_method '", init_method,
                 "' names no job id, and TP_JOB_ID is not set; jobs that share a "
                 "redis-server need one each, so their keys never mix: pass "
                 "redis://HOST:PORT/JOB or set TP_JOB_ID (tprun sets it from --job-id)");
      }
      m.job_id = job;
    }
    m.origin = cat(init_method, " (job '", m.job_id, "')");
    m.host_what = "the host of " + init_method;
    return m;
  }
  TP_THROW(DistributedError, who, ": rank ", rank, ": unknown init_method '", init_method,
           "'; supported: file://DIR (one machine), env:// (MASTER_ADDR, MASTER_PORT, "
           "RANK, WORLD_SIZE), tcp://HOST:PORT and redis://HOST:PORT[/JOB]");
}

// Runs make(); an error gets `context` in front, keeping its type (a
// timeout stays a timeout, a lost peer a consequence).
template <typename Make>
auto with_context(const std::string& context, const std::string& fix, Make make) {
  try {
    return make();
  } catch (const TimeoutError& e) {
    throw TimeoutError(context + e.what() + fix);
  } catch (const PeerFailedError& e) {
    throw PeerFailedError(context + e.what() + fix);
  } catch (const DistributedError& e) {
    throw DistributedError(context + e.what() + fix);
  }
}

// The rank and world size a group is made with: torch.distributed's
// convention, -1 reads WORLD_SIZE and RANK (not for file://, whose ranks are
// forked by spawn and told their rank). Throws for a size below 1 or a rank
// out of range.
void resolve_rank_and_size(const char* who, const std::string& init_method, int& rank,
                           int& world_size) {
  const bool from_env = !starts_with(init_method, "file://");
  if (world_size == kFromEnvironment && from_env) {
    const LauncherValue size = env_value(who, "WORLD_SIZE", rank, init_method);
    world_size = parse_int(who, size.value, 1, 1 << 20, size.variable, rank);
  }
  if (rank == kFromEnvironment && from_env) {
    const LauncherValue given = env_value(who, "RANK", rank, init_method);
    rank = parse_int(who, given.value, 0, world_size - 1, given.variable, rank);
  }
  if (world_size < 1) {
    TP_THROW(DistributedError, who, ": world_size must be >= 1 (got ", world_size,
             "); pass the number of ranks in the job");
  }
  if (rank < 0 || rank >= world_size) {
    TP_THROW(DistributedError, who, ": rank ", rank, " is out of range for world_size ",
             world_size, "; pass a rank in 0 .. ", world_size - 1);
  }
}

// Throws for a backend the kit does not have or this build lacks, and for a
// timeout that is not positive.
void check_backend_and_timeout(const char* who, const std::string& backend, int rank,
                               std::chrono::milliseconds timeout) {
  if (backend != "gloo" && backend != "nccl") {
    TP_THROW(DistributedError, who, ": rank ", rank, ": unknown backend '", backend,
             "'; supported backends: gloo and nccl (CUDA tensors, one GPU per rank, in a "
             "build with NCCL)");
  }
  if (backend == "nccl") {
    if (const std::string why = nccl_unavailable_reason(); !why.empty()) {
      TP_THROW(DistributedError, who, ": rank ", rank, ": backend 'nccl' is not available: ",
               why, why.find("gloo") == std::string::npos
                        ? "; use backend \"gloo\" (it takes CPU tensors, and CUDA tensors "
                          "staged through host memory)"
                        : "");
    }
  }
  if (timeout.count() <= 0) {
    TP_THROW(DistributedError, who, ": rank ", rank, ": timeout must be positive (got ",
             timeout.count(), " ms)");
  }
}

// PyTorch's TORCH_NCCL_BLOCKING_WAIT=1, or the kit's own name for it:
// Work::wait() of the NCCL backend then blocks the host too. The group's
// options decide when they say.
bool nccl_blocking_wait(const GroupOptions& group_options) {
  if (group_options.blocking_wait) return *group_options.blocking_wait;
  for (const char* name : {"TP_NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::string(value) == "1") return true;
  }
  return false;
}

// The store of an env:// or redis:// rendezvous. Under env:// rank 0 hosts
// it, as in torch.distributed, and every rank checks that the store's job
// is its own.
std::shared_ptr<Store> rendezvous_store(const InitMethod& method, int rank,
                                        std::chrono::milliseconds timeout,
                                        const std::string& context) {
  if (method.scheme == InitMethod::Scheme::Redis) {
    return with_context(context, "", [&] {
      return std::make_shared<RedisStore>(method.host, method.port, method.job_id, timeout);
    });
  }
  const std::string fix =
      rank == 0 ? cat("; set MASTER_PORT to a free port on rank 0's machine")
                : cat("; is rank 0 running, and do MASTER_ADDR and MASTER_PORT name its "
                      "machine and port on every rank?");
  std::shared_ptr<Store> store = with_context(context, fix, [&] {
    return std::make_shared<TCPStore>(method.host, method.port, rank == 0, timeout);
  });
  with_context(context, "", [&] { detail::check_same_job(*store, rank, method.job_id, timeout); });
  return store;
}

// make_process_group's work, with errors naming `who`: the function the
// caller called (init_process_group or make_process_group).
std::shared_ptr<ProcessGroup> build_group(const char* who, const std::string& backend, int rank,
                                          int world_size, const std::string& init_method,
                                          const GroupOptions& group_options) {
  resolve_rank_and_size(who, init_method, rank, world_size);
  const std::chrono::milliseconds timeout = group_options.timeout;
  check_backend_and_timeout(who, backend, rank, timeout);
  const bool nccl = backend == "nccl";
  const InitMethod method = parse_init_method(who, init_method, rank);
  GlooOptions options;
  options.timeout = timeout;
  options.check_in_flight_writes = group_options.check_in_flight_writes;
  if (method.scheme == InitMethod::Scheme::File) {
    detail::prepare_rendezvous_dir(method.dir, rank, who);
    if (nccl) {
      // NCCL needs a Store (for its ncclUniqueId); file:// has a directory,
      // which is one (dir_store.h).
      return with_context(cat(who, ": rank ", rank, " of ", world_size, ", ", init_method, ": "),
                          "", [&] {
        return detail::make_nccl_group(std::make_shared<detail::DirStore>(method.dir), rank,
                                       world_size, timeout, nccl_blocking_wait(group_options));
      });
    }
    return std::make_shared<ProcessGroupGloo>(method.dir, rank, world_size, options);
  }
  if (!nccl) {
    // Note [Choosing the interface] (rendezvous/network.h). NCCL chooses its own
    // (NCCL_SOCKET_IFNAME).
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname != nullptr && *ifname != '\0') {
      options.socket_ifname = ifname;
    } else {
      options.hostname =
          detail::local_address_towards(method.host, method.port, method.host_what);
    }
  }
  const std::string context = cat(who, ": rank ", rank, " of ", world_size, ", ",
                                  method.origin, ": ");
  const std::shared_ptr<Store> store = rendezvous_store(method, rank, timeout, context);
  if (nccl) {
    return with_context(context, "", [&] {
      return detail::make_nccl_group(store, rank, world_size, timeout,
                                     nccl_blocking_wait(group_options));
    });
  }
  return with_context(context, "", [&]() -> std::shared_ptr<ProcessGroup> {
    return std::make_shared<ProcessGroupGloo>(store, rank, world_size, options);
  });
}

}  // namespace

std::shared_ptr<ProcessGroup> make_process_group(const std::string& backend, int rank,
                                                 int world_size, const std::string& init_method,
                                                 const GroupOptions& options) {
  return build_group("tp::distributed::make_process_group", backend, rank, world_size,
                     init_method, options);
}

void init_process_group(const std::string& backend, int rank, int world_size,
                        const std::string& init_method, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_default) {
    TP_THROW(DistributedError, kInit, ": the default process group is already initialized "
             "(rank ", g_default->rank(), " of ", g_default->size(), ", backend ",
             g_default->backend_name(), "); call destroy_process_group() first");
  }
  g_default = build_group(kInit, backend, rank, world_size, init_method, GroupOptions{timeout});
}

void init_process_group(const std::string& backend, const std::string& init_method,
                        std::chrono::milliseconds timeout) {
  init_process_group(backend, kFromEnvironment, kFromEnvironment, init_method, timeout);
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

std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input,
                                            const std::vector<int64_t>& split_sizes, ReduceOp op,
                                            bool async_op) {
  return finish(default_group()->reduce_scatter_tensor(output, input, split_sizes, op), async_op);
}

std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input,
                                             const std::vector<int64_t>& split_sizes,
                                             bool async_op) {
  return finish(default_group()->allgather_into_tensor(output, input, split_sizes), async_op);
}

}  // namespace tp::distributed
