//! Address space and (optional) backing store of one simulated device.
//!
//! Invariants:
//! - live regions never overlap; every region starts 512-byte aligned;
//! - `live_bytes` is the sum of live region sizes and never exceeds the capacity;
//! - a backed region's buffer has exactly the region's size;
//! - mapped regions (virtual memory) lie inside a reservation, granularity-aligned,
//!   and count towards `live_bytes` like allocations; reservations never overlap
//!   each other or allocations (they live in a separate address window);
//! - addresses are handed out in the device's [`AddressOrder`] (`addresses.rs`): the
//!   ranges of `addrs` are the allocations (each rounded up to 512 bytes), those of
//!   `vas` the reservations (each with a guard of one granule after it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::addresses::{AddressOrder, Window};
use crate::device::{DeviceError, DeviceIndex, DevicePtr};

const ALIGN: usize = 512;
/// Allocations of a multiple of this size start at a multiple of it, as device
/// runtimes align large allocations.
const LARGE_ALIGN: usize = 2 << 20;

type Backing = Arc<Mutex<Vec<u8>>>;

struct Region {
    size: usize,
    data: Option<Backing>,
    /// Mapped into a reservation (freed by unmapping, not by `release`).
    mapped: bool,
}

struct Inner {
    /// The allocation window.
    addrs: Window,
    /// The reservation window.
    vas: Window,
    /// Address-space reservations: base → size.
    reservations: BTreeMap<usize, usize>,
    live: BTreeMap<usize, Region>,
    live_bytes: usize,
    peak_bytes: usize,
}

impl Inner {
    /// Whether `size` more live bytes stay within `capacity`.
    fn fits(&self, size: usize, capacity: usize) -> bool {
        self.live_bytes
            .checked_add(size)
            .is_some_and(|n| n <= capacity)
    }

    /// Adds a live region (allocated, or `mapped` into a reservation) and counts it.
    fn insert(&mut self, at: usize, size: usize, mapped: bool, backed: bool) {
        let data = backed.then(|| Arc::new(Mutex::new(vec![0xA5u8; size])));
        self.live.insert(at, Region { size, data, mapped });
        self.live_bytes += size;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    /// Removes the region at `at` if it is one of that kind; returns its size.
    fn take(&mut self, at: usize, mapped: bool) -> Option<usize> {
        let size = self.live.get(&at).filter(|r| r.mapped == mapped)?.size;
        self.live.remove(&at);
        self.live_bytes -= size;
        Some(size)
    }
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
    pub(super) fn new(
        device: DeviceIndex,
        capacity: usize,
        backed: bool,
        order: AddressOrder,
    ) -> Self {
        // Each device gets its own 1 TiB window so addresses never collide across
        // devices; reservations come from windows far above every allocation window.
        let mut vas_order = order;
        if let AddressOrder::Shuffled(seed) = order {
            vas_order = AddressOrder::Shuffled(!seed);
        }
        SimMemory {
            device,
            capacity,
            backed,
            inner: RwLock::new(Inner {
                addrs: Window::new(order, (device + 1) << 40, 1 << 40),
                vas: Window::new(vas_order, (device + 1) << 48, 1 << 48),
                reservations: BTreeMap::new(),
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
        if !inner.fits(size, self.capacity) || size == 0 {
            return Err(oom);
        }
        let span = size.checked_next_multiple_of(ALIGN).ok_or(oom.clone())?;
        let align = if span % LARGE_ALIGN == 0 {
            LARGE_ALIGN
        } else {
            ALIGN
        };
        let addr = inner.addrs.take(span, align).ok_or(oom)?;
        inner.insert(addr, size, false, self.backed);
        Ok(addr)
    }

    pub(super) fn release(&self, ptr: DevicePtr) -> Result<usize, DeviceError> {
        // Mapped pages are not allocations: freeing one is misuse too.
        let mut inner = self.inner.write();
        match inner.take(ptr, false) {
            Some(size) => {
                inner.addrs.give_back(ptr);
                Ok(size)
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

    /// The pieces of `[ptr, ptr + len)`: (offset in region, backing, length), across
    /// adjacent regions (mapped pages); counts a violation when part is not live.
    fn pieces(&self, ptr: DevicePtr, len: usize) -> Option<Vec<(usize, Option<Backing>, usize)>> {
        let inner = self.inner.read();
        let mut out = Vec::new();
        let (mut at, end) = (ptr, ptr.checked_add(len));
        let found = end.is_some_and(|end| loop {
            let Some((base, r)) = inner.live.range(..=at).next_back() else {
                break false;
            };
            if at >= base + r.size {
                break false;
            }
            let n = (base + r.size).min(end) - at;
            out.push((at - base, r.data.clone(), n));
            at += n;
            if at >= end {
                break true;
            }
        });
        drop(inner);
        if !found {
            self.note_violation();
            return None;
        }
        Some(out)
    }

    /// Writes `bytes` at `ptr`. Out-of-bounds or freed addresses count a violation and
    /// write nothing; on unbacked memory only the bounds are checked.
    pub fn write(&self, ptr: DevicePtr, bytes: &[u8]) -> bool {
        let Some(pieces) = self.pieces(ptr, bytes.len()) else {
            return false;
        };
        let mut done = 0;
        for (off, data, n) in pieces {
            if let Some(data) = data {
                data.lock()[off..off + n].copy_from_slice(&bytes[done..done + n]);
            }
            done += n;
        }
        true
    }

    /// Reads `len` bytes at `ptr`; `None` for a bad address or unbacked memory.
    pub fn read(&self, ptr: DevicePtr, len: usize) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        for (off, data, n) in self.pieces(ptr, len)? {
            out.extend_from_slice(&data?.lock()[off..off + n]);
        }
        Some(out)
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

    // ---- virtual memory ---------------------------------------------------------------

    fn runtime(call: &'static str, message: String) -> DeviceError {
        DeviceError::Runtime {
            call,
            code: 107000,
            message,
        }
    }

    /// Reserves `size` bytes of address space, `granularity`-aligned.
    pub(super) fn reserve(
        &self,
        size: usize,
        granularity: usize,
    ) -> Result<DevicePtr, DeviceError> {
        if size == 0 || size % granularity != 0 {
            return Err(Self::runtime(
                "sim_vm_reserve",
                format!("size {size} is not a positive multiple of the granularity {granularity}"),
            ));
        }
        let mut inner = self.inner.write();
        // A guard gap keeps reservations from touching.
        let base = size
            .checked_add(granularity)
            .and_then(|span| inner.vas.take(span, granularity))
            .ok_or_else(|| Self::runtime("sim_vm_reserve", "address space exhausted".into()))?;
        inner.reservations.insert(base, size);
        Ok(base)
    }

    /// Releases a reservation with nothing mapped in it.
    pub(super) fn release_reservation(&self, va: DevicePtr) -> Result<(), DeviceError> {
        let mut inner = self.inner.write();
        let Some(&size) = inner.reservations.get(&va) else {
            drop(inner);
            self.note_violation();
            return Err(Self::runtime(
                "sim_vm_release",
                format!("{va:#x} is not a reservation"),
            ));
        };
        if inner.live.range(va..va + size).next().is_some() {
            drop(inner);
            self.note_violation();
            return Err(Self::runtime(
                "sim_vm_release",
                format!("reservation {va:#x} still has pages mapped"),
            ));
        }
        inner.reservations.remove(&va);
        inner.vas.give_back(va);
        Ok(())
    }

    /// Maps `size` bytes of new physical memory at `va`.
    pub(super) fn map(
        &self,
        va: DevicePtr,
        size: usize,
        granularity: usize,
    ) -> Result<(), DeviceError> {
        let mut inner = self.inner.write();
        let inside = inner
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(b, s)| va.checked_add(size).is_some_and(|e| e <= b + s));
        let aligned = size > 0 && va % granularity == 0 && size % granularity == 0;
        let overlaps = inner
            .live
            .range(..va.saturating_add(size))
            .next_back()
            .is_some_and(|(b, r)| b + r.size > va);
        if !inside || !aligned || overlaps {
            drop(inner);
            self.note_violation();
            return Err(Self::runtime(
                "sim_vm_map",
                format!("cannot map {size} bytes at {va:#x}: outside a reservation, unaligned or already mapped"),
            ));
        }
        if !inner.fits(size, self.capacity) {
            return Err(DeviceError::OutOfMemory {
                device: self.device,
                requested: size,
            });
        }
        inner.insert(va, size, true, self.backed);
        Ok(())
    }

    /// Unmaps what was mapped at `va`; returns its size.
    pub(super) fn unmap(&self, va: DevicePtr) -> Result<usize, DeviceError> {
        let taken = self.inner.write().take(va, true);
        match taken {
            Some(size) => Ok(size),
            None => {
                self.note_violation();
                Err(Self::runtime(
                    "sim_vm_unmap",
                    format!("nothing is mapped at {va:#x}"),
                ))
            }
        }
    }

    /// Live address-space reservations.
    pub(super) fn reservations(&self) -> usize {
        self.inner.read().reservations.len()
    }
}
