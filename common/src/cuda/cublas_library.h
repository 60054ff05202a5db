// cuBLAS, loaded the first time a CUDA matmul needs it.
//
// Why not link it: libcublas pulls in libcublasLt (over 500 MB), whose
// loading and static initialisation cost every process that links it about
// 0.45 s of CPU at start, GPU or not. Every test, checker, planted bug and
// launched rank of the kit starts a process, and almost none multiplies on
// a GPU. So libtensorplay names cuBLAS nowhere in its links; the first CUDA
// matmul dlopen()s it and looks up the few entry points blas.cc calls.
//
// Thread safety: cublas() may be called from any thread; the library is
// loaded once (a function-local static). Errors: a missing library or entry
// point is a tp::Error naming what was looked for, where, and the fix.
#pragma once

#include <cublas_v2.h>

namespace tp::cuda::kernels {

// The cuBLAS entry points the kit calls, as the library exports them
// (cublas_v2.h maps cublasCreate to cublasCreate_v2 and so on).
struct CublasLibrary {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasDgemm_v2) dgemm;
  decltype(&cublasGetStatusString) status_string;
  decltype(&cublasGetStatusName) status_name;
};

// The loaded library; throws tp::Error when it cannot be found or lacks an
// entry point. The library stays loaded until the process exits.
const CublasLibrary& cublas();

}  // namespace tp::cuda::kernels
