//! Memory pressure: a device-side wait for a pending free instead of growth (decision
//! 014).
//!
//! When growing would pass the device's capacity, the memory fraction or the reserve
//! budget (`reserve_budget_mb`), a block that only waits for the events of the other
//! streams it was used on (a pending free, `events.rs`) can serve the request at once:
//! the allocating stream waits **on the device** for those events (`stream_wait_event`),
//! the block's waits end, and it is handed out. No host wait. First this shard's own
//! pending frees (the block joins this stream's free lists; the wait is for the last
//! event queued on each stream the block was used on, which covers every free queued
//! there before it, since a stream's events complete in order: those frees of this
//! stream's own pool join the free lists too and merge, the stream-ordered form of
//! PyTorch's `synchronize_and_free_events`; measured against waiting for the one
//! block, decision 015); if none fits, another
//! shard's (`borrow_pending_free`): that shard ends the block's waits the same way and
//! lends it as `lend_block` does, which also orders the borrower after the lender's own
//! stream (an event recorded there now), so the borrower runs after every stream the
//! block was used on: its owner and each recorded stream. Among the pending frees that
//! fit, the one whose streams are closest to done (fewest events queued before its own
//! on each, counted in its shard's queues) is taken, then the smallest.
//!
//! Contract:
//! - runs only with `pressure_wait` (off in `PYTORCH_POLICY`), never during a
//!   capture (a capture never waits or syncs), never with expandable segments (a freed
//!   page may be unmapped at once; the device wait must not be the only order there);
//!   another shard's pending free only with `lend_blocks`, and never from or to a
//!   capturing stream;
//! - a block leaves its pending queue only after every one of its events was made a
//!   device-side wait of the allocating stream, or an event queued after it on the
//!   same stream was (an event recorded on that stream itself needs none: its own
//!   order covers it); if one wait cannot be queued, the block stays pending (the waits
//!   already queued only over-order this stream); a graph-private pool's block leaves
//!   only as the chosen one, never as a covered one (its next user may be a stream not
//!   ordered after this one);
//! - after the wait, the block is in this stream's free lists: this stream is ordered
//!   after every stream the block was used on, and any other stream that takes it later
//!   (lending) is ordered after this stream (`lending.rs`), hence after those streams;
//!   another shard's block is first marked dirty on the borrower (a fence recorded
//!   there after the waits), since the lender's own stream is not ordered after the
//!   block's streams: the rest of it, once split, and every later taker other than the
//!   borrower are ordered after the borrower; lent, it goes back to the lender dirty on
//!   the borrower, as any lent block (`return_lent`);
//! - shard locks: the other shards are visited with `Peers` (`try_lock`, one at a time,
//!   this shard's lock held), twice: once to pick the block, once to take it (the
//!   choice is made again under the lock, as the shard may have changed in between).
//!
//! Invariant: only blocks whose wait count equals their queued events (none parked or
//! deferred) are candidates, so ending their waits returns them to the free lists.

use super::request::{BestFit, Grant, Request};
use super::{Peers, ShardState};
use crate::device::{DevicePtr, EventHandle, StreamHandle};
use crate::pool::{BlockId, Phase};

impl ShardState {
    /// Whether growing by `bytes` would pass the reserve budget.
    pub(super) fn over_budget(&self, bytes: usize) -> bool {
        self.shared
            .config
            .reserve_budget
            .is_some_and(|b| self.shared.reserved().saturating_add(bytes) > b)
    }

    /// Whether this shard may take part in a device-side wait for a pending free (as
    /// the allocating stream or as the owner of the block): the module contract.
    fn may_wait_on_device(&self) -> bool {
        self.shared.policy.pressure_wait && !self.capture_underway()
    }

    /// The pressure rung: a pending free of this shard (`wait_for_pending_free`), else
    /// one of another shard's (`borrow_pending_free`).
    #[cold]
    pub(super) fn pressure_rung(&mut self, req: &Request, peers: &dyn Peers) -> Option<Grant> {
        if let Some(id) = self.wait_for_pending_free(req) {
            return Some(Grant::Own(id));
        }
        self.borrow_pending_free(req, peers).map(Grant::Lent)
    }

    /// Makes this stream wait on the device for the pending free that best serves `req`
    /// and, with the same waits, for every pending free queued on the streams that
    /// block was used on: the wait is for the last event queued on each of those
    /// streams, and all their frees join the free lists, merged (see the module doc).
    /// Returns the block that serves `req`, if any.
    #[cold]
    pub(super) fn wait_for_pending_free(&mut self, req: &Request) -> Option<BlockId> {
        if !self.may_wait_on_device()
            || req.stream != self.stream
            || self.waits.pending().is_empty()
        {
            return None;
        }
        let (id, _) = self.closest_pending_fit(req)?;
        let streams: Vec<StreamHandle> = (self.waits.pending().iter())
            .filter(|&(_, _, b)| b == id)
            .map(|(s, _, _)| s)
            .collect();
        for &s in &streams {
            let last = self.waits.pending().last_on(s)?;
            if s != self.stream
                && self
                    .dev
                    .stream_wait_event(self.index, self.stream, last)
                    .is_err()
            {
                return None;
            }
        }
        for s in streams {
            let blocks = &self.blocks;
            // Only the stream's own pool: a graph-private block may next be used by a
            // stream that is not ordered after this one.
            let ended = self.waits.take_where(s, |b| blocks[b].pool.is_none());
            self.waits_ended(ended);
        }
        self.acct.count_device_wait();
        self.get_free_block(req.kind, req.rounded)
    }

    /// Ends pending block `id`'s waits after making `stream` wait on the device for
    /// each of its events; false (the block stays pending) if a wait could not be queued.
    /// `stream` another shard's (the borrower): the block is first marked dirty on it,
    /// with a fence recorded after those waits, so that whoever takes it (or the rest
    /// of it, once split) other than the borrower is ordered after the borrower, hence
    /// after the block's streams; this shard's own stream is not ordered after them.
    fn take_pending(&mut self, id: BlockId, stream: StreamHandle) -> bool {
        let events: Vec<EventHandle> = self
            .waits
            .pending()
            .iter()
            .filter(|&(s, _, b)| b == id && s != stream)
            .map(|(_, ev, _)| ev)
            .collect();
        for ev in events {
            if self.dev.stream_wait_event(self.index, stream, ev).is_err() {
                return false;
            }
        }
        if stream != self.stream {
            let epoch = self.fence(stream);
            self.lending.mark(id, stream, epoch);
            self.blocks[id].dirty = true;
        }
        for (_, ev) in self.waits.remove_block(id) {
            self.waits.recycle(ev);
            self.event_done(id);
        }
        true
    }

    /// The pressure rung across shards, the borrower's side: when this shard has no
    /// pending free that fits `req`, the one of another shard closest to done (then the
    /// smallest) is taken with device-side waits and lent to this stream (module doc).
    #[cold]
    fn borrow_pending_free(&mut self, req: &Request, peers: &dyn Peers) -> Option<DevicePtr> {
        if !self.may_wait_on_device()
            || !self.shared.policy.lend_blocks
            || req.stream != self.stream
        {
            return None;
        }
        let mut best: Option<((usize, usize), StreamHandle)> = None;
        peers.visit(&mut |other| {
            if let Some(score) = other.pending_offer(req) {
                if best.is_none_or(|(b, _)| score < b) {
                    best = Some((score, other.stream));
                }
            }
            true
        });
        let (_, owner) = best?;
        let mut lent = None;
        peers.visit(&mut |other| {
            if other.stream != owner {
                return true;
            }
            lent = other.lend_pending_free(req);
            false
        });
        if lent.is_some() {
            self.acct.count_device_wait();
        }
        lent
    }

    /// The lender's side, first pass: (events ahead, size) of the pending free of this
    /// shard that would serve `req` (made on another stream), if any.
    fn pending_offer(&self, req: &Request) -> Option<(usize, usize)> {
        if !self.may_wait_on_device() || self.waits.pending().is_empty() {
            return None;
        }
        let (id, ahead) = self.closest_pending_fit(req)?;
        Some((ahead, self.blocks[id].size))
    }

    /// The lender's side, second pass: the pending free that best serves `req` (made on
    /// another stream, the borrower) is taken with device-side waits of the borrower,
    /// then lent to it (`lend_block`, which orders the borrower after this stream). The
    /// hot cache is merged first: its blocks may combine with the block into a better
    /// fit (measured: merging only when the block itself went there needed more memory
    /// on mobilenet_infer rr4; decision 040).
    fn lend_pending_free(&mut self, req: &Request) -> Option<DevicePtr> {
        if !self.may_wait_on_device() || self.waits.pending().is_empty() {
            return None;
        }
        let (id, _) = self.closest_pending_fit(req)?;
        if !self.take_pending(id, req.stream) {
            return None;
        }
        self.flush_hot();
        self.lend_block(req, BestFit::Plain)
    }

    /// The pending free of this shard's own pool that fits `req` and whose streams are
    /// closest to done: the fewest events queued ahead of it on its slowest stream,
    /// then the smallest; with that count of events.
    fn closest_pending_fit(&self, req: &Request) -> Option<(BlockId, usize)> {
        let mut queued: Vec<(BlockId, usize)> = Vec::new(); // (block, events ahead)
        let mut ahead: rustc_hash::FxHashMap<StreamHandle, usize> = Default::default();
        for (s, _, id) in self.waits.pending().iter() {
            let n = ahead.entry(s).or_default();
            match queued.iter_mut().find(|(b, _)| *b == id) {
                Some(e) => e.1 = e.1.max(*n),
                None => queued.push((id, *n)),
            }
            *n += 1;
        }
        queued
            .into_iter()
            .filter(|&(id, _)| self.pending_fits(id, req, self.waits.pending()))
            .min_by_key(|&(id, n)| (n, self.blocks[id].size, id))
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
    use super::super::Released;
    use std::cell::RefCell;

    use super::super::testing::{check, device, free, id_of, malloc_ok, Others};
    use super::super::{NoPeers, ShardState};
    use crate::device::StreamHandle;
    use crate::pool::Phase;

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
        let p = malloc_ok(&mut st, 30 * MIB);
        let id = id_of(&st, p);
        st.record_stream(id, p, side).unwrap();
        free(&mut st, p);
        assert_eq!(st.pending_count(), 1);
        (sim, st, p, side)
    }

    #[test]
    fn under_pressure_the_stream_waits_on_the_device_for_a_pending_free() {
        let (sim, mut st, p, side) = pressed("");
        let q = malloc_ok(&mut st, 30 * MIB);
        assert_eq!(q, p, "the pending block serves it");
        let c = sim.counters(0);
        assert_eq!((c.synchronizations, c.mallocs, c.stream_waits), (0, 1, 1));
        assert_eq!(st.acct.device_waits(), 1);
        // The wait is queued on this stream: it cannot run past it before the side
        // stream ran past the free.
        assert_eq!(sim.pending(0, st.stream).unwrap(), 1);
        assert_eq!(sim.pending(0, side).unwrap(), 1);
        check(&st);
    }

    #[test]
    fn one_wait_frees_every_pending_free_queued_before_the_last_on_that_stream() {
        // Two 30 MiB blocks of one segment used on a side stream and freed; on a full
        // device a 30 MiB request waits once, for the side stream's last event: both
        // join the free lists (merged), so a second request needs no wait.
        let (sim, shared) = device(64 * MIB, "adaptive_segments:False");
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let whole = malloc_ok(&mut st, 62 * MIB);
        free(&mut st, whole);
        let pa = malloc_ok(&mut st, 30 * MIB);
        let pb = malloc_ok(&mut st, 30 * MIB);
        let _keep = malloc_ok(&mut st, 2 * MIB);
        for q in [pa, pb] {
            st.record_stream(id_of(&st, q), q, side).unwrap();
            free(&mut st, q);
        }
        assert_eq!(st.pending_count(), 2);
        let q = malloc_ok(&mut st, 30 * MIB);
        assert_eq!(q, pa, "the first freed, closest to done");
        assert_eq!(
            st.pending_count(),
            0,
            "the later free is covered by the same wait"
        );
        assert_eq!(
            st.malloc(30 * MIB, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            Some(pb)
        );
        let c = sim.counters(0);
        assert_eq!((c.synchronizations, c.mallocs, c.stream_waits), (0, 1, 1));
        check(&st);
    }

    #[test]
    fn pytorchs_path_and_plentiful_memory_add_no_wait() {
        let (sim, mut st, _, _) = pressed("pressure_wait:False");
        assert_eq!(
            st.malloc(30 * MIB, Released::Nothing, &NoPeers)
                .unwrap()
                .served(),
            None
        );
        assert_eq!(sim.counters(0).stream_waits, 0);
        let (sim, shared) = device(1 << 30, "");
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let p = malloc_ok(&mut st, 30 * MIB);
        st.record_stream(id_of(&st, p), p, side).unwrap();
        free(&mut st, p);
        assert_ne!(malloc_ok(&mut st, 30 * MIB), p);
        assert_eq!(sim.counters(0).stream_waits, 0);
        check(&st);
    }

    #[test]
    fn over_the_budget_a_wait_is_preferred_to_growth() {
        let (sim, shared) = device(1 << 30, "reserve_budget_mb:40");
        let mut st = ShardState::new(StreamHandle::DEFAULT, shared);
        let side = sim.create_stream(0).unwrap();
        let p = malloc_ok(&mut st, 30 * MIB);
        st.record_stream(id_of(&st, p), p, side).unwrap();
        free(&mut st, p);
        assert_eq!(malloc_ok(&mut st, 30 * MIB), p);
        assert_eq!(sim.counters(0).mallocs, 1);
        // Nothing pending: the budget is soft, growth goes on.
        assert!(st
            .malloc(30 * MIB, Released::Nothing, &NoPeers)
            .unwrap()
            .served()
            .is_some());
        assert_eq!(sim.counters(0).mallocs, 2);
        check(&st);
    }

    #[test]
    fn a_capture_never_waits() {
        let (sim, mut st, _, _) = pressed("");
        st.begin_allocate_to_pool(crate::device::MempoolId(1, 1))
            .unwrap();
        let e = st
            .malloc(30 * MIB, Released::Nothing, &NoPeers)
            .unwrap()
            .unwrap_oom();
        assert!(matches!(e, crate::error::Error::OutOfMemory { .. }));
        assert_eq!(sim.counters(0).stream_waits, 0);
    }

    /// `pressed`'s lender (the default stream, its 30 MiB block pending on `side`) and a
    /// borrower shard on stream `on`.
    fn lender_and(
        conf: &str,
        on: impl FnOnce(&crate::device::sim::SimDevice, StreamHandle) -> StreamHandle,
    ) -> (
        std::sync::Arc<crate::device::sim::SimDevice>,
        RefCell<ShardState>,
        ShardState,
        crate::device::DevicePtr,
        StreamHandle,
    ) {
        let (sim, st, p, side) = pressed(conf);
        let stream = on(&sim, side);
        let borrower = ShardState::new(stream, st.shared.clone());
        (sim, RefCell::new(st), borrower, p, side)
    }

    #[test]
    fn another_streams_pending_free_is_lent_after_device_waits() {
        let (sim, lender, mut b, p, side) = lender_and("", |sim, _| sim.create_stream(0).unwrap());
        let q = b
            .malloc(30 * MIB, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served();
        assert_eq!(q, Some(p), "the lender's pending free serves it");
        let c = sim.counters(0);
        // One wait for the event recorded on `side` at the free, one for the lender's
        // own stream (lending's order); no host wait, no growth.
        assert_eq!((c.synchronizations, c.mallocs, c.stream_waits), (0, 1, 2));
        // Queued on the borrower: the two waits, then the fence that orders any later
        // taker of the block (or of the rest of it) after them.
        assert_eq!(sim.pending(0, b.stream).unwrap(), 3);
        assert_eq!(
            sim.pending(0, side).unwrap(),
            1,
            "the side stream has not run"
        );
        assert_eq!(b.acct.device_waits(), 1);
        let l = lender.borrow();
        let id = id_of(&l, p);
        assert_eq!(l.blocks[id].phase, Phase::Lent);
        assert_eq!(l.blocks[id].borrower(), Some(b.stream));
        assert_eq!(l.pending_count(), 0);
        check(&l);
        check(&b);
    }

    #[test]
    fn a_stream_the_block_was_used_on_waits_only_for_its_owner() {
        // The borrower is the stream the block was recorded on: its own order covers
        // the event recorded there; it waits for the lender's stream only.
        let (sim, lender, mut b, p, _) = lender_and("", |_, side| side);
        let q = b
            .malloc(30 * MIB, Released::Nothing, &Others(vec![&lender]))
            .unwrap()
            .served();
        assert_eq!(q, Some(p));
        let c = sim.counters(0);
        assert_eq!((c.synchronizations, c.stream_waits), (0, 1));
        check(&lender.borrow());
    }

    #[test]
    fn no_cross_stream_wait_without_block_lending_or_from_a_capturing_lender() {
        let (sim, lender, mut b, _, _) =
            lender_and("lend_blocks:False", |sim, _| sim.create_stream(0).unwrap());
        assert_eq!(
            b.malloc(30 * MIB, Released::Nothing, &Others(vec![&lender]))
                .unwrap()
                .served(),
            None
        );
        assert_eq!(sim.counters(0).stream_waits, 0);
        let (sim, lender, mut b, _, _) = lender_and("", |sim, _| sim.create_stream(0).unwrap());
        // A lender routed to a graph pool (no capture marked: the borrower may still
        // release caches) lends nothing.
        let pool = crate::device::MempoolId(1, 1);
        lender.borrow().shared.pools.incref(pool).unwrap();
        lender.borrow_mut().route_to(pool, false).unwrap();
        assert_eq!(
            b.malloc(30 * MIB, Released::Nothing, &Others(vec![&lender]))
                .unwrap()
                .served(),
            None
        );
        assert_eq!(sim.counters(0).stream_waits, 0);
        assert_eq!(lender.borrow().pending_count(), 1);
    }
}
