// broadcast_coalesced: the chunk assignment on its own (closed forms: n
// equal tensors in chunks of k make ceil(n / k) chunks); what is packed and
// what is sent in place, seen through a group that records its broadcasts;
// then real ranks at world sizes 1 to 4, from root 0 and from the last rank,
// whose tensors all end with root's values, with the broadcasts counted; and
// the bad arguments, refused with the function, the cause and the fix.
//
// Children cannot use doctest macros (doctest's state lives in the parent);
// they check with expect(), which throws, and spawn rethrows in the parent
// with the rank and the message.
#include <doctest/doctest.h>

#include <chrono>
#include "test_util.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/distributed/broadcast_coalesced.h"
#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/spawn.h"
#include "tensorplay/nn/models.h"
#include "tensorplay/random.h"
#include "tensorplay/tensor.h"

namespace dist = tp::distributed;
namespace mp = tp::multiprocessing;
using doctest::Contains;
using Chunks = std::vector<std::vector<std::size_t>>;

namespace {

using test_util::run_world;

// What RecordingGroup writes into element e of a tensor it broadcasts off
// root: each element of a chunk tells where in the chunk it landed.
double received(int64_t e) { return 10000.0 + static_cast<double>(e); }

// A group that runs no collective: it records each broadcast's tensor and
// root and, on a rank other than root, writes received(e) into element e of
// the tensor, as if root had sent it. Enough to see, in this process, what
// broadcast_coalesced packs, what it sends in place and where it unpacks.
class RecordingGroup : public dist::ProcessGroup {
 public:
  RecordingGroup(int rank, int size) : ProcessGroup(rank, size) {}
  std::string backend_name() const override { return "recording"; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }

  std::shared_ptr<dist::Work> broadcast(const tp::Tensor& tensor, int root) override {
    ++counters_.broadcast;
    sent.push_back(tensor);
    roots.push_back(root);
    if (rank() != root) {
      std::vector<double> values;
      for (int64_t e = 0; e < tensor.numel(); ++e) values.push_back(received(e));
      tp::Tensor written = tensor;
      written.copy_(tp::tensor(values, tensor.shape(), tensor.dtype()));
    }
    return finished("broadcast");
  }
  std::shared_ptr<dist::Work> allreduce(const tp::Tensor&, dist::ReduceOp) override {
    throw std::logic_error("RecordingGroup records broadcasts only");
  }
  std::shared_ptr<dist::Work> allgather(const std::vector<tp::Tensor>&,
                                        const tp::Tensor&) override {
    throw std::logic_error("RecordingGroup records broadcasts only");
  }
  std::shared_ptr<dist::Work> barrier() override {
    throw std::logic_error("RecordingGroup records broadcasts only");
  }

  std::vector<tp::Tensor> sent;  // each broadcast's tensor, in issue order
  std::vector<int> roots;        // and its root

 private:
  std::shared_ptr<dist::Work> finished(const std::string& collective) {
    auto work = std::make_shared<dist::Work>(collective, sent.size(), rank());
    work->finish();
    return work;
  }
};

// n float32 tensors of 3 elements (12 bytes) each.
std::vector<tp::Tensor> equal_tensors(int n) {
  std::vector<tp::Tensor> tensors;
  for (int i = 0; i < n; ++i) tensors.push_back(tp::zeros({3}));
  return tensors;
}

// Rank r's value of element j of tensor i: distinct for every rank, tensor
// and element, and exact in float32.
double value_of(int rank, std::size_t i, int64_t j) {
  return 1000.0 * rank + 100.0 * static_cast<double>(i) + static_cast<double>(j);
}

// Fills every tensor with rank's values.
void fill_as(int rank, const std::vector<tp::Tensor>& tensors) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::vector<double> values;
    for (int64_t j = 0; j < tensors[i].numel(); ++j) values.push_back(value_of(rank, i, j));
    tp::Tensor t = tensors[i];
    t.copy_(tp::tensor(values, t.shape(), t.dtype()));
  }
}

// Throws on this rank unless every tensor holds root's values.
void expect_values_of(int root, const std::vector<tp::Tensor>& tensors, const std::string& what) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<double> got = tensors[i].to_vector();
    for (std::size_t j = 0; j < got.size(); ++j) {
      const double expected = value_of(root, i, static_cast<int64_t>(j));
      if (got[j] != expected) {
        TP_THROW(tp::Error, what, " on rank ", mp::current_rank(), ": tensors[", i, "][", j,
                 "] is ", got[j], ", expected root ", root, "'s ", expected);
      }
    }
  }
}

// Throws on this rank unless got == expected.
void expect_count(int64_t got, int64_t expected, const std::string& what) {
  if (got != expected) {
    TP_THROW(tp::Error, what, " on rank ", mp::current_rank(), ": ", got, " broadcasts, expected ",
             expected);
  }
}

// Calls broadcast_coalesced on the default group; throws unless it returned
// `expected` and issued as many broadcasts.
void broadcast_expecting(const std::vector<tp::Tensor>& tensors, int64_t chunk_bytes, int root,
                         int64_t expected, const std::string& what) {
  dist::ProcessGroup& group = *dist::default_group();
  const uint64_t before = group.counters().broadcast;
  const int64_t returned = dist::broadcast_coalesced(group, tensors, chunk_bytes, root);
  expect_count(returned, expected, what + " (returned)");
  expect_count(static_cast<int64_t>(group.counters().broadcast - before), expected,
               what + " (counters().broadcast)");
}

// A mixed list (sizes in bytes): float32 (2, 3) 24, float64 (4) 32,
// float32 (5) 20, float32 (0) 0, float64 (2, 2) 32, float32 (40) 160,
// float32 (1) 4. With 64-byte chunks: float32 {0, 2, 6} (48 bytes),
// float64 {1, 4} (64 bytes), {5} alone (160 > 64); tensor 3 in none.
std::vector<tp::Tensor> mixed_tensors() {
  return {tp::zeros({2, 3}), tp::zeros({4}, tp::kFloat64), tp::zeros({5}),
          tp::zeros({0}),    tp::zeros({2, 2}, tp::kFloat64), tp::zeros({40}),
          tp::zeros({1})};
}
constexpr int64_t kMixedChunkBytes = 64;
const Chunks kMixedChunks = {{0, 2, 6}, {1, 4}, {5}};

}  // namespace

// ---- the chunk assignment -----------------------------------------------------

TEST_CASE("n equal tensors with chunks of k tensors' bytes make ceil(n / k) chunks, in order") {
  for (int n = 1; n <= 7; ++n) {
    for (int k = 1; k <= 8; ++k) {
      CAPTURE(n);
      CAPTURE(k);
      const std::vector<tp::Tensor> tensors = equal_tensors(n);
      // Any chunk_bytes from k tensors' bytes to one byte short of k + 1's.
      for (int64_t chunk_bytes : {12 * k, 12 * k + 11}) {
        const Chunks chunks = dist::assign_broadcast_chunks(tensors, chunk_bytes);
        REQUIRE(chunks.size() == static_cast<std::size_t>((n + k - 1) / k));
        for (std::size_t c = 0; c < chunks.size(); ++c) {
          std::vector<std::size_t> expected;
          for (std::size_t i = c * k; i < std::min<std::size_t>((c + 1) * k, n); ++i) {
            expected.push_back(i);
          }
          CHECK(chunks[c] == expected);
        }
      }
    }
  }
}

TEST_CASE("a chunk holds one dtype: interleaved float32 and float64 make one chunk per dtype") {
  const std::vector<tp::Tensor> tensors = {tp::zeros({3}), tp::zeros({2}, tp::kFloat64),
                                           tp::zeros({5}), tp::zeros({1}, tp::kFloat64),
                                           tp::zeros({4})};
  CHECK(dist::assign_broadcast_chunks(tensors, dist::kDefaultBroadcastChunkBytes) ==
        Chunks{{0, 2, 4}, {1, 3}});
  // One byte per chunk: every tensor is a chunk of its own, in list order.
  CHECK(dist::assign_broadcast_chunks(tensors, 1) == Chunks{{0}, {1}, {2}, {3}, {4}});
}

TEST_CASE("a tensor of chunk_bytes or more is a chunk of its own; the small ones around it share") {
  // 8, 400 and 8 bytes in 16-byte chunks. PyTorch's rule (add, then close at
  // >= the limit) would give {0, 1}, {2}: the big tensor joins the open bucket.
  const std::vector<tp::Tensor> tensors = {tp::zeros({2}), tp::zeros({100}), tp::zeros({2})};
  CHECK(dist::assign_broadcast_chunks(tensors, 16) == Chunks{{0, 2}, {1}});
  // Exactly chunk_bytes is a full chunk, alone too.
  CHECK(dist::assign_broadcast_chunks(tensors, 400) == Chunks{{0, 2}, {1}});
  CHECK(dist::assign_broadcast_chunks(mixed_tensors(), kMixedChunkBytes) == kMixedChunks);
}

TEST_CASE("tensors without elements are in no chunk, and an empty list has no chunk") {
  CHECK(dist::assign_broadcast_chunks({}, 64).empty());
  CHECK(dist::assign_broadcast_chunks({tp::zeros({0}), tp::zeros({3, 0}, tp::kFloat64)}, 64)
            .empty());
  CHECK(dist::assign_broadcast_chunks({tp::zeros({0}), tp::zeros({2})}, 64) == Chunks{{1}});
}

TEST_CASE("assign_broadcast_chunks refuses chunk_bytes <= 0 and undefined tensors, saying why") {
  CHECK_THROWS_WITH_AS(dist::assign_broadcast_chunks({tp::zeros({2})}, 0),
                       "tp::distributed::assign_broadcast_chunks: chunk_bytes is 0; pass a "
                       "positive size in bytes (the default, kDefaultBroadcastChunkBytes = 250 "
                       "MiB, is PyTorch's broadcast_bucket_size)",
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::assign_broadcast_chunks({tp::zeros({2}), tp::Tensor()}, 64),
                       "tp::distributed::assign_broadcast_chunks: tensors[1] is undefined; pass "
                       "defined tensors, such as a model's parameters() and buffers()",
                       tp::DistributedError);
}

// ---- what is packed, what is sent in place (a recording group) ----------------

TEST_CASE("root packs a chunk of several tensors into one flat tensor; a lone one goes in place") {
  RecordingGroup group(/*rank=*/0, /*size=*/2);
  std::vector<tp::Tensor> tensors = mixed_tensors();
  fill_as(0, tensors);
  REQUIRE(dist::broadcast_coalesced(group, tensors, kMixedChunkBytes, /*root=*/0) == 3);
  REQUIRE(group.sent.size() == 3);
  CHECK(group.roots == std::vector<int>{0, 0, 0});
  // Chunk {0, 2, 6}: 6 + 5 + 1 float32 elements, packed in list order.
  const tp::Tensor& f32 = group.sent[0];
  CHECK(f32.dtype() == tp::kFloat32);
  CHECK(f32.shape() == tp::Shape{12});
  CHECK_FALSE(f32.is_alias_of(tensors[0]));
  std::vector<double> expected;
  for (std::size_t i : {0, 2, 6}) {
    for (int64_t j = 0; j < tensors[i].numel(); ++j) expected.push_back(value_of(0, i, j));
  }
  CHECK(f32.to_vector() == expected);
  // Chunk {1, 4}: 4 + 4 float64 elements.
  CHECK(group.sent[1].dtype() == tp::kFloat64);
  CHECK(group.sent[1].shape() == tp::Shape{8});
  // Chunk {5}, 160 bytes > 64: the tensor itself, no copy.
  CHECK(group.sent[2].is_alias_of(tensors[5]));
  CHECK(group.sent[2].data_ptr() == tensors[5].data_ptr());
}

TEST_CASE("off root, each tensor receives its own slice of its chunk, in list order") {
  RecordingGroup group(/*rank=*/1, /*size=*/2);
  std::vector<tp::Tensor> tensors = mixed_tensors();
  fill_as(1, tensors);
  REQUIRE(dist::broadcast_coalesced(group, tensors, kMixedChunkBytes, /*root=*/0) == 3);
  // Element j of the tensor that starts at element `offset` of its chunk.
  auto expect_slice = [&](std::size_t i, int64_t offset) {
    CAPTURE(i);
    std::vector<double> expected;
    for (int64_t j = 0; j < tensors[i].numel(); ++j) expected.push_back(received(offset + j));
    CHECK(tensors[i].to_vector() == expected);
  };
  expect_slice(0, 0);   // chunk {0, 2, 6}: 6 elements,
  expect_slice(2, 6);   // then 5,
  expect_slice(6, 11);  // then 1
  expect_slice(1, 0);   // chunk {1, 4}: 4 elements,
  expect_slice(4, 4);   // then 4
  expect_slice(5, 0);   // {5}, in place
  CHECK(tensors[3].numel() == 0);
}

TEST_CASE("the writes record no autograd history: parameters stay leaves, grad mode stays on") {
  RecordingGroup group(/*rank=*/1, /*size=*/2);
  tp::manual_seed(3);
  tp::nn::MiniMLP model;  // six parameters, leaves that require grad
  const std::vector<tp::Tensor> params = model.parameters();
  // One float32 chunk, copied out into the parameters: a write into a leaf
  // that requires grad, which grad mode would refuse.
  CHECK(dist::broadcast_coalesced(group, params) == 1);
  int64_t offset = 0;
  for (const tp::Tensor& p : params) {
    CHECK(p.is_leaf());
    CHECK(p.requires_grad());
    CHECK(p.to_vector().front() == received(offset));
    offset += p.numel();
  }
  CHECK(tp::autograd::is_grad_enabled());
}

TEST_CASE("broadcast_coalesced refuses bad arguments before any broadcast, naming the fix") {
  RecordingGroup group(/*rank=*/1, /*size=*/2);
  const std::vector<tp::Tensor> tensors = {tp::zeros({2}), tp::zeros({3})};
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, tensors, 0),
                       "tp::distributed::broadcast_coalesced: rank 1: chunk_bytes is 0; pass a "
                       "positive size in bytes (the default, kDefaultBroadcastChunkBytes = 250 "
                       "MiB, is PyTorch's broadcast_bucket_size)",
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, tensors, -4),
                       Contains("rank 1: chunk_bytes is -4; pass a positive size in bytes"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, tensors, 64, /*root=*/2),
                       "tp::distributed::broadcast_coalesced: rank 1: root 2 is out of range for "
                       "world size 2; pass a rank in 0 .. 1",
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, tensors, 64, /*root=*/-1),
                       Contains("rank 1: root -1 is out of range for world size 2"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, {tp::zeros({2}), tp::Tensor()}),
                       Contains("broadcast_coalesced: rank 1: tensors[1] is undefined; pass "
                                "defined tensors"),
                       tp::DistributedError);
  CHECK_THROWS_WITH_AS(dist::broadcast_coalesced(group, {tp::zeros({2}), tp::zeros({3, 4}).t()}),
                       "tp::distributed::broadcast_coalesced: rank 1: tensors[1] is not "
                       "contiguous (shape (4, 3), strides (1, 4)); a chunk is copied as dense "
                       "blocks: pass t.contiguous() and copy the result back afterwards",
                       tp::DistributedError);
  CHECK(group.counters().broadcast == 0);
}

// ---- real ranks -----------------------------------------------------------------

TEST_CASE("every rank ends with root's values, from root 0 and the last rank, at world sizes 1 to 4") {
  for (int world = 1; world <= 4; ++world) {
    CAPTURE(world);
    CHECK_NOTHROW(run_world(world, [](int rank, int w) {
      for (int root : {0, w - 1}) {
        const std::vector<tp::Tensor> tensors = mixed_tensors();
        fill_as(rank, tensors);
        // {0, 2, 6}, {1, 4} and {5} (mixed_tensors()).
        broadcast_expecting(tensors, kMixedChunkBytes, root, 3, "mixed, 64-byte chunks");
        expect_values_of(root, tensors, "mixed, 64-byte chunks");
      }
    }));
  }
}

TEST_CASE("one broadcast per tensor with 1-byte chunks, one per dtype with 250 MiB, ceil(n/k) between") {
  CHECK_NOTHROW(run_world(3, [](int rank, int w) {
    const int root = w - 1;
    // Interleaved float32 (3) and float64 (2, 2): 6 tensors, 2 dtypes.
    std::vector<tp::Tensor> mixed;
    for (int i = 0; i < 6; ++i) {
      mixed.push_back(i % 2 == 0 ? tp::zeros({3}) : tp::zeros({2, 2}, tp::kFloat64));
    }
    fill_as(rank, mixed);
    broadcast_expecting(mixed, 1, root, 6, "1-byte chunks");
    expect_values_of(root, mixed, "1-byte chunks");
    fill_as(rank, mixed);
    broadcast_expecting(mixed, dist::kDefaultBroadcastChunkBytes, root, 2, "250 MiB chunks");
    expect_values_of(root, mixed, "250 MiB chunks");
    // 7 float32 tensors of 12 bytes in chunks of k of them: ceil(7 / k).
    const std::vector<tp::Tensor> equal = equal_tensors(7);
    for (int k : {1, 2, 3, 7}) {
      fill_as(rank, equal);
      broadcast_expecting(equal, 12 * k, root, (7 + k - 1) / k, "chunks of " + std::to_string(k));
      expect_values_of(root, equal, "chunks of " + std::to_string(k));
    }
  }));
}

TEST_CASE("a tensor bigger than a chunk arrives whole, beside the small ones' shared chunk") {
  CHECK_NOTHROW(run_world(2, [](int rank, int) {
    // 8, 4000 and 8 bytes in 16-byte chunks: {0, 2} and {1}.
    const std::vector<tp::Tensor> tensors = {tp::zeros({2}), tp::zeros({10, 100}),
                                             tp::zeros({2})};
    fill_as(rank, tensors);
    broadcast_expecting(tensors, 16, /*root=*/1, 2, "a 4000-byte tensor, 16-byte chunks");
    expect_values_of(1, tensors, "a 4000-byte tensor, 16-byte chunks");
  }));
}

TEST_CASE("an empty list issues no broadcast on any rank, and the next collective still pairs") {
  CHECK_NOTHROW(run_world(2, [](int rank, int) {
    broadcast_expecting({}, 64, 0, 0, "an empty list");
    broadcast_expecting({tp::zeros({0})}, 64, 0, 0, "a list of empty tensors");
    const std::vector<tp::Tensor> one = {tp::zeros({3})};
    fill_as(rank, one);
    broadcast_expecting(one, 64, 0, 1, "one tensor after them");
    expect_values_of(0, one, "one tensor after them");
  }));
}

TEST_CASE("a model built differently on each rank becomes root's model, as DDP's constructor needs") {
  CHECK_NOTHROW(run_world(2, [](int rank, int) {
    tp::manual_seed(100 + rank);  // a different model on every rank
    tp::nn::MiniMLP model;
    tp::manual_seed(100 + 1);  // root's, built here to compare
    tp::nn::MiniMLP roots;
    broadcast_expecting(model.parameters(), dist::kDefaultBroadcastChunkBytes, /*root=*/1, 1,
                        "MiniMLP's parameters");
    const std::vector<tp::Tensor> got = model.parameters();
    const std::vector<tp::Tensor> want = roots.parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i].to_vector() != want[i].to_vector()) {
        TP_THROW(tp::Error, "rank ", rank, ": parameter ", i, " differs from root 1's");
      }
      if (!got[i].is_leaf()) TP_THROW(tp::Error, "rank ", rank, ": parameter ", i, " has history");
    }
  }));
}
