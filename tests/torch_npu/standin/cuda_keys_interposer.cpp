// LD_PRELOAD interposer: torch's CUDA allocator-config registration goes to a scratch
// set, so the process's allocator-config keys are those of torch's CPU build plus
// torch_npu's, as on an Ascend machine.
//
// Why: torch 2.14 from PyPI on x86-64 is the CUDA build. At load, libc10_cuda.so
// registers its allocator-config keys and parser hook with c10's
// AcceleratorAllocatorConfig (registerDeviceConfigParserHook, inline in
// c10/core/AllocatorConfig.h); libtorch_npu.so then registers its own, and the key
// `pinned_reserve_segment_size_mb`, which both register, aborts the process ("Duplicated
// key"). On Ascend machines torch is the CPU build and libc10_cuda does not exist.
//
// How: the inline registration is compiled into each library and calls c10's exported
// getMutableKeys() and getConfigParserHook() through the PLT. This library defines both;
// a call whose return address lies in libc10_cuda.so gets a scratch set / hook, every
// other call (c10 itself, libtorch_npu) gets c10's real one (dlsym in libc10.so). The real
// set therefore holds c10's keys plus every key torch_npu registers, nothing is removed
// from it, and torch_npu's parser hook is the one installed: exactly the CPU build's
// state. Nothing else of torch.cuda is touched (it is not used: there is no GPU).
//
// Built by gen_standin.py into the stand-in folder; tests/torch_npu/run.sh preloads it.

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_set>

namespace {

using KeySet = std::unordered_set<std::string>;
using Hook = std::function<void(const std::string&)>;

bool from_c10_cuda(void* ret) {
  Dl_info info;
  if (dladdr(ret, &info) == 0 || info.dli_fname == nullptr) return false;
  const char* base = std::strrchr(info.dli_fname, '/');
  return std::strcmp(base ? base + 1 : info.dli_fname, "libc10_cuda.so") == 0;
}

template <typename F>
F real(const char* name) {
  // libc10 is loaded (a dependency of every caller) but may not be in the global
  // scope (torch's extension is loaded RTLD_LOCAL), so ask it by name.
  void* c10 = dlopen("libc10.so", RTLD_LAZY | RTLD_NOLOAD);
  void* f = c10 ? dlsym(c10, name) : dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    std::fprintf(stderr, "cuda_keys_interposer: %s not found in libc10: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"), noinline)) KeySet& interposed_get_mutable_keys() __asm__(
    "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11Ev");
__attribute__((visibility("default"), noinline)) Hook& interposed_get_config_parser_hook() __asm__(
    "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11Ev");

KeySet& interposed_get_mutable_keys() {
  static KeySet scratch;
  if (from_c10_cuda(__builtin_return_address(0))) return scratch;
  static auto fn = real<KeySet& (*)()>(
      "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig14getMutableKeysB5cxx11Ev");
  return fn();
}

Hook& interposed_get_config_parser_hook() {
  static Hook scratch;
  if (from_c10_cuda(__builtin_return_address(0))) return scratch;
  static auto fn = real<Hook& (*)()>(
      "_ZN3c1016CachingAllocator26AcceleratorAllocatorConfig19getConfigParserHookB5cxx11Ev");
  return fn();
}
}
