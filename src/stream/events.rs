//! A pool of reusable device events, so steady state creates none.
//!
//! Invariant: every event in the pool was created by this pool's device and is not
//! recorded in any pending queue.

use crate::device::{Device, DeviceError, DeviceIndex, EventHandle};

/// Reusable events of one device.
#[derive(Debug, Default)]
pub struct EventPool {
    free: Vec<EventHandle>,
    created: u64,
}

impl EventPool {
    /// Takes an idle event, creating one only when none is idle.
    pub fn get(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<EventHandle, DeviceError> {
        if let Some(ev) = self.free.pop() {
            return Ok(ev);
        }
        let ev = dev.event_create(index)?;
        self.created += 1;
        Ok(ev)
    }

    /// Returns an event whose record completed (or was never queued).
    pub fn put(&mut self, ev: EventHandle) {
        self.free.push(ev);
    }

    /// Idle events held.
    pub fn idle(&self) -> usize {
        self.free.len()
    }

    /// Events this pool has created so far.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Idle event handles.
    pub fn idle_events(&self) -> &[EventHandle] {
        &self.free
    }

    /// Destroys every idle event; returns the first error, destroying the rest anyway.
    pub fn destroy_idle(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<(), DeviceError> {
        let mut first_err = None;
        for ev in self.free.drain(..) {
            if let Err(e) = dev.event_destroy(index, ev) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
