// kernels.h without CUDA: the kit was built without the `cuda` feature.
//
// tensor.cc and ops.cc call these only for tensors on a CUDA device, and no
// such tensor can be created in this build (Storage refuses with
// tp::cuda::unavailable_reason()), so none of them is reachable. They exist
// so that tensor.cc and ops.cc need no #ifdef; each throws, naming itself,
// should that reasoning ever be broken.
#include "kernels.h"

#include "tensorplay/cuda/runtime.h"

namespace tp::cuda::kernels {
namespace {
[[noreturn]] void unreachable(const char* fn) {
  TP_THROW(Error, "tp::cuda::kernels::", fn, ": called in a build without CUDA: ",
           unavailable_reason());
}
}  // namespace

void check_current_device(const char*, const Tensor&) { unreachable("check_current_device"); }
void fill(const Tensor&, double) { unreachable("fill"); }
void copy(const Tensor&, const Tensor&) { unreachable("copy"); }
void add_scaled(const Tensor&, const Tensor&, double) { unreachable("add_scaled"); }
void scale(const Tensor&, double, bool) { unreachable("scale"); }
Tensor unary(Unary, const Tensor&, double) { unreachable("unary"); }
Tensor binary(Binary, const Tensor&, const Tensor&) { unreachable("binary"); }
Tensor add_bias(const Tensor&, const Tensor&) { unreachable("add_bias"); }
Tensor sum_all(const Tensor&, double) { unreachable("sum_all"); }
Tensor sum_dim(const Tensor&, int64_t) { unreachable("sum_dim"); }
Tensor expand(const Tensor&, int64_t, int64_t, int64_t) { unreachable("expand"); }
Tensor fill_from_scalar(const Tensor&, const Shape&, double) { unreachable("fill_from_scalar"); }
Tensor matmul(const Tensor&, const Tensor&) { unreachable("matmul"); }

}  // namespace tp::cuda::kernels
