//! Address space and (optional) backing store of one simulated device.
//!
//! Invariants:
//! - live regions never overlap; every region starts 512-byte aligned;
//! - `live_bytes` is the sum of live region sizes and never exceeds the capacity;
//! - a backed region's buffer has exactly the region's size.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::device::{DeviceError, DeviceIndex, DevicePtr};

const ALIGN: usize = 512;

type Backing = Arc<Mutex<Vec<u8>>>;

struct Region {
    size: usize,
    data: Option<Backing>,
}

struct Inner {
    next_addr: usize,
    live: BTreeMap<usize, Region>,
    live_bytes: usize,
    peak_bytes: usize,
}

/// The memory of one simulated device, as kernels and the host see it.
pub struct SimMemory {
    device: DeviceIndex,
    capacity: usize,
    backed: bool,
    inner: RwLock<Inner>,
    violations: AtomicU64,
}

impl SimMemory {
    pub(super) fn new(device: DeviceIndex, capacity: usize, backed: bool) -> Self {
        SimMemory {
            device,
            capacity,
            backed,
            inner: RwLock::new(Inner {
                // Each device gets its own 1 TiB window so addresses never collide across devices.
                next_addr: (device + 1) << 40,
                live: BTreeMap::new(),
                live_bytes: 0,
                peak_bytes: 0,
            }),
            violations: AtomicU64::new(0),
        }
    }

    /// Whether reads and writes reach real host memory.
    pub fn is_backed(&self) -> bool {
        self.backed
    }

    pub(super) fn allocate(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let oom = DeviceError::OutOfMemory {
            device: self.device,
            requested: size,
        };
        let mut inner = self.inner.write();
        let fits = inner
            .live_bytes
            .checked_add(size)
            .is_some_and(|n| n <= self.capacity);
        if !fits || size == 0 {
            return Err(oom);
        }
        let span = size.div_ceil(ALIGN) * ALIGN;
        let addr = inner.next_addr;
        inner.next_addr = addr.checked_add(span).ok_or(oom)?;
        let data = self
            .backed
            .then(|| Arc::new(Mutex::new(vec![0xA5u8; size])));
        inner.live.insert(addr, Region { size, data });
        inner.live_bytes += size;
        inner.peak_bytes = inner.peak_bytes.max(inner.live_bytes);
        Ok(addr)
    }

    pub(super) fn release(&self, ptr: DevicePtr) -> Result<usize, DeviceError> {
        let mut inner = self.inner.write();
        match inner.live.remove(&ptr) {
            Some(region) => {
                inner.live_bytes -= region.size;
                Ok(region.size)
            }
            None => {
                self.violations.fetch_add(1, Ordering::Relaxed);
                Err(DeviceError::InvalidPointer {
                    device: self.device,
                    ptr,
                })
            }
        }
    }

    pub(super) fn live_bytes(&self) -> usize {
        self.inner.read().live_bytes
    }

    pub(super) fn peak_bytes(&self) -> usize {
        self.inner.read().peak_bytes
    }

    pub(super) fn live_allocations(&self) -> usize {
        self.inner.read().live.len()
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(super) fn violations(&self) -> u64 {
        self.violations.load(Ordering::Relaxed)
    }

    pub(super) fn note_violation(&self) {
        self.violations.fetch_add(1, Ordering::Relaxed);
    }

    /// Finds the region holding `[ptr, ptr + len)`; counts a violation when there is none.
    fn region(&self, ptr: DevicePtr, len: usize) -> Option<(usize, Option<Backing>)> {
        let inner = self.inner.read();
        let found = inner
            .live
            .range(..=ptr)
            .next_back()
            .filter(|(base, r)| ptr - **base + len <= r.size)
            .map(|(base, r)| (ptr - base, r.data.clone()));
        drop(inner);
        if found.is_none() {
            self.note_violation();
        }
        found
    }

    /// Writes `bytes` at `ptr`. Out-of-bounds or freed addresses count a violation and
    /// write nothing; on unbacked memory only the bounds are checked.
    pub fn write(&self, ptr: DevicePtr, bytes: &[u8]) -> bool {
        match self.region(ptr, bytes.len()) {
            Some((off, Some(data))) => {
                data.lock()[off..off + bytes.len()].copy_from_slice(bytes);
                true
            }
            Some((_, None)) => true,
            None => false,
        }
    }

    /// Reads `len` bytes at `ptr`; `None` for a bad address or unbacked memory.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Option<Vec<u8>> {
        let (off, data) = self.region(ptr, len)?;
        let data = data?;
        let guard = data.lock();
        Some(guard[off..off + len].to_vec())
    }

    /// Writes `values` as little-endian `f32`s at `ptr`.
    pub fn write_f32(&self, ptr: DevicePtr, values: &[f32]) -> bool {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(ptr, &bytes)
    }

    /// Reads `n` little-endian `f32`s at `ptr`.
    pub fn read_f32(&self, ptr: DevicePtr, n: usize) -> Option<Vec<f32>> {
        let bytes = self.read(ptr, n * 4)?;
        Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    /// Fills `n` `f32`s at `ptr` with `value`.
    pub fn fill_f32(&self, ptr: DevicePtr, n: usize, value: f32) -> bool {
        self.write_f32(ptr, &vec![value; n])
    }
}
