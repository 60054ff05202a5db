// See cublas_library.h: cuBLAS is opened on first use, not linked.
#include "cublas_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tensorplay/error.h"

// The toolkit's library folders, as the build found them (':'-separated);
// the bare soname is tried after them, so LD_LIBRARY_PATH and ld.so.conf work.
#ifndef TP_CUBLAS_DIRS
#define TP_CUBLAS_DIRS ""
#endif

namespace tp::cuda::kernels {
namespace {

// libcublas.so.13 for CUDA 13: the soname of the major version the kit was
// compiled against (cublas_api.h), never an unversioned libcublas.so, which
// only a development install has and which may be another version.
std::string soname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

void* open_library(std::string& tried) {
  std::vector<std::string> candidates;
  const std::string dirs = TP_CUBLAS_DIRS;
  std::size_t begin = 0;
  while (begin <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', begin), dirs.size());
    if (end > begin) candidates.push_back(dirs.substr(begin, end - begin) + "/" + soname());
    begin = end + 1;
  }
  candidates.push_back(soname());
  for (const std::string& path : candidates) {
    // RTLD_LOCAL: its symbols serve only the lookups below.
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    tried += "\n  " + path + ": " + dlerror();
  }
  return nullptr;
}

template <typename Fn>
void look_up(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr) {
    TP_THROW(::tp::Error, "tp::cuda: ", soname(), " has no entry point ", name,
             ": the library found is not the cuBLAS the kit was built against (CUDA ",
             CUBLAS_VER_MAJOR, "); reconfigure the build against the installed toolkit");
  }
}

CublasLibrary load() {
  std::string tried;
  void* handle = open_library(tried);
  if (handle == nullptr) {
    TP_THROW(::tp::Error, "tp::cuda: a CUDA matmul needs cuBLAS, and ", soname(),
             " could not be opened; tried:", tried,
             "\nInstall the CUDA toolkit's cuBLAS, or put its folder on LD_LIBRARY_PATH");
  }
  CublasLibrary lib{};
  look_up(handle, "cublasCreate_v2", lib.create);
  look_up(handle, "cublasSetMathMode", lib.set_math_mode);
  look_up(handle, "cublasSetStream_v2", lib.set_stream);
  look_up(handle, "cublasSgemm_v2", lib.sgemm);
  look_up(handle, "cublasDgemm_v2", lib.dgemm);
  look_up(handle, "cublasGetStatusString", lib.status_string);
  look_up(handle, "cublasGetStatusName", lib.status_name);
  return lib;
}

}  // namespace

const CublasLibrary& cublas() {
  static const CublasLibrary lib = load();
  return lib;
}

}  // namespace tp::cuda::kernels
