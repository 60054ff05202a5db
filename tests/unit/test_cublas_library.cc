// cuBLAS is opened on the first CUDA matmul, not linked
// (common/src/cuda/cublas_library.h): these run without a GPU, since opening
// the library and looking up its entry points needs no device.
#include <dlfcn.h>

#include <doctest/doctest.h>

#include <string>

#include "../../common/src/cuda/cublas_library.h"

namespace {

// Whether the library `soname` is already loaded in this process.
bool loaded(const std::string& soname) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

}  // namespace

TEST_CASE("cuBLAS is not loaded until a CUDA matmul asks for it, then has every entry point") {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  // A process that only links libtensorplay starts without cuBLAS (and
  // without its 500 MB libcublasLt): no start-up cost.
  CHECK_FALSE(loaded(soname));
  const tp::cuda::kernels::CublasLibrary& lib = tp::cuda::kernels::cublas();
  CHECK(loaded(soname));
  CHECK((lib.create != nullptr));
  CHECK((lib.set_math_mode != nullptr));
  CHECK((lib.set_stream != nullptr));
  CHECK((lib.sgemm != nullptr));
  CHECK((lib.dgemm != nullptr));
  // The status texts come from the opened library, as TP_CUBLAS_CHECK prints them.
  CHECK(std::string(lib.status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(&tp::cuda::kernels::cublas() == &lib);  // opened once
}
