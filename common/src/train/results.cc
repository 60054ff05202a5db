// Snapshots and the text form ranks send back through spawn().
#include "tensorplay/train/results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "tensorplay/error.h"

namespace tp::train {

Snapshot snapshot(const std::vector<nn::NamedTensor>& named) {
  Snapshot out;
  out.reserve(named.size());
  for (const auto& [name, tensor] : named) {
    out.push_back({name, tensor.shape(), tensor.to_vector()});
  }
  return out;
}

std::vector<int64_t> grad_storage_groups(const std::vector<Tensor>& params) {
  std::vector<const Storage*> seen;
  std::vector<int64_t> out;
  for (const Tensor& p : params) {
    const Tensor grad = p.grad();
    if (!grad.defined()) {
      out.push_back(0);
      continue;
    }
    const Storage* storage = grad.storage().get();
    const auto at = std::find(seen.begin(), seen.end(), storage);
    if (at == seen.end()) seen.push_back(storage);
    out.push_back(static_cast<int64_t>(std::find(seen.begin(), seen.end(), storage) - seen.begin()) + 1);
  }
  return out;
}

uint64_t allreduces_in_step(const RankResult& rank, int64_t micro_batches, int64_t step) {
  uint64_t total = 0;
  for (int64_t k = 0; k < micro_batches; ++k) {
    const auto i = static_cast<size_t>(step * micro_batches + k);
    if (i < rank.allreduces_per_micro.size()) total += rank.allreduces_per_micro[i];
  }
  return total;
}

double norm(const Snapshot& snapshot) {
  double sum = 0.0;
  for (const ParamValues& p : snapshot) {
    for (double v : p.values) sum += v * v;
  }
  return std::sqrt(sum);
}

// ---- text form --------------------------------------------------------------
// One record per line: a keyword, then values. Doubles are written as
// hexadecimal floats ("%a"), which strtod reads back bit for bit.
namespace {

void put(std::ostringstream& out, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %a", v);
  out << buf;
}

void put_snapshot(std::ostringstream& out, const char* key, const Snapshot& snap) {
  for (const ParamValues& p : snap) {
    out << key << ' ' << p.name << ' ' << p.shape.size();
    for (int64_t s : p.shape) out << ' ' << s;
    out << ' ' << p.values.size();
    for (double v : p.values) put(out, v);
    out << '\n';
  }
}

template <typename T>
void put_list(std::ostringstream& out, const char* key, const std::vector<T>& values) {
  out << key << ' ' << values.size();
  for (T v : values) {
    if constexpr (std::is_floating_point_v<T>) {
      put(out, v);
    } else {
      out << ' ' << v;
    }
  }
  out << '\n';
}

double read_double(std::istringstream& in) {
  std::string token;
  in >> token;
  char* end = nullptr;
  double v = std::strtod(token.c_str(), &end);
  TP_CHECK(!token.empty() && end == token.c_str() + token.size(),
           "tp::train::parse_rank_result: expected a number, got '", token, "'");
  return v;
}

void read_snapshot_line(std::istringstream& in, Snapshot& snap) {
  ParamValues p;
  size_t dims = 0, count = 0;
  in >> p.name >> dims;
  p.shape.resize(dims);
  for (int64_t& s : p.shape) in >> s;
  in >> count;
  p.values.resize(count);
  for (double& v : p.values) v = read_double(in);
  snap.push_back(std::move(p));
}

template <typename T>
std::vector<T> read_list(std::istringstream& in) {
  size_t n = 0;
  in >> n;
  std::vector<T> out(n);
  for (T& v : out) {
    if constexpr (std::is_floating_point_v<T>) {
      v = read_double(in);
    } else {
      in >> v;
    }
  }
  return out;
}

}  // namespace

std::string serialize(const RankResult& r) {
  std::ostringstream out;
  out << "rank " << r.rank << '\n';
  out << "construction " << r.construction_allreduces << ' ' << r.construction_broadcasts
      << ' ' << r.construction_allgathers << '\n';
  put_list(out, "losses", r.losses);
  put_list(out, "allreduces", r.allreduces_per_micro);
  put_list(out, "broadcasts", r.broadcasts_per_micro);
  for (const std::vector<int64_t>& bucket : r.buckets) put_list(out, "bucket", bucket);
  for (const std::vector<int64_t>& bucket : r.initial_buckets) {
    put_list(out, "initial_bucket", bucket);
  }
  put_list(out, "param_ids", r.param_ids);
  put_list(out, "grad_storage", r.grad_storage);
  for (const std::vector<int64_t>& u : r.unreached_per_micro) put_list(out, "unreached", u);
  put_snapshot(out, "initial", r.initial_params);
  put_snapshot(out, "first", r.after_first_step);
  put_snapshot(out, "final", r.final_params);
  put_snapshot(out, "initial_buffer", r.initial_buffers);
  put_snapshot(out, "final_buffer", r.final_buffers);
  for (const trace::Event& e : r.events) {
    // Names may contain spaces, so they come last: the rest of the line.
    out << "event " << e.phase << ' ' << e.pid << ' ' << e.tid << ' ' << e.ts_us << ' '
        << e.dur_us << ' ' << e.begin_order << ' ' << e.end_order << ' ' << e.args.size();
    for (const auto& [key, value] : e.args) out << ' ' << key << ' ' << value;
    // "-" stands for an empty category or thread name (both are one word).
    out << ' ' << (e.category.empty() ? "-" : e.category) << ' '
        << (e.thread.empty() ? "-" : e.thread) << ' ' << e.name
        << '\n';
  }
  out << "end\n";
  return out.str();
}

RankResult parse_rank_result(const std::string& text) {
  RankResult r;
  std::istringstream lines(text);
  std::string line;
  bool ended = false;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string key;
    in >> key;
    if (key == "rank") {
      in >> r.rank;
    } else if (key == "construction") {
      in >> r.construction_allreduces >> r.construction_broadcasts >> r.construction_allgathers;
    } else if (key == "losses") {
      r.losses = read_list<double>(in);
    } else if (key == "allreduces") {
      r.allreduces_per_micro = read_list<uint64_t>(in);
    } else if (key == "broadcasts") {
      r.broadcasts_per_micro = read_list<uint64_t>(in);
    } else if (key == "grad_storage") {
      r.grad_storage = read_list<int64_t>(in);
    } else if (key == "param_ids") {
      r.param_ids = read_list<int64_t>(in);
    } else if (key == "bucket") {
      r.buckets.push_back(read_list<int64_t>(in));
    } else if (key == "initial_bucket") {
      r.initial_buckets.push_back(read_list<int64_t>(in));
    } else if (key == "unreached") {
      r.unreached_per_micro.push_back(read_list<int64_t>(in));
    } else if (key == "initial_buffer") {
      read_snapshot_line(in, r.initial_buffers);
    } else if (key == "final_buffer") {
      read_snapshot_line(in, r.final_buffers);
    } else if (key == "initial") {
      read_snapshot_line(in, r.initial_params);
    } else if (key == "first") {
      read_snapshot_line(in, r.after_first_step);
    } else if (key == "final") {
      read_snapshot_line(in, r.final_params);
    } else if (key == "event") {
      trace::Event e;
      size_t nargs = 0;
      in >> e.phase >> e.pid >> e.tid >> e.ts_us >> e.dur_us >> e.begin_order >> e.end_order >>
          nargs;
      for (size_t i = 0; i < nargs; ++i) {
        std::pair<std::string, int64_t> arg;
        in >> arg.first >> arg.second;
        e.args.push_back(std::move(arg));
      }
      in >> e.category >> e.thread;
      if (e.category == "-") e.category.clear();
      if (e.thread == "-") e.thread.clear();
      std::getline(in >> std::ws, e.name);
      r.events.push_back(std::move(e));
    } else if (key == "end") {
      ended = true;
    } else {
      TP_THROW(Error, "tp::train::parse_rank_result: unknown record '", key, "'");
    }
    TP_CHECK(!in.fail(), "tp::train::parse_rank_result: malformed record '", key, "'");
  }
  TP_CHECK(ended, "tp::train::parse_rank_result: the result is truncated (no 'end' record)");
  return r;
}

std::vector<RankResult> all_gather_results(distributed::ProcessGroup& group,
                                           const RankResult& mine) {
  const std::string text = serialize(mine);
  const auto world = static_cast<std::size_t>(group.size());
  // Where the group wants them (an NCCL group: this rank's GPU);
  // item() and cpu() bring them back.
  const Device device = group.preferred_device();
  // The lengths first (a double holds any length exactly up to 2^53) ...
  std::vector<Tensor> lengths;
  for (std::size_t r = 0; r < world; ++r) lengths.push_back(zeros({1}, kFloat64, device));
  group.allgather(lengths, full({1}, static_cast<double>(text.size()), kFloat64, device))->wait();
  std::size_t longest = 0;
  for (const Tensor& l : lengths) longest = std::max(longest, static_cast<std::size_t>(l.item()));
  // ... then the bytes, carried in float64 tensors: an all-gather copies
  // bytes and never computes with them, so any bit pattern arrives intact.
  const int64_t words = static_cast<int64_t>((longest + 7) / 8) + 1;
  Tensor packed = zeros({words}, kFloat64);
  std::memcpy(packed.data_ptr(), text.data(), text.size());
  std::vector<Tensor> gathered;
  for (std::size_t r = 0; r < world; ++r) gathered.push_back(zeros({words}, kFloat64, device));
  group.allgather(gathered, packed.to(device))->wait();
  std::vector<RankResult> results;
  for (std::size_t r = 0; r < world; ++r) {
    const auto n = static_cast<std::size_t>(lengths[r].item());
    const Tensor bytes = gathered[r].cpu();  // waits for the gather on a GPU
    results.push_back(
        parse_rank_result(std::string(static_cast<const char*>(bytes.data_ptr()), n)));
  }
  return results;
}

}  // namespace tp::train
