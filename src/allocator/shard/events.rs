//! Frees and cross-stream events (PyTorch's `record_stream`, `insert_events`,
//! `process_events`, `synchronize_and_free_events`).
//!
//! Contract: a block used on other streams is reused only once an event recorded on each
//! of them at free time completed; when an event cannot be recorded, the block waits
//! for the next full synchronisation instead (parked).
//!
//! Invariant: an awaiting block's wait count (`Phase::Awaiting`) equals its queued
//! events plus its parked or deferred frees; it returns to the free lists when the count
//! reaches 0.

use super::ShardState;
use crate::allocator::accounting::Kind;
use crate::allocator::history::{TraceAction, TraceEvent};
use crate::device::{DeviceError, DevicePtr, EventHandle, StreamHandle};
use crate::error::Error;
use crate::pool::{BlockId, Phase};
use crate::stats::StatType;

impl ShardState {
    /// A caller's free of allocated block `id`. Loads the statistics flag once (it
    /// visits no other shard and takes no other lock, but for a lent block's return,
    /// after which it loads it again; its last group is the only increase): when set,
    /// a copy of its own (out of line) runs instead, as `alloc_found_block` does.
    pub fn free(&mut self, id: BlockId) {
        if self.acct.logging_by(&self.shared.stats_logging) {
            return self.free_logged(id);
        }
        self.free_as::<false>(id);
    }

    #[cold]
    #[inline(never)]
    fn free_logged(&mut self, id: BlockId) {
        self.free_as::<true>(id);
    }

    #[inline(always)]
    fn free_as<const LOG: bool>(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        debug_assert!(b.is_allocated());
        let (st, size, lent) = (b.kind.stat_type(), b.size, b.phase == Phase::Lent);
        b.phase = Phase::Free;
        self.acct.decrease_all_as(
            LOG,
            st,
            &[(Kind::Allocation, 1), (Kind::AllocatedBytes, size)],
        );
        if size >= self.shared.config.max_split_size {
            self.acct
                .decrease_all_as(LOG, StatType::Aggregate, &[(Kind::OversizeAllocations, 1)]);
        }
        if lent {
            if self.return_lent(id) {
                return;
            }
            // `return_lent` may synchronise with other threads (the capturing streams'
            // lock): the flag is loaded again for the changes after it
            // (`../accounting/totals/quiet.rs`).
            if !LOG && self.acct.logging_by(&self.shared.stats_logging) {
                return self.free_settle::<true>(id);
            }
        }
        self.free_settle::<LOG>(id);
    }

    /// The end of a caller's free of block `id`, once its allocation is counted out:
    /// back to the free lists, or waiting for its streams' events.
    #[inline(always)]
    fn free_settle<const LOG: bool>(&mut self, id: BlockId) {
        if self.blocks[id].stream_uses.is_empty() {
            self.forget_hccl_work(id);
            self.free_block_deferring(id, LOG);
        } else if self.capture_underway() {
            // No event calls during a capture: record them when none is underway.
            self.defer_free(id);
        } else {
            self.insert_events(id);
        }
    }

    /// Records one event per other stream the block was used on.
    pub(super) fn insert_events(&mut self, id: BlockId) {
        let index = self.index;
        let uses = std::mem::take(&mut self.blocks[id].stream_uses);
        let mut failed = false;
        for s in uses {
            let recorded = self.waits.event(&*self.dev, index).and_then(|ev| {
                self.dev
                    .event_record(index, ev, s)
                    .map(|_| ev)
                    .inspect_err(|_| {
                        // Never queued: the event is idle and can go straight back.
                        self.waits.recycle(ev);
                    })
            });
            match recorded {
                Ok(ev) => {
                    self.blocks[id].add_wait();
                    self.waits.queue(s, ev, id);
                }
                Err(_) => failed = true,
            }
        }
        if failed {
            // Without an event we cannot tell when that stream is done with the block:
            // park it until the next full synchronisation (empty_cache or OOM retry).
            self.blocks[id].add_wait();
            self.waits.park(id);
        }
    }

    pub fn record_stream(
        &mut self,
        id: BlockId,
        ptr: DevicePtr,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        let live = self
            .blocks
            .get(id)
            .is_some_and(|b| b.is_allocated() && b.ptr == ptr);
        if !live {
            return Err(Error::UnknownPointer { ptr });
        }
        if self.blocks[id].stream == stream {
            return Ok(());
        }
        self.check_stream(stream)?;
        let uses = &mut self.blocks[id].stream_uses;
        if !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    pub fn erase_stream(
        &mut self,
        id: BlockId,
        ptr: DevicePtr,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        match self.blocks.get_mut(id) {
            Some(b) if b.is_allocated() && b.ptr == ptr => {
                // A borrower is the allocation's stream to the caller: never erased.
                if b.borrower() != Some(stream) {
                    b.stream_uses.retain(|s| *s != stream);
                }
                Ok(())
            }
            _ => Err(Error::UnknownPointer { ptr }),
        }
    }

    /// Returns blocks whose events have all completed to their free lists (no waiting);
    /// nothing while a graph is captured on the device (no event queries then).
    pub fn process_events(&mut self) {
        if self.capture_underway() {
            return;
        }
        self.insert_deferred_events();
        let ready = self.waits.poll(&*self.dev, self.index);
        for id in ready {
            self.event_done(id);
        }
    }

    pub(super) fn event_done(&mut self, id: BlockId) {
        if self.blocks[id].end_wait() {
            self.free_completed(id);
        }
    }

    /// Block `id`, freed earlier, waited for its last event: reusable now.
    pub(super) fn free_completed(&mut self, id: BlockId) {
        self.forget_hccl_work(id);
        let b = &self.blocks[id];
        let (ptr, size, stream, tag) = (b.ptr, b.requested, b.stream, b.pool);
        self.shared.history.emit(|| TraceEvent {
            action: TraceAction::FreeCompleted,
            device: self.index,
            address: ptr as u64,
            size,
            stream,
            pool: tag.map(|t| self.capture.id_of(t)),
        });
        self.free_block(id);
    }

    /// `free` with its memory-history events: the free requested, and completed if
    /// it waits for no other stream.
    #[cold]
    #[inline(never)]
    pub fn free_traced(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let event = TraceEvent {
            action: TraceAction::FreeRequested,
            device: self.index,
            address: b.ptr as u64,
            size: b.requested,
            stream: b.stream,
            pool: self.pool_id(b.pool),
        };
        self.shared.history.emit(|| event);
        self.free(id);
        let waits = self
            .blocks
            .get(id)
            .is_some_and(|b| b.ptr as u64 == event.address && b.waits() > 0);
        if !waits {
            self.shared.history.emit(|| TraceEvent {
                action: TraceAction::FreeCompleted,
                ..event
            });
        }
    }

    /// Waits for every pending event and parked free; PyTorch's `synchronize_and_free_events`.
    pub(super) fn synchronize_and_free_events(&mut self) -> Result<(), Error> {
        let index = self.index;
        self.acct.count_sync_all_streams();
        let markers = self.shared.markers.clone();
        let _range = markers.range(|| {
            format!(
                "npualloc.event_sync {} events dev{index}",
                self.waits.pending().len()
            )
        });
        let mut first_err: Option<DeviceError> = None;
        if !self.waits.parked().is_empty() {
            match self.dev.synchronize_device(index) {
                Ok(()) => {
                    for id in self.waits.take_parked() {
                        self.event_done(id);
                    }
                }
                Err(e) => first_err = Some(e),
            }
        }
        let waits = &mut self.waits;
        if let Err(e) = self
            .lending
            .synchronize_fences(&*self.dev, index, None, |ev| waits.recycle(ev))
        {
            first_err.get_or_insert(e);
        }
        if let Err(e) = self.settle_unfenced() {
            first_err.get_or_insert(e);
        }
        if self.shared.policy.sync_per_stream {
            if let Err(e) = self.synchronize_pending_streams() {
                first_err.get_or_insert(e);
            }
        } else {
            for (s, ev, id) in self.waits.drain() {
                match self.dev.event_synchronize(index, ev) {
                    Ok(()) => {
                        self.waits.recycle(ev);
                        self.event_done(id);
                    }
                    Err(e) => {
                        self.waits.queue(s, ev, id);
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Ends every pending free's waits, host-synchronising only the streams that hold
    /// pending frees whose events have not completed, each once: at its last pending
    /// event (events on one stream complete in order, so the earlier ones are complete
    /// then). With `sync_per_stream`; PyTorch's policy synchronises each event.
    fn synchronize_pending_streams(&mut self) -> Result<(), DeviceError> {
        let index = self.index;
        self.process_events();
        let mut first_err = None;
        for s in self.waits.pending().streams() {
            let Some(last) = self.waits.pending().last_on(s) else {
                continue;
            };
            if let Err(e) = self.dev.event_synchronize(index, last) {
                first_err.get_or_insert(e);
                continue;
            }
            let ended = self.waits.take_stream(s);
            self.waits_ended(ended);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Ends the waits `pairs` stood for, taken out of the pending queues once their
    /// events are behind (completed, or waited for on the device by the only stream
    /// that will see the blocks): each event back to the pool, each wait ended.
    pub(super) fn waits_ended(&mut self, pairs: Vec<(EventHandle, BlockId)>) {
        for id in self.waits.end(pairs) {
            self.event_done(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard};

    #[test]
    fn a_block_used_on_another_stream_waits_for_its_event() {
        let (sim, mut st) = shard("");
        let side = sim.create_stream(0).unwrap();
        let p = malloc_ok(&mut st, 1000);
        let id = id_of(&st, p);
        st.record_stream(id, p, side).unwrap();
        free(&mut st, p);
        assert_eq!(st.pending_count(), 1);
        st.process_events();
        assert_eq!(st.pending_count(), 1, "the side stream has not run");
        assert_ne!(malloc_ok(&mut st, 1000), p);
        check(&st);
        sim.complete_stream(0, side).unwrap();
        st.process_events();
        assert_eq!(st.pending_count(), 0);
        check(&st);
    }

    #[test]
    fn a_block_whose_event_cannot_be_created_is_parked_until_a_synchronisation() {
        let (sim, mut st) = shard("");
        let side = sim.create_stream(0).unwrap();
        let p = malloc_ok(&mut st, 1000);
        let id = id_of(&st, p);
        st.record_stream(id, p, side).unwrap();
        sim.fail_nth_event_create(0, 1);
        free(&mut st, p);
        assert_eq!(st.waits.parked(), [id]);
        check(&st);
        st.release_cached_blocks().unwrap();
        assert!(st.waits.parked().is_empty());
        assert_eq!(st.acct.reserved(), 0);
        check(&st);
    }

    /// Three frees pending on one side stream and one on another: a cache release
    /// synchronises each stream once (npualloc's path), or each event (PyTorch's).
    fn syncs_to_release(conf: &str) -> u64 {
        let (sim, mut st) = shard(conf);
        let (a, b) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
        for side in [a, a, a, b] {
            let p = malloc_ok(&mut st, 1000);
            st.record_stream(id_of(&st, p), p, side).unwrap();
            sim.launch(0, side, |_| {}).unwrap();
            free(&mut st, p);
        }
        assert_eq!(st.pending_count(), 4);
        st.release_cached_blocks().unwrap();
        assert_eq!((st.pending_count(), st.acct.reserved()), (0, 0));
        check(&st);
        sim.counters(0).synchronizations
    }

    #[test]
    fn a_cache_release_synchronises_only_the_streams_holding_pending_frees_once_each() {
        assert_eq!(syncs_to_release(""), 2);
        assert_eq!(syncs_to_release("sync_per_stream:False"), 4);
    }
}
