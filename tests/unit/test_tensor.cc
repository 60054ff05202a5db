// tp::Tensor: metadata, views that alias storage, in-place ops on strided
// views, factories, conversion and printing.

#include <doctest/doctest.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/cuda/runtime.h"
#include "tensorplay/tensor.h"
#include "tensorplay/ops.h"

using doctest::Contains;
using tp::Tensor;

namespace {

// 0, 1, 2, ... as a (rows, cols) tensor: element (i, j) holds i * cols + j,
// so every value names its position.
Tensor iota(const tp::Shape& shape, tp::Dtype dtype = tp::kFloat32) {
  std::vector<double> values(static_cast<std::size_t>(tp::numel_of(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i);
  return tp::tensor(values, shape, dtype);
}

using Values = std::vector<double>;

}  // namespace

// ---- shapes, dtypes, storage ----------------------------------------------------

TEST_CASE("shape helpers print sizes and compute row-major strides") {
  CHECK(tp::to_string(tp::Shape{3, 4}) == "(3, 4)");
  CHECK(tp::to_string(tp::Shape{5}) == "(5)");
  CHECK(tp::to_string(tp::Shape{}) == "()");
  CHECK(tp::numel_of({2, 3, 4}) == 24);
  CHECK(tp::numel_of({}) == 1);
  CHECK(tp::numel_of({3, 0}) == 0);
  CHECK(tp::contiguous_strides({2, 3, 4}) == tp::Strides{12, 4, 1});
  CHECK(tp::contiguous_strides({}).empty());
}

TEST_CASE("dtypes and devices have names and element sizes") {
  CHECK(tp::to_string(tp::kFloat32) == "float32");
  CHECK(tp::to_string(tp::kFloat64) == "float64");
  CHECK(tp::element_size(tp::kFloat32) == 4);
  CHECK(tp::element_size(tp::kFloat64) == 8);
  CHECK(tp::to_string(tp::kCPU) == "cpu");
  CHECK(tp::to_string(tp::Device{tp::DeviceType::CUDA, 0}) == "cuda:0");
}

TEST_CASE("a tensor too large for memory is an error naming its shape and bytes, not a bare "
          "std::bad_alloc") {
  // 2^46 float32 elements: 256 TiB, more than a process's address space, so
  // the allocation fails on every machine, whatever its overcommit policy.
  const int64_t n = int64_t{1} << 46;
  CHECK_THROWS_WITH_AS(tp::zeros({n}), doctest::Contains("tp::zeros: out of memory: could not "
                                                         "allocate 281474976710656 bytes"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::empty({n / 4, 4}, tp::kFloat32),
                       doctest::Contains("(262144.0 GiB) for a float32 tensor of shape (17592186044416, 4) on cpu; lower"),
                       tp::Error);
}

TEST_CASE("with fill_uninitialized_memory on, empty() gives NaN in every dtype; zeros() still "
          "zeros") {
  REQUIRE_FALSE(tp::fill_uninitialized_memory());  // off by default
  tp::set_fill_uninitialized_memory(true);
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64, tp::kFloat16, tp::kBFloat16}) {
    CAPTURE(tp::to_string(dtype));
    for (double v : tp::empty({5}, dtype).to_vector()) CHECK(std::isnan(v));
    for (double v : tp::zeros({5}, dtype).to_vector()) CHECK(v == 0.0);
  }
  tp::set_fill_uninitialized_memory(false);
  CHECK_FALSE(tp::fill_uninitialized_memory());
}

TEST_CASE("storage is 64-byte aligned") {
  for (std::size_t nbytes : {1, 4, 100, 4096}) {
    tp::Storage storage(nbytes, tp::kCPU);
    CHECK(reinterpret_cast<std::uintptr_t>(storage.data()) % 64 == 0);
    CHECK(storage.nbytes() == nbytes);
    CHECK(storage.device() == tp::kCPU);
  }
}

#if defined(__GLIBC__)  // the allocator's setting is glibc's (host_memory.h)
TEST_CASE("tensors freed and made again reuse their pages: no page faults per step") {
  // Note [Keeping freed pages] (common/src/host_memory.h): a step makes
  // tensors of 128 KiB and more and frees them all. Left to itself, glibc
  // maps such a block afresh or, once it has raised its mmap threshold,
  // hands the top of its heap back to the kernel when more than twice that
  // is free there: the next step faults every page in again (32 tensors of
  // 128 KiB: about 1000 faults a round). Page faults are counted, not
  // timed, so the machine's load does not change the count.
  const auto faults = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt;
  };
  const auto step = [] {
    std::vector<tp::Tensor> tensors;
    for (int i = 0; i < 32; ++i) tensors.push_back(tp::zeros({32 * 1024}));  // written
  };
  // The first rounds still grow the heap (glibc places the blocks anew
  // until its free chunks line up); after them the same pages come back.
  for (int round = 0; round < 20; ++round) step();
  const long before = faults();
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) step();
  CHECK(faults() - before < kRounds);
}
#endif

TEST_CASE("devices print and parse as cpu, cuda and cuda:N") {
  CHECK(tp::to_string(tp::kCUDA) == "cuda:0");
  CHECK(tp::to_string(tp::Device{tp::DeviceType::CUDA, -1}) == "cuda");
  CHECK(tp::parse_device("cpu") == tp::kCPU);
  CHECK(tp::parse_device("cuda:0") == tp::kCUDA);
  CHECK(tp::parse_device("cuda:3") == tp::Device{tp::DeviceType::CUDA, 3});
  CHECK(tp::parse_device("cuda") == tp::Device{tp::DeviceType::CUDA, -1});
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(tp::parse_device(bad), Contains("cpu, cuda or cuda:N"), tp::Error);
  }
}

// Runs everywhere: where CUDA cannot be used (a build without it, a machine
// without a device) every way of asking for a CUDA tensor throws, naming the
// factory or op and CUDA's reason; where it can, the same calls succeed.
TEST_CASE("asking for a CUDA tensor where CUDA is unavailable names the caller and why") {
  const tp::Device cuda{tp::DeviceType::CUDA, 0};
  if (tp::cuda::is_available()) {
    CHECK(tp::zeros({2}, tp::kFloat32, cuda).device() == cuda);
    CHECK(tp::ones({2}).to(cuda).cpu().to_vector() == Values{1, 1});
    return;
  }
  const std::string reason = tp::cuda::unavailable_reason();
  REQUIRE_FALSE(reason.empty());
  CHECK_THROWS_WITH_AS(tp::Storage(16, cuda), Contains(reason.c_str()), tp::Error);
  CHECK_THROWS_WITH_AS(tp::empty({2}, tp::kFloat32, cuda), Contains("tp::empty"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::zeros({2}, tp::kFloat32, cuda), Contains("tp::zeros"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2}, tp::kFloat64, cuda), Contains(reason.c_str()), tp::Error);
  CHECK_THROWS_WITH_AS(tp::full({2}, 3.0, tp::kFloat32, cuda), Contains("tp::full"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::tensor({1, 2}, {2}, tp::kFloat32, cuda), Contains("tp::tensor"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2}).to(cuda), Contains("tp::Tensor::to"), tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2}).to(cuda), Contains(reason.c_str()), tp::Error);
  CHECK_THROWS_WITH_AS(tp::ones({2}).cuda(), Contains(reason.c_str()), tp::Error);
}

TEST_CASE("to(device) and cpu() of a CPU tensor return the tensor itself") {
  Tensor a = iota({2, 3});
  CHECK(a.to(tp::kCPU).impl() == a.impl());
  CHECK(a.cpu().impl() == a.impl());
  CHECK(a.to(tp::Device{tp::DeviceType::CPU, 0}).impl() == a.impl());
}

// ---- factories -------------------------------------------------------------------

TEST_CASE("factories make contiguous tensors filled as asked, in both dtypes") {
  for (tp::Dtype dtype : {tp::kFloat32, tp::kFloat64}) {
    CAPTURE(tp::to_string(dtype));
    Tensor z = tp::zeros({2, 3}, dtype);
    CHECK(z.shape() == tp::Shape{2, 3});
    CHECK(z.strides() == tp::Strides{3, 1});
    CHECK(z.dtype() == dtype);
    CHECK(z.device() == tp::kCPU);
    CHECK(z.numel() == 6);
    CHECK(z.nbytes() == 6 * tp::element_size(dtype));
    CHECK(z.is_contiguous());
    CHECK(z.storage_offset() == 0);
    CHECK(z.to_vector() == Values(6, 0.0));
    CHECK(tp::ones({4}, dtype).to_vector() == Values(4, 1.0));
    CHECK(tp::full({2, 2}, 2.5, dtype).to_vector() == Values(4, 2.5));
    CHECK(tp::tensor({1, 2, 3, 4, 5, 6}, {3, 2}, dtype).to_vector() ==
          Values{1, 2, 3, 4, 5, 6});
    Tensor like = tp::zeros_like(tp::ones({5, 1}, dtype));
    CHECK(like.shape() == tp::Shape{5, 1});
    CHECK(like.dtype() == dtype);
    CHECK(like.to_vector() == Values(5, 0.0));
  }
}

TEST_CASE("a scalar tensor has shape () and one element") {
  Tensor s = tp::full({}, 3.5);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item() == 3.5);
}

TEST_CASE("factories reject a wrong value count and negative sizes") {
  CHECK_THROWS_WITH_AS(tp::tensor({1, 2, 3}, {2, 2}),
                       Contains("tp::tensor: got 3 values for shape (2, 2), which holds 4"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(tp::empty({-1, 3}), Contains("negative size -1 in shape (-1, 3)"),
                       tp::Error);
}

// ---- data access -------------------------------------------------------------------

TEST_CASE("item returns the one value and rejects tensors with more") {
  CHECK(tp::tensor({7}, {1, 1}, tp::kFloat64).item() == 7.0);
  CHECK_THROWS_WITH_AS(tp::zeros({3, 4}).item(),
                       Contains("tp::Tensor::item: the tensor has 12 elements (shape (3, 4))"),
                       tp::Error);
}

TEST_CASE("data_ptr points at element 0 of the view and checks the dtype") {
  Tensor a = iota({3, 4});
  Tensor row = a.narrow(0, 1, 1);
  CHECK(row.data_ptr<float>() == a.data_ptr<float>() + 4);
  CHECK(row.data_ptr() == static_cast<void*>(a.data_ptr<float>() + 4));
  CHECK(*row.data_ptr<float>() == 4.0f);
  CHECK_THROWS_WITH_AS(a.data_ptr<double>(),
                       Contains("the tensor's dtype is float32; use data_ptr<float>()"),
                       tp::Error);
}

TEST_CASE("an undefined tensor reports which method was called on it") {
  Tensor undefined;
  CHECK_FALSE(undefined.defined());
  CHECK_THROWS_WITH_AS(undefined.numel(), Contains("tp::Tensor::numel: called on an undefined tensor"),
                       tp::Error);
  CHECK(undefined.to_string() == "tensor(undefined)");
}

// ---- views alias storage ---------------------------------------------------------

TEST_CASE("narrow aliases storage: writes through the view reach the base") {
  Tensor a = iota({3, 4});
  Tensor middle = a.narrow(0, 1, 2);  // rows 1 and 2
  CHECK(middle.shape() == tp::Shape{2, 4});
  CHECK(middle.strides() == tp::Strides{4, 1});
  CHECK(middle.storage_offset() == 4);
  CHECK(middle.is_alias_of(a));
  CHECK(middle.is_contiguous());
  CHECK(middle.to_vector() == Values{4, 5, 6, 7, 8, 9, 10, 11});

  Tensor column = a.narrow(1, 2, 1);  // column 2: a (3, 1) view with row stride 4
  CHECK(column.shape() == tp::Shape{3, 1});
  CHECK(column.storage_offset() == 2);
  CHECK(column.to_vector() == Values{2, 6, 10});

  Tensor inner = a.narrow(1, 1, 2);  // columns 1..2: not contiguous
  CHECK_FALSE(inner.is_contiguous());
  CHECK(inner.to_vector() == Values{1, 2, 5, 6, 9, 10});

  middle.fill_(-1);
  CHECK(a.to_vector() == Values{0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1});
  // A negative dim counts from the end.
  CHECK(a.narrow(-1, 3, 1).to_vector() == Values{3, -1, -1});
}

TEST_CASE("view and flatten alias storage and view infers one -1 size") {
  Tensor a = iota({2, 6}, tp::kFloat64);
  Tensor v = a.view({3, -1});
  CHECK(v.shape() == tp::Shape{3, 4});
  CHECK(v.strides() == tp::Strides{4, 1});
  CHECK(v.is_alias_of(a));
  Tensor flat = a.flatten();
  CHECK(flat.shape() == tp::Shape{12});
  CHECK(flat.is_alias_of(a));

  flat.narrow(0, 5, 1).fill_(100);  // element 5 is a[0][5] and v[1][1]
  CHECK(a.to_vector()[5] == 100);
  CHECK(v.narrow(0, 1, 1).narrow(1, 1, 1).item() == 100);
}

TEST_CASE("a flat bucket's narrowed slots are views that write into the bucket") {
  // The DDP bucket layout: one flat tensor, each parameter's slot a view.
  Tensor bucket = tp::zeros({10});
  Tensor slot_a = bucket.narrow(0, 0, 6).view({2, 3});
  Tensor slot_b = bucket.narrow(0, 6, 4).view({4});
  slot_a.fill_(1);
  slot_b.add_(tp::tensor({1, 2, 3, 4}, {4}));
  CHECK(bucket.to_vector() == Values{1, 1, 1, 1, 1, 1, 1, 2, 3, 4});
  CHECK(slot_b.storage_offset() == 6);
}

TEST_CASE("t swaps sizes and strides without copying") {
  Tensor a = iota({2, 3});
  Tensor at = a.t();
  CHECK(at.shape() == tp::Shape{3, 2});
  CHECK(at.strides() == tp::Strides{1, 3});
  CHECK(at.is_alias_of(a));
  CHECK_FALSE(at.is_contiguous());
  CHECK(at.to_vector() == Values{0, 3, 1, 4, 2, 5});
  at.narrow(0, 2, 1).fill_(9);  // at[2][*] is a[*][2]
  CHECK(a.to_vector() == Values{0, 1, 9, 3, 4, 9});
  CHECK(at.t().is_contiguous());
}

TEST_CASE("the stride of a size-1 dim does not break contiguity") {
  Tensor row = iota({4, 1}).narrow(0, 1, 2).t();  // shape (1, 2), strides (1, 1)
  CHECK(row.is_contiguous());
  CHECK(row.view({2}).to_vector() == Values{1, 2});
  Tensor column_t = iota({4, 1}).t();  // shape (1, 4), strides (1, 1)
  CHECK(column_t.is_contiguous());
  CHECK(column_t.view({4}).to_vector() == Values{0, 1, 2, 3});
}

TEST_CASE("view of a non-contiguous tensor is refused and names contiguous()") {
  Tensor at = iota({2, 3}).t();
  CHECK_THROWS_WITH_AS(at.view({6}),
                       Contains("tp::Tensor::view: the tensor of shape (3, 2) and strides (1, 3) "
                                "is not contiguous"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(at.view({6}), Contains("call contiguous() first"), tp::Error);
  CHECK(at.contiguous().view({6}).to_vector() == Values{0, 3, 1, 4, 2, 5});
}

TEST_CASE("view rejects a shape with another element count") {
  CHECK_THROWS_WITH_AS(iota({2, 3}).view({4, 2}),
                       Contains("shape (4, 2) has 8 elements but the tensor of shape (2, 3) has 6"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(iota({2, 3}).view({-1, 4}), Contains("invalid for a tensor of 6 elements"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(iota({2, 3}).view({-1, -1}), Contains("more than one -1"), tp::Error);
}

TEST_CASE("narrow out of range names the range, the dimension and its size") {
  Tensor a = tp::zeros({4, 3});
  CHECK_THROWS_WITH_AS(a.narrow(0, 2, 3),
                       Contains("tp::Tensor::narrow: range [2, 5) is out of bounds for "
                                "dimension 0 of size 4 (shape (4, 3))"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(a.narrow(0, -1, 1), Contains("out of bounds"), tp::Error);
  CHECK_THROWS_WITH_AS(a.narrow(2, 0, 1), Contains("dimension 2 is out of range"), tp::Error);
}

TEST_CASE("t of a tensor that is not 2-D is refused") {
  CHECK_THROWS_WITH_AS(tp::zeros({3}).t(),
                       Contains("tp::Tensor::t: expects a 2-D tensor, got shape (3)"), tp::Error);
}

// ---- copies --------------------------------------------------------------------------

TEST_CASE("clone copies into fresh contiguous storage") {
  Tensor at = iota({2, 3}).t();
  Tensor copy = at.clone();
  CHECK_FALSE(copy.is_alias_of(at));
  CHECK(copy.is_contiguous());
  CHECK(copy.to_vector() == at.to_vector());
  copy.fill_(0);
  CHECK(at.to_vector() == Values{0, 3, 1, 4, 2, 5});
}

TEST_CASE("contiguous returns the same tensor when already contiguous, else a copy") {
  Tensor a = iota({2, 3});
  CHECK(a.contiguous().impl() == a.impl());
  Tensor c = a.t().contiguous();
  CHECK_FALSE(c.is_alias_of(a));
  CHECK(c.strides() == tp::Strides{2, 1});
  CHECK(c.to_vector() == Values{0, 3, 1, 4, 2, 5});
}

TEST_CASE("detach shares storage and drops autograd history") {
  Tensor w = tp::ones({2, 2}).requires_grad_();
  Tensor y = w.t();
  Tensor d = y.detach();
  CHECK(d.is_alias_of(w));
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.strides() == y.strides());
}

TEST_CASE("to converts the dtype into a contiguous copy") {
  Tensor a = tp::tensor({0.1, 2.5, -3}, {3}, tp::kFloat64);
  Tensor f = a.to(tp::kFloat32);
  CHECK(f.dtype() == tp::kFloat32);
  CHECK_FALSE(f.is_alias_of(a));
  CHECK(f.to_vector()[0] == static_cast<double>(0.1f));
  CHECK(f.to_vector()[1] == 2.5);
  Tensor back = iota({2, 3}).t().to(tp::kFloat64);
  CHECK(back.is_contiguous());
  CHECK(back.to_vector() == Values{0, 3, 1, 4, 2, 5});
}

// ---- in-place ops ----------------------------------------------------------------

TEST_CASE("in-place ops write through non-contiguous views") {
  Tensor a = iota({3, 4}, tp::kFloat64);
  Tensor inner = a.narrow(1, 1, 2);  // (3, 2), strides (4, 1), offset 1

  SUBCASE("fill_ and zero_") {
    inner.fill_(7);
    CHECK(a.to_vector() == Values{0, 7, 7, 3, 4, 7, 7, 7, 8, 7, 7, 11});
    inner.zero_();
    CHECK(a.to_vector() == Values{0, 0, 0, 3, 4, 0, 0, 7, 8, 0, 0, 11});
  }
  SUBCASE("mul_ and div_") {
    inner.mul_(10);
    CHECK(a.to_vector() == Values{0, 10, 20, 3, 4, 50, 60, 7, 8, 90, 100, 11});
    inner.div_(10);
    CHECK(a.to_vector() == iota({3, 4}).to_vector());
  }
  SUBCASE("add_ from a transposed view, with alpha") {
    Tensor other = tp::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, tp::kFloat64).t();  // (3, 2)
    inner.add_(other, 2.0);  // inner[i][j] += 2 * other[i][j]
    CHECK(a.to_vector() == Values{0, 1 + 2, 2 + 8, 3, 4, 5 + 4, 6 + 10, 7, 8, 9 + 6, 10 + 12, 11});
  }
  SUBCASE("copy_ into a transposed view converts the dtype") {
    Tensor at = a.t();  // (4, 3)
    at.copy_(tp::tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {4, 3}, tp::kFloat32));
    // at[i][j] = 3i + j lands at a[j][i].
    CHECK(a.to_vector() == Values{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11});
  }
}

TEST_CASE("in-place ops walk a 3-D strided view in row-major order") {
  Tensor a = iota({2, 3, 4});
  Tensor v = a.narrow(2, 1, 2).narrow(1, 1, 2);  // (2, 2, 2)
  CHECK(v.to_vector() == Values{5, 6, 9, 10, 17, 18, 21, 22});
  v.mul_(-1);
  const Values after = a.to_vector();
  CHECK(after[5] == -5);
  CHECK(after[22] == -22);
  CHECK(after[4] == 4);
  CHECK(after[7] == 7);
  CHECK(after[13] == 13);
}

TEST_CASE("in-place ops record no autograd history, even with grad mode on") {
  Tensor w = tp::ones({2}).requires_grad_();
  Tensor y = tp::mul(w, 2.0);  // a non-leaf with history
  const auto history = y.grad_fn();
  y.mul_(3).add_(tp::ones({2})).div_(7);
  CHECK(y.grad_fn() == history);  // the same node: nothing was recorded
  CHECK(y.to_vector() == Values{1, 1});
  {
    tp::NoGradGuard no_grad;
    w.mul_(3);
  }
  CHECK(w.is_leaf());
  CHECK(w.to_vector() == Values{3, 3});
}

TEST_CASE("writing into a leaf that requires grad needs NoGradGuard or detach()") {
  Tensor w = tp::ones({2}).requires_grad_();
  CHECK_THROWS_WITH_AS(w.mul_(3), doctest::Contains("tp::Tensor::mul_: writes into a leaf that "
                                                    "requires grad while grad mode is on"),
                       tp::Error);
  CHECK_THROWS_AS(w.zero_(), tp::Error);
  CHECK_THROWS_AS(w.add_(tp::ones({2})), tp::Error);
  w.detach().mul_(2);  // same storage, no autograd: allowed
  {
    tp::NoGradGuard no_grad;
    w.add_(tp::ones({2}));
  }
  CHECK(w.to_vector() == Values{3, 3});
}

TEST_CASE("copy_ and add_ read an overlapping source as it was before the call") {
  Tensor a = iota({2, 2});  // [[0, 1], [2, 3]]
  a.add_(a.t());
  CHECK(a.to_vector() == Values{0, 3, 3, 6});
  Tensor c = iota({2, 2});
  c.copy_(c.t());
  CHECK(c.to_vector() == Values{0, 2, 1, 3});
  Tensor d = iota({4});  // shifted overlap: d[1:4] = d[0:3]
  d.narrow(0, 1, 3).copy_(d.narrow(0, 0, 3));
  CHECK(d.to_vector() == Values{0, 0, 1, 2});
  Tensor e = iota({3});  // the very same view is fine without a copy
  e.add_(e);
  CHECK(e.to_vector() == Values{0, 2, 4});
}

TEST_CASE("a storage counts the bytes copy_ writes into it, a self-copy too, until taken") {
  Tensor bucket = tp::zeros({6});  // float32: 24 bytes
  const auto& storage = bucket.storage();
  CHECK(storage->take_bytes_copied_in() == 0);  // zeros() copied nothing
  Tensor slot = bucket.narrow(0, 2, 3);
  slot.copy_(tp::ones({3}));
  CHECK(storage->take_bytes_copied_in() == 12);  // the view's bytes
  CHECK(storage->take_bytes_copied_in() == 0);   // taking resets
  slot.copy_(slot);  // onto itself: still a copy, and counted
  bucket.copy_(tp::ones({6}, tp::kFloat64));  // converted: the destination's bytes
  CHECK(storage->take_bytes_copied_in() == 12 + 24);
  tp::ones({6}).copy_(bucket);  // the source's storage counts nothing
  CHECK(storage->take_bytes_copied_in() == 0);
  // A leaf's first gradient starts at 0, even when the engine cloned it
  // (here from the caller's gradient, which the leaf must not alias).
  Tensor w = tp::ones({3});
  w.requires_grad_(true);
  const Tensor given = tp::ones({3});
  w.view({3}).backward(given);
  REQUIRE_FALSE(w.grad().is_alias_of(given));
  CHECK(w.grad().storage()->take_bytes_copied_in() == 0);
}

TEST_CASE("add_ and copy_ reject mismatched shapes; add_ rejects mixed dtypes") {
  Tensor a = tp::zeros({3});
  CHECK_THROWS_WITH_AS(a.add_(tp::zeros({4})),
                       Contains("tp::Tensor::add_: shapes (3) and (4) differ"), tp::Error);
  CHECK_THROWS_WITH_AS(a.add_(tp::zeros({3}, tp::kFloat64)),
                       Contains("dtypes float32 and float64 differ"), tp::Error);
  CHECK_THROWS_WITH_AS(a.copy_(tp::zeros({2, 2})),
                       Contains("tp::Tensor::copy_: shapes (3) (destination) and (2, 2)"),
                       tp::Error);
}

// ---- math helpers on Tensor ----------------------------------------------------------

TEST_CASE("norm is the Euclidean norm of all elements, also of a view") {
  CHECK(tp::tensor({3, 4}, {2}).norm() == 5.0);
  CHECK(iota({2, 3}).t().norm() == doctest::Approx(std::sqrt(55.0)));
}

// ---- printing ------------------------------------------------------------------------

TEST_CASE("to_string prints values row-major with the dtype") {
  CHECK(tp::tensor({1, 2, 3, 4}, {2, 2}).to_string() == "tensor([[1, 2], [3, 4]], dtype=float32)");
  CHECK(tp::tensor({1, 2, 3, 4}, {2, 2}).t().to_string() ==
        "tensor([[1, 3], [2, 4]], dtype=float32)");
  CHECK(tp::full({}, 2.5, tp::kFloat64).to_string() == "tensor(2.5, dtype=float64)");
  CHECK(tp::zeros({0}).to_string() == "tensor([], dtype=float32)");
  CHECK(tp::ones({2}).requires_grad_().to_string() ==
        "tensor([1, 1], dtype=float32, requires_grad=true)");
}

TEST_CASE("to_string elides the middle of long tensors") {
  const std::string s = iota({2000}).to_string();
  CHECK(s == "tensor([0, 1, 2, ..., 1997, 1998, 1999], dtype=float32)");
}

// ---- autograd metadata on Tensor ---------------------------------------------------

TEST_CASE("views of a tensor that requires grad record a grad_fn; under no_grad they do not") {
  Tensor w = tp::ones({2, 3}).requires_grad_();
  CHECK(w.is_leaf());
  CHECK(w.view({6}).grad_fn()->name() == "ViewBackward");
  CHECK(w.narrow(0, 0, 1).grad_fn()->name() == "NarrowBackward");
  CHECK(w.t().grad_fn()->name() == "TBackward");
  CHECK(w.clone().grad_fn()->name() == "CloneBackward");
  CHECK(w.t().contiguous().grad_fn()->name() == "CloneBackward");
  CHECK(w.t().to_string() ==
        "tensor([[1, 1], [1, 1], [1, 1]], dtype=float32, grad_fn=<TBackward>)");
  tp::NoGradGuard no_grad;
  CHECK(w.view({6}).is_leaf());
  CHECK_FALSE(w.t().requires_grad());
}

TEST_CASE("requires_grad_ is for leaves only") {
  Tensor w = tp::ones({2}).requires_grad_();
  Tensor y = w.view({2, 1});
  CHECK_THROWS_WITH_AS(y.requires_grad_(false),
                       Contains("tp::Tensor::requires_grad_: this tensor is not a leaf "
                                "(it was produced by ViewBackward)"),
                       tp::Error);
  CHECK(w.requires_grad_(false).requires_grad() == false);
}

TEST_CASE("set_grad checks shape and dtype; an undefined tensor clears the grad") {
  Tensor w = tp::ones({2, 3});
  w.set_grad(tp::full({2, 3}, 4.0));
  CHECK(w.grad().to_vector() == Values(6, 4.0));
  CHECK_THROWS_WITH_AS(w.set_grad(tp::zeros({3, 2})),
                       Contains("tp::Tensor::set_grad: the gradient has shape (3, 2) but the "
                                "tensor has shape (2, 3)"),
                       tp::Error);
  CHECK_THROWS_WITH_AS(w.set_grad(tp::zeros({2, 3}, tp::kFloat64)),
                       Contains("the gradient has dtype float64 but the tensor has dtype float32"),
                       tp::Error);
  w.set_grad(Tensor());
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("grad returns a handle: writing into it changes the gradient") {
  Tensor w = tp::ones({3});
  w.set_grad(tp::zeros({3}));
  w.grad().add_(tp::ones({3}));
  CHECK(w.grad().to_vector() == Values(3, 1.0));
}
