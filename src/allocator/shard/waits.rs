//! Frees waiting before their blocks can be reused, and the events they wait for:
//! PyTorch's per-stream event queues (`cuda_events`), the frees parked for want of an
//! event, and the pool of idle events every event of the shard comes from.
//!
//! Algorithm: a freed block used on other streams queues one event per such stream,
//! each behind the events recorded on that stream before it (events on one stream
//! complete in order); when an event cannot be recorded the block is parked until the
//! next full synchronisation instead. An event taken out of a queue (completed, waited
//! for, or never queued) goes back to the idle pool.
//!
//! Invariant (with the block's wait count, `events.rs`): a block is in the queues once
//! per event it waits for, and parked at most once. Pure data: the device is passed in
//! for the event calls, never held.

use crate::device::Device;
use crate::handle::{DeviceError, DeviceIndex, EventHandle, StreamHandle};
use crate::pool::BlockId;
use crate::stream::{EventPool, PendingFrees};

/// One shard's waiting frees and idle events (module doc).
#[derive(Default)]
pub(crate) struct Waits {
    /// Events recorded at free time, per stream, in order.
    pending: PendingFrees,
    /// Blocks whose events could not be recorded: each holds one wait until the next
    /// full synchronisation.
    parked: Vec<BlockId>,
    /// Idle events for reuse.
    events: EventPool,
}

impl Waits {
    /// Frees waiting: queued events and parked blocks.
    pub fn len(&self) -> usize {
        self.pending.len() + self.parked.len()
    }

    /// The queued events, per stream (read only).
    pub fn pending(&self) -> &PendingFrees {
        &self.pending
    }

    /// The parked blocks.
    pub fn parked(&self) -> &[BlockId] {
        &self.parked
    }

    /// An idle event, or a new one.
    pub fn event(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<EventHandle, DeviceError> {
        self.events.get(dev, index)
    }

    /// An event no longer waited for, back to the idle pool.
    pub fn recycle(&mut self, ev: EventHandle) {
        self.events.put(ev);
    }

    /// Block `id` waits for event `ev`, recorded on `stream`.
    pub fn queue(&mut self, stream: StreamHandle, ev: EventHandle, id: BlockId) {
        self.pending.push(stream, ev, id);
    }

    /// Block `id` waits for the next full synchronisation (an event could not be
    /// recorded).
    pub fn park(&mut self, id: BlockId) {
        self.parked.push(id);
    }

    /// The parked blocks that `take` accepts, out of the list (in order).
    pub fn take_parked_where(&mut self, mut take: impl FnMut(BlockId) -> bool) -> Vec<BlockId> {
        let (taken, kept) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|&b| take(b));
        self.parked = kept;
        taken
    }

    /// The parked blocks, out of the list (a full synchronisation ends their waits).
    pub fn take_parked(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.parked)
    }

    /// The blocks whose queued events completed, out of the queues (no waiting; each
    /// block once per completed event), their events back to the pool.
    pub fn poll(&mut self, dev: &dyn Device, index: DeviceIndex) -> Vec<BlockId> {
        let mut ready = Vec::new();
        let events = &mut self.events;
        self.pending.poll(dev, index, |_, ev, id| {
            events.put(ev);
            ready.push(id);
        });
        ready
    }

    /// Every queued (stream, event, block), out of the queues.
    pub fn drain(&mut self) -> Vec<(StreamHandle, EventHandle, BlockId)> {
        self.pending.drain()
    }

    /// Every queued (event, block) of `stream`, out of its queue.
    pub fn take_stream(&mut self, stream: StreamHandle) -> Vec<(EventHandle, BlockId)> {
        self.pending.take_stream(stream)
    }

    /// The queued (event, block) pairs of `stream` whose block `take` accepts, out of
    /// its queue (in order).
    pub fn take_where(
        &mut self,
        stream: StreamHandle,
        take: impl FnMut(BlockId) -> bool,
    ) -> Vec<(EventHandle, BlockId)> {
        self.pending.take_where(stream, take)
    }

    /// Every queued (stream, event) of block `id`, out of the queues.
    pub fn remove_block(&mut self, id: BlockId) -> Vec<(StreamHandle, EventHandle)> {
        self.pending.remove_item(id)
    }

    /// Pairs taken out of the queues whose events are behind: each event back to the
    /// pool; the blocks, once per pair.
    pub fn end(&mut self, pairs: Vec<(EventHandle, BlockId)>) -> Vec<BlockId> {
        pairs
            .into_iter()
            .map(|(ev, id)| {
                self.events.put(ev);
                id
            })
            .collect()
    }

    /// (events created, events idle now).
    pub fn event_counts(&self) -> (u64, usize) {
        (self.events.created(), self.events.idle())
    }

    /// Checks the invariant of the event pool: no event is both idle and queued.
    pub fn check(&self) -> Result<(), String> {
        let idle = self.events.idle_events();
        match self.pending.iter().find(|(_, ev, _)| idle.contains(ev)) {
            Some((_, ev, _)) => Err(format!("event {ev:?} is both idle and queued")),
            None => Ok(()),
        }
    }

    /// Destroys the idle events.
    pub fn destroy_idle_events(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
    ) -> Result<(), DeviceError> {
        self.events.destroy_idle(dev, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{SimConfig, SimDevice};

    #[test]
    fn a_completed_event_frees_its_block_and_goes_back_to_the_pool() {
        let sim = SimDevice::new(SimConfig::default());
        let side = sim.create_stream(0).unwrap();
        let mut w = Waits::default();
        let ev = w.event(&*sim, 0).unwrap();
        sim.event_record(0, ev, side).unwrap();
        let id: BlockId = 7;
        w.queue(side, ev, id);
        w.park(id);
        assert_eq!(w.len(), 2);
        assert!(w.poll(&*sim, 0).is_empty(), "the side stream has not run");
        sim.complete_stream(0, side).unwrap();
        assert_eq!(w.poll(&*sim, 0), vec![id]);
        assert_eq!(w.event_counts(), (1, 1));
        assert_eq!(w.take_parked(), vec![id]);
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn ended_pairs_give_their_events_back() {
        let sim = SimDevice::new(SimConfig::default());
        let side = sim.create_stream(0).unwrap();
        let mut w = Waits::default();
        let (a, b) = (w.event(&*sim, 0).unwrap(), w.event(&*sim, 0).unwrap());
        let id: BlockId = 7;
        w.queue(side, a, id);
        w.queue(side, b, id);
        let taken = w.take_stream(side);
        assert_eq!(w.end(taken), vec![id, id]);
        assert_eq!(w.event_counts(), (2, 2));
        assert!(w.pending().is_empty());
    }
}
