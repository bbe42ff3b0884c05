//! The caching allocator of one device.
//!
//! `malloc` order (PyTorch's): poll pending frees → best fit in the stream's pool →
//! garbage collection (with a memory fraction) → device malloc → release oversize
//! cached blocks and retry → release every cached segment (synchronising events) and
//! retry → out of memory.
//!
//! Locking: all block state sits behind one mutex per device; the pointer → block map
//! is a `DashMap` so a free finds its block without scanning. Device calls are made
//! with the mutex held, as PyTorch does by default.

mod invariants;
mod oom;
mod state;

use std::sync::Arc;

use dashmap::DashMap;
use parking_lot::Mutex;
use rustc_hash::FxBuildHasher;

use crate::config::Config;
use crate::device::{Device, DeviceIndex, DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::BlockId;
use crate::profiling::Mstx;
use crate::stats::DeviceStats;
use state::State;

pub use state::{BlockInfo, BlockState, SegmentInfo};

/// Current memory use of one allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of live allocations (rounded block sizes).
    pub allocated: usize,
    /// Device bytes held.
    pub reserved: usize,
}

/// A thread-safe caching allocator for one device.
pub struct CachingAllocator {
    device: Arc<dyn Device>,
    index: DeviceIndex,
    state: Mutex<State>,
    ptrs: DashMap<DevicePtr, BlockId, FxBuildHasher>,
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("backend", &self.device.name())
            .field("device", &self.index)
            .finish()
    }
}

impl CachingAllocator {
    /// Creates the allocator of device `index` with `config`.
    pub fn new(device: Arc<dyn Device>, index: i64, config: Config) -> Result<Self, Error> {
        let count = device.device_count();
        if index < 0 || index as u64 >= count as u64 {
            return Err(Error::InvalidDevice {
                device: index,
                count,
            });
        }
        Ok(CachingAllocator {
            device,
            index: index as DeviceIndex,
            state: Mutex::new(State::new(config, Mstx::global())),
            ptrs: DashMap::with_hasher(FxBuildHasher),
        })
    }

    /// Uses `markers` for profiler ranges instead of the process-wide mstx library.
    pub fn with_markers(self, markers: Arc<Mstx>) -> Self {
        self.state.lock().markers = markers;
        self
    }

    /// The device index this allocator serves.
    pub fn device_index(&self) -> DeviceIndex {
        self.index
    }

    /// The backend beneath.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Allocates at least `size` bytes for use on `stream`.
    pub fn malloc(&self, size: usize, stream: StreamHandle) -> Result<DevicePtr, Error> {
        let mut st = self.state.lock();
        let (ptr, id) = st.malloc(&*self.device, self.index, size, stream)?;
        self.ptrs.insert(ptr, id);
        Ok(ptr)
    }

    /// Frees `ptr`. If it was used on other streams, it is reused only after work
    /// queued on them at this moment has completed.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), Error> {
        let (_, id) = self
            .ptrs
            .remove(&ptr)
            .ok_or(Error::UnknownPointer { ptr })?;
        self.state.lock().free(&*self.device, self.index, id);
        Ok(())
    }

    /// Marks `ptr` as used on `stream` (a no-op for the block's own stream).
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamHandle) -> Result<(), Error> {
        let id = *self.ptrs.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.state
            .lock()
            .record_stream(&*self.device, self.index, id, ptr, stream)
    }

    /// Forgets a use of `ptr` on `stream` recorded earlier (torch_npu's `erase_stream`).
    pub fn erase_stream(&self, ptr: DevicePtr, stream: StreamHandle) -> Result<(), Error> {
        let id = *self.ptrs.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.state.lock().erase_stream(id, ptr, stream)
    }

    /// Whether `ptr` is a live allocation of this allocator.
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        self.ptrs.contains_key(&ptr)
    }

    /// Start and size of the segment holding `ptr` (which must be a live allocation).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize), Error> {
        let id = *self.ptrs.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
        Ok(self.state.lock().segment_of(id))
    }

    /// Waits for every pending event, then returns every unused cached segment (and
    /// idle event) to the device.
    pub fn empty_cache(&self) -> Result<(), Error> {
        self.state.lock().empty_cache(&*self.device, self.index)
    }

    /// Merges recently freed blocks (the hot cache) into the free lists now; this also
    /// happens by itself before any device allocation or cache release.
    pub fn coalesce_now(&self) {
        self.state.lock().flush_hot();
    }

    /// Caps reserved memory at `fraction` of the device's total memory.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&fraction) || fraction.is_nan() {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {fraction} is not within [0, 1]"
            )));
        }
        let total = self.device.mem_info(self.index)?.total;
        self.state.lock().allowed_max = Some((fraction * total as f64) as usize);
        Ok(())
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock().stats_snapshot()
    }

    /// Current allocated and reserved bytes (cheaper than [`CachingAllocator::stats`]).
    pub fn usage(&self) -> Usage {
        let st = self.state.lock();
        Usage {
            allocated: st.stats.allocated_bytes[0].current.max(0) as usize,
            reserved: st.reserved,
        }
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.state.lock().stats.reset_peak();
    }

    /// Zeroes the accumulated (`allocated`/`freed`) statistics and counters.
    pub fn reset_accumulated_stats(&self) {
        self.state.lock().stats.reset_accumulated();
    }

    /// The settings in force.
    pub fn config(&self) -> Config {
        self.state.lock().config.clone()
    }

    /// Every segment with its blocks, ordered by address.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.state.lock().segments()
    }

    /// Events this allocator has created, and how many of them sit idle in its pool.
    pub fn event_counts(&self) -> (u64, usize) {
        let st = self.state.lock();
        (st.events.created(), st.events.idle())
    }

    /// Checks every internal invariant; the error names the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let st = self.state.lock();
        invariants::check(&st, &self.ptrs)
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // Best effort: live allocations stay with their owners; everything cached goes back.
        let _ = self.state.get_mut().empty_cache(&*self.device, self.index);
    }
}
