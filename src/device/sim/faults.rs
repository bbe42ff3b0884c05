//! Failures the simulated device makes on purpose: injected ones (`fail_nth_*`: the
//! n-th next allocation, event creation, record or query fails) and the calls a graph
//! capture refuses (`set_graph_capture`: queries, synchronisations and frees fail while
//! a capture is open, as CUDA's and ACL's default capture mode refuses them).
//!
//! Pure bookkeeping per device: countdowns, a capture flag and counters; the device
//! methods ask here before doing the work.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::SimDevice;
use crate::device::{DeviceError, DeviceIndex};

/// Which error an injected device-allocation failure reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFailure {
    /// Reported as out of memory.
    OutOfMemory,
    /// Reported as a runtime error with code 507899 (an internal error).
    RuntimeError,
}

/// One device's injected failures and capture state.
#[derive(Default)]
pub(super) struct Faults {
    /// Fail the n-th next malloc (1 = the next one); 0 = off.
    malloc_countdown: AtomicU64,
    malloc_kind: Mutex<Option<InjectedFailure>>,
    /// Fail the n-th next event creation; 0 = off.
    pub event_countdown: AtomicU64,
    /// Fail the n-th next event record; 0 = off.
    pub record_countdown: AtomicU64,
    /// Fail the n-th next event query; 0 = off.
    pub query_countdown: AtomicU64,
    /// Injected failures that fired.
    pub fired: AtomicU64,
    /// A graph capture is open (`set_graph_capture`).
    capturing: AtomicBool,
    /// Calls refused because a capture was open.
    pub capture_violations: AtomicU64,
}

impl Faults {
    /// Whether the call counted down by `countdown` fails now (and counts it).
    pub fn fire(&self, countdown: &AtomicU64) -> bool {
        let due = tick(countdown);
        if due {
            self.fired.fetch_add(1, Ordering::Relaxed);
        }
        due
    }

    /// The injected failure of a device allocation (malloc or page mapping) of `size`
    /// bytes on `device`, if due.
    pub fn injected(
        &self,
        call: &'static str,
        device: DeviceIndex,
        size: usize,
    ) -> Option<DeviceError> {
        if !self.fire(&self.malloc_countdown) {
            return None;
        }
        Some(match *self.malloc_kind.lock() {
            Some(InjectedFailure::RuntimeError) => injected_failure(call),
            _ => DeviceError::OutOfMemory {
                device,
                requested: size,
            },
        })
    }

    /// Refuses `call` while a graph capture is open, as CUDA refuses a potentially
    /// unsafe call (a query, a synchronisation, a free) in its default capture mode
    /// (the capture is then invalidated; ACL's global capture mode is the same idea).
    pub fn refuse_if_capturing(&self, call: &'static str) -> Result<(), DeviceError> {
        if !self.capturing.load(Ordering::Acquire) {
            return Ok(());
        }
        self.capture_violations.fetch_add(1, Ordering::Relaxed);
        Err(DeviceError::Runtime {
            call,
            code: 900,
            message: "operation not permitted when stream is capturing".into(),
        })
    }
}

/// The error of an injected runtime failure of `call`.
pub(super) fn injected_failure(call: &'static str) -> DeviceError {
    DeviceError::Runtime {
        call,
        code: 507899,
        message: "injected failure".into(),
    }
}

/// Counts `countdown` down; true when it reaches zero now.
fn tick(countdown: &AtomicU64) -> bool {
    countdown
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| match n {
            0 => None,
            n => Some(n - 1),
        })
        .is_ok_and(|before| before == 1)
}

impl SimDevice {
    /// Makes the `nth` next device allocation on `device` fail (1 = the next one).
    pub fn fail_nth_malloc(&self, device: DeviceIndex, nth: u64, kind: InjectedFailure) {
        if let Ok(d) = self.dev(device) {
            *d.faults.malloc_kind.lock() = Some(kind);
            d.faults.malloc_countdown.store(nth, Ordering::Release);
        }
    }

    /// Makes the `nth` next event creation on `device` fail (1 = the next one).
    pub fn fail_nth_event_create(&self, device: DeviceIndex, nth: u64) {
        if let Ok(d) = self.dev(device) {
            d.faults.event_countdown.store(nth, Ordering::Release);
        }
    }

    /// Makes the `nth` next event record on `device` fail (1 = the next one).
    pub fn fail_nth_event_record(&self, device: DeviceIndex, nth: u64) {
        if let Ok(d) = self.dev(device) {
            d.faults.record_countdown.store(nth, Ordering::Release);
        }
    }

    /// Makes the `nth` next event query on `device` fail (1 = the next one).
    pub fn fail_nth_event_query(&self, device: DeviceIndex, nth: u64) {
        if let Ok(d) = self.dev(device) {
            d.faults.query_countdown.store(nth, Ordering::Release);
        }
    }

    /// Opens (`true`) or closes a graph capture on `device`: while open, event queries,
    /// synchronisations and device frees fail and count as `capture_violations`
    /// (device allocations are allowed, as PyTorch makes them in relaxed mode).
    pub fn set_graph_capture(&self, device: DeviceIndex, open: bool) {
        if let Ok(d) = self.dev(device) {
            d.faults.capturing.store(open, Ordering::Release);
        }
    }
}
