// TP_CUDA_CHECK: a CUDA runtime call whose failure becomes a tp::Error.
//
// Only for sources compiled with CUDA (common/src/cuda/, cuda_kernels/ and
// the NCCL group). The message names the call and CUDA's own text:
//   "tp::cuda: cudaMemcpyAsync(...) failed: an illegal memory access was
//    encountered (cudaErrorIllegalAddress)".
// Kernel launches are checked with TP_CUDA_CHECK(cudaGetLastError()) right
// after the <<<...>>> line: a bad launch configuration fails there; a fault
// inside the kernel surfaces at the next synchronising call.
#pragma once

#include <cuda_runtime_api.h>

#include "tensorplay/error.h"

#define TP_CUDA_CHECK(call)                                                       \
  do {                                                                            \
    const cudaError_t tp_cuda_status_ = (call);                                   \
    if (tp_cuda_status_ != cudaSuccess) {                                         \
      TP_THROW(::tp::Error, "tp::cuda: ", #call, " failed: ",                     \
               cudaGetErrorString(tp_cuda_status_), " (",                         \
               cudaGetErrorName(tp_cuda_status_), ")");                           \
    }                                                                             \
  } while (0)
