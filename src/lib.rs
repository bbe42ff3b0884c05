//! npualloc: a caching device-memory allocator for Ascend NPUs with cross-stream
//! lifetime tracking.
//!
//! The allocator ([`CachingAllocator`]) sits on a [`device::Device`]: the Ascend runtime
//! (`libascendcl.so`, loaded at run time), the CUDA runtime (for validation on NVIDIA
//! cards) or the [simulated device](device::sim) with real asynchronous streams. Blocks
//! are cached per stream, split and coalesced; a block used on other streams
//! ([`CachingAllocator::record_stream`]) returns to its pool only once events recorded on
//! those streams complete, polled, never waited for on the host in the fast path.
//! Statistics ([`DeviceStats`]) mean what PyTorch's mean and print as torch_npu's
//! `memory_summary()` table.
//!
//! ```
//! use npualloc::device::sim::{SimConfig, SimDevice};
//! use npualloc::summary::{Fragmentation, MemorySummary};
//! use npualloc::{CachingAllocator, Config, StatType};
//!
//! // A simulated NPU of 1 GiB (manual mode: its streams run when the caller says).
//! let sim = SimDevice::new(SimConfig { capacity: 1 << 30, ..SimConfig::default() });
//! let side = sim.create_stream(0).unwrap();
//! let alloc = CachingAllocator::new(sim.clone(), 0, Config::parse("max_split_size_mb:128").unwrap()).unwrap();
//!
//! let a = alloc.malloc(3 << 20, npualloc::StreamHandle::DEFAULT).unwrap();
//! alloc.record_stream(a, side).unwrap(); // also used on `side`
//! alloc.free(a).unwrap(); // reused only once `side` has run past this point
//!
//! let stats = alloc.stats();
//! assert_eq!(stats.allocation[StatType::Aggregate].allocated, 1);
//! assert_eq!(stats.allocated_bytes[StatType::LargePool].peak, 3 << 20);
//! // torch_npu's memory_summary() table, and where the reserve goes.
//! let text = MemorySummary::new(&stats, Some(0))
//!     .with_fragmentation(Fragmentation::of(&alloc.segments()))
//!     .to_string();
//! assert!(text.contains("PyTorch NPU memory summary, device ID 0"));
//! alloc.empty_cache().unwrap();
//! alloc.check_invariants().unwrap();
//! ```
//!
//! Who uses which part:
//! - **torch_npu users** do not use this crate directly: `pip install ./python` then
//!   `npualloc.install()` puts the C library (`allocator-ffi`, `libnpualloc.so`) into
//!   torch_npu; settings come from `PYTORCH_NPU_ALLOC_CONF` / `NPUALLOC_CONF` (see
//!   [`Config`]).
//! - **Runtime authors** embedding the allocator in Rust: implement [`device::Device`]
//!   for the runtime (or use the ACL / CUDA backends in [`device`]), create one
//!   [`CachingAllocator`] per device, and call `malloc`, `free`, `record_stream`,
//!   `stats`, `empty_cache`; graph-private pools are `begin_allocate_to_pool` /
//!   `end_allocate_to_pool` / `release_pool`.
//! - **People comparing allocators** use the `npualloc` command (feature `cli`, on by
//!   default): `npualloc replay` runs a trace or a torch snapshot through the allocator on
//!   the simulated device with any settings side by side (`--conf pytorch` and
//!   `--conf torch_npu` are PyTorch's and torch_npu's own policies), `--min-capacity`
//!   finds the smallest device a workload fits on, `--blame` says which call sites hold
//!   and waste memory at the peak, and `npualloc tune` searches the settings.
#![warn(missing_docs)]

pub mod allocator;
pub mod config;
pub mod device;
pub mod error;
pub mod handle;
pub(crate) mod loader;
pub mod pickle;
pub mod policy;
pub(crate) mod pool;
pub mod profiling;
#[cfg(feature = "cli")]
pub mod replay;
pub mod snapshot;
pub mod stats;
pub(crate) mod stream;
pub mod summary;
#[cfg(feature = "cli")]
pub mod trace;

pub use allocator::{CachingAllocator, OomInfo};
pub use config::Config;
pub use device::{Device, DeviceError, DeviceIndex, DevicePtr, EventHandle, StreamHandle};
pub use error::Error;
pub use handle::MempoolId;
pub use policy::{Policy, Regime};
pub use pool::PoolKind;
pub use stats::{DeviceStats, PrivatePoolStats, Stat, StatType};
