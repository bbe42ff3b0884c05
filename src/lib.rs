//! npualloc: a caching device-memory allocator for Ascend NPUs with cross-stream
//! lifetime tracking.
//!
//! The allocator ([`CachingAllocator`]) sits on a [`device::Device`]; blocks are cached
//! per stream, split and coalesced, and blocks used on other streams
//! ([`CachingAllocator::record_stream`]) return to their pool only once events recorded
//! on those streams complete.
#![warn(missing_docs)]

pub mod allocator;
pub mod config;
pub mod device;
pub mod error;
pub mod handle;
pub(crate) mod loader;
pub mod pickle;
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
pub use pool::PoolKind;
pub use stats::{DeviceStats, Stat, StatType};
