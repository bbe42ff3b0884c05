//! Memory pressure: a device-side wait for a pending free instead of growth (issue #16).
//!
//! When growing would pass the device's capacity, the memory fraction or the reserve
//! budget (`reserve_budget_mb`), a block of this shard that only waits for the events
//! of the other streams it was used on (a pending free, `events.rs`) can serve the
//! request at once: the allocating stream waits **on the device** for those events
//! (`stream_wait_event`), the block's waits end, and it joins this stream's free lists.
//! No host wait. Among the pending frees that fit, the one whose streams are closest to
//! done (fewest events queued before its own on each) is taken, then the smallest.
//!
//! Contract:
//! - runs only with `wait_before_growth` (off in `PYTORCH_POLICY`), never during a
//!   capture (a capture never waits or syncs), never with expandable segments (a freed
//!   page may be unmapped at once; the device wait must not be the only order there);
//! - a block leaves its pending queue only after every one of its events was made a
//!   device-side wait of this shard's stream; if one wait cannot be queued, the block
//!   stays pending (the waits already queued only over-order this stream);
//! - after the wait, the block is in this stream's free lists: this stream is ordered
//!   after every stream the block was used on, and any other stream that takes it later
//!   (lending) is ordered after this stream (`lending.rs`), hence after those streams.
//!
//! Invariant: only blocks whose wait count equals their queued events (none parked or
//! deferred) are candidates, so ending their waits returns them to the free lists.

use super::ladder::Request;
use super::ShardState;
use crate::device::{EventHandle, StreamHandle};
use crate::pool::{BlockId, Phase};

impl ShardState {
    /// Whether growing by `bytes` would pass the reserve budget.
    pub(super) fn over_budget(&self, bytes: usize) -> bool {
        self.shared
            .config
            .reserve_budget
            .is_some_and(|b| self.shared.reserved().saturating_add(bytes) > b)
    }

    /// The pressure rung: makes this stream wait on the device for the events of the
    /// pending free that best serves `req`, which then joins the free lists; returns
    /// the block that serves `req`, if any (see the module contract).
    #[cold]
    pub(super) fn wait_for_pending_free(&mut self, req: &Request) -> Option<BlockId> {
        let config = &self.shared.config;
        if !config.wait_before_growth
            || config.expandable_segments
            || self.capture_underway()
            || req.stream != self.stream
            || self.waits.pending.is_empty()
        {
            return None;
        }
        let id = self.closest_pending_fit(req)?;
        let events: Vec<(StreamHandle, EventHandle)> = self
            .waits
            .pending
            .iter()
            .filter(|&(_, _, b)| b == id)
            .map(|(s, ev, _)| (s, ev))
            .collect();
        for &(_, ev) in &events {
            if self
                .dev
                .stream_wait_event(self.index, self.stream, ev)
                .is_err()
            {
                return None;
            }
        }
        for (_, ev) in self.waits.pending.remove_item(id) {
            self.waits.events.put(ev);
            self.event_done(id);
        }
        self.acct.device_waits += 1;
        self.get_free_block(req.kind, req.rounded)
    }

    /// The pending free of this shard's own pool that fits `req` and whose streams are
    /// closest to done: the fewest events queued ahead of it on its slowest stream,
    /// then the smallest.
    fn closest_pending_fit(&self, req: &Request) -> Option<BlockId> {
        let mut queued: Vec<(BlockId, usize)> = Vec::new(); // (block, events ahead)
        let mut ahead: rustc_hash::FxHashMap<StreamHandle, usize> = Default::default();
        for (s, _, id) in self.waits.pending.iter() {
            let n = ahead.entry(s).or_default();
            match queued.iter_mut().find(|(b, _)| *b == id) {
                Some(e) => e.1 = e.1.max(*n),
                None => queued.push((id, *n)),
            }
            *n += 1;
        }
        queued
            .into_iter()
            .filter(|&(id, _)| self.pending_fits(id, req, &self.waits.pending))
            .min_by_key(|&(id, n)| (n, self.blocks[id].size, id))
            .map(|(id, _)| id)
    }

    /// Whether pending block `id` can serve `req` once its events are waited for.
    fn pending_fits(
        &self,
        id: BlockId,
        req: &Request,
        pending: &crate::stream::PendingFrees,
    ) -> bool {
        let b = &self.blocks[id];
        let queued = pending.iter().filter(|&(_, _, x)| x == id).count() as u32;
        matches!(b.phase, Phase::Awaiting(n) if n == queued)
            && b.kind == req.kind
            && b.size >= req.rounded
            && b.pool == self.route()
            && b.pool.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, device, free, id_of};
    use super::super::{NoPeers, ShardState};
    use crate::device::StreamHandle;

    const MIB: usize = 1 << 20;

    /// A 50 MiB device, a 30 MiB block used on a side stream and freed (pending).
    fn pressed(
        conf: &str,
    ) -> (
        std::sync::Arc<crate::device::sim::SimDevice>,
        ShardState,
        crate::device::DevicePtr,
        StreamHandle,
    ) {
        let (sim, shared) = device(50 * MIB, conf);
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let p = st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap();
        let id = id_of(&st, p);
        st.record_stream(id, p, side).unwrap();
        free(&mut st, p);
        assert_eq!(st.pending_count(), 1);
        (sim, st, p, side)
    }

    #[test]
    fn under_pressure_the_stream_waits_on_the_device_for_a_pending_free() {
        let (sim, mut st, p, side) = pressed("");
        let q = st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap();
        assert_eq!(q, p, "the pending block serves it");
        let c = sim.counters(0);
        assert_eq!((c.synchronizations, c.mallocs, c.stream_waits), (0, 1, 1));
        assert_eq!(st.acct.device_waits, 1);
        // The wait is queued on this stream: it cannot run past it before the side
        // stream ran past the free.
        assert_eq!(sim.pending(0, st.stream).unwrap(), 1);
        assert_eq!(sim.pending(0, side).unwrap(), 1);
        check(&st);
    }

    #[test]
    fn pytorchs_path_and_plentiful_memory_add_no_wait() {
        let (sim, mut st, _, _) = pressed("wait_before_growth:False");
        assert_eq!(st.malloc(30 * MIB, false, &NoPeers).unwrap(), None);
        assert_eq!(sim.counters(0).stream_waits, 0);
        let (sim, shared) = device(1 << 30, "");
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let p = st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap();
        st.record_stream(id_of(&st, p), p, side).unwrap();
        free(&mut st, p);
        assert_ne!(st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap(), p);
        assert_eq!(sim.counters(0).stream_waits, 0);
        check(&st);
    }

    #[test]
    fn over_the_budget_a_wait_is_preferred_to_growth() {
        let (sim, shared) = device(1 << 30, "reserve_budget_mb:40");
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let p = st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap();
        st.record_stream(id_of(&st, p), p, side).unwrap();
        free(&mut st, p);
        assert_eq!(st.malloc(30 * MIB, false, &NoPeers).unwrap().unwrap(), p);
        assert_eq!(sim.counters(0).mallocs, 1);
        // Nothing pending: the budget is soft, growth goes on.
        assert!(st.malloc(30 * MIB, false, &NoPeers).unwrap().is_some());
        assert_eq!(sim.counters(0).mallocs, 2);
        check(&st);
    }

    #[test]
    fn a_capture_never_waits() {
        let (sim, mut st, _, _) = pressed("");
        st.begin_allocate_to_pool(crate::device::MempoolId(1, 1))
            .unwrap();
        assert!(st.malloc(30 * MIB, false, &NoPeers).is_err());
        assert_eq!(sim.counters(0).stream_waits, 0);
    }
}
