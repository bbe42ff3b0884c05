// The C++ shim between torch.cuda's CUDAPluggableAllocator and npualloc's C ABI.
//
// torch.cuda's pluggable allocator uses the pointer its malloc function returns as it
// is: a NULL (out of memory, a memory fraction passed) becomes a tensor at address 0
// and, at the first kernel, an illegal memory access that poisons the CUDA context
// (seen on an H200 with torch 2.11). npualloc_cuda_shim_malloc calls npualloc_malloc
// and throws torch's error instead, with npualloc's message: c10::OutOfMemoryError for
// out of memory, which Python sees as torch.OutOfMemoryError, as with PyTorch's own
// allocator. Everything else torch.cuda passes plain C types, so it goes straight to
// the C ABI (npualloc.install_cuda sets those hooks).
#include <string>

#include <c10/util/Exception.h>
#include <torch/extension.h>

#include "npualloc.h"

extern "C" __attribute__((visibility("default"))) void* npualloc_cuda_shim_malloc(size_t size, int device,
                                                                                void* stream) {
  void* p = npualloc_malloc(size, device, static_cast<npualloc_stream>(stream));
  if (p == nullptr && size != 0) {
    const char* err = npualloc_last_error();
    std::string msg = err ? err : "unknown error";
    TORCH_CHECK_WITH(OutOfMemoryError, msg.find("out of memory") == std::string::npos,
                     "npualloc: ", msg);
    TORCH_CHECK(false, "npualloc could not allocate ", size, " bytes: ", msg);
  }
  return p;
}

extern "C" __attribute__((visibility("default"))) void npualloc_cuda_shim_free(void* ptr, size_t size,
                                                                             int device, void* stream) {
  npualloc_free(ptr, size, device, static_cast<npualloc_stream>(stream));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // For tests without a GPU (simulated device): allocates `size` bytes on the default
  // stream through the shim and frees them; errors surface as the shim throws them.
  m.def("malloc_then_free", [](size_t size, int device) {
    void* p = npualloc_cuda_shim_malloc(size, device, nullptr);
    npualloc_cuda_shim_free(p, size, device, nullptr);
    return p != nullptr;
  });
}
