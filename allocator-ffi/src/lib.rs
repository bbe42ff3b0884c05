//! C ABI of npualloc: `libnpualloc.so` and `libnpualloc.a`.
//!
//! The entry points match what torch_npu's `NPUPluggableAllocator` and torch's
//! `CUDAPluggableAllocator` load (`npualloc_malloc`, `npualloc_free` and the setters'
//! functions), plus an extended API returning `NPUALLOC_ERR_*` codes. Every exported
//! function runs inside [`panic::boundary`]: no panic crosses the ABI, nothing is
//! printed, and failures leave a message in `npualloc_last_error()`.
//!
//! One allocator per device is created lazily, over the backend named by
//! `NPUALLOC_BACKEND`, with settings from `NPUALLOC_CONF` / `PYTORCH_NPU_ALLOC_CONF`.
#![allow(non_camel_case_types)]
// Exported functions are called from C; each pointer argument's contract is in its doc
// comment and each dereference has a SAFETY note, as in rustls-ffi.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
#![warn(missing_docs)]

mod api;
mod error;
mod hccl;
mod history;
mod hooks;
mod mstx;
mod panic;
mod pools;
mod record;
mod runtime;
mod sim_api;
mod summary;
mod tag_registry;
mod tags;
mod types;

pub use api::*;
pub use error::*;
pub use hccl::*;
pub use history::*;
pub use hooks::npualloc_runtime_hooks;
pub use mstx::*;
pub use pools::*;
pub use sim_api::*;
pub use summary::*;
pub use tags::*;
pub use types::*;
