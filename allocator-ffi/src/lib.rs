//! C ABI of npualloc: `libnpualloc.so` / `libnpualloc.a` (filled in by the C ABI issue).
