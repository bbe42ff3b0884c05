// What the torch_npu and torch.cuda shims share besides the graph pools (graph_pools.h):
// the allocation that never hands torch a NULL, and function addresses for the
// pluggable allocators' setters.
#pragma once

#include <cstdint>
#include <string>

#include <c10/util/Exception.h>

#include "npualloc.h"

namespace npualloc_shim {

// npualloc_malloc, with a failure thrown as torch's error carrying npualloc's message
// (c10::OutOfMemoryError for out of memory, which Python sees as
// torch.OutOfMemoryError): torch_npu reports a NULL as "Get data_ptr failed", and
// torch.cuda uses it as an address (an illegal memory access, seen on an H200).
inline void* malloc_or_throw(size_t size, int device, npualloc_stream stream) {
  void* p = npualloc_malloc(size, device, stream);
  if (p == nullptr && size != 0) {
    const char* err = npualloc_last_error();
    std::string msg = err ? err : "unknown error";
    // The C function's name the library puts first is no news to a Python user.
    const std::string function = "npualloc_malloc: ";
    if (msg.compare(0, function.size(), function) == 0) msg.erase(0, function.size());
    TORCH_CHECK_WITH(OutOfMemoryError, msg.find("out of memory") == std::string::npos,
                     "npualloc: ", msg);
    // One string argument: formatting a size_t through c10::str crashed in a shim built
    // with the GPU machine's g++ against torch 2.11 (seen in cuda-gdb), strings did not.
    TORCH_CHECK(false, "npualloc could not allocate " + std::to_string(size) + " bytes: " + msg);
  }
  return p;
}

// A function's address as the pluggable allocators' setters take it.
template <typename F>
uint64_t addr(F* f) {
  return reinterpret_cast<uint64_t>(f);
}

}  // namespace npualloc_shim
