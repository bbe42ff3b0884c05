//! A graph pool's checkpoint, this shard's part (PyTorch's `getCheckpointState` /
//! `setCheckpointPoolState`, Note [Checkpointing PrivatePoolState]): the pool's segments
//! with their blocks, and putting them back exactly as they were.
//!
//! Captured graphs have the addresses of their blocks baked in, so a restore keeps
//! every checkpointed segment and re-carves it into exactly the checkpointed blocks:
//! same addresses, same sizes, allocated or free as they were.
//!
//! Contract:
//! - `pool_segments` lists every segment of the pool this shard holds, blocks in address
//!   order, with no merge deferred, after `settle_pool_waits` (no block awaiting); it
//!   refuses a pool with expandable segments (their mapped runs grow and shrink between
//!   a checkpoint and its restore, so a run's blocks cannot be put back as they were);
//! - `check_restorable` changes nothing; after it passed, `free_pool_allocations` and
//!   `restore_segment` cannot fail, and `settle_pool_waits` only with a device error;
//! - a restored allocation is an ordinary live allocation (in `ptrs`, counted in the
//!   statistics as an allocation of its full block size), freed by `free`;
//! - a segment's free blocks stay where the checkpoint had them (a checkpoint taken here
//!   never has two free neighbours, so the free lists' no-free-neighbours rule holds).

use super::ShardState;
use crate::allocator::accounting::Kind;
use crate::allocator::history::{TraceAction, TraceEvent};
use crate::device::{DevicePtr, MempoolId, StreamHandle};
use crate::error::Error;
use crate::pool::{BlockId, Phase, PoolKind, PrivateTag};
use crate::stats::StatType;

/// One block of a checkpointed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointBlock {
    /// Start address.
    pub ptr: DevicePtr,
    /// Size in bytes.
    pub size: usize,
    /// Whether it was allocated (a live tensor of the graph) at the checkpoint.
    pub allocated: bool,
}

/// One checkpointed segment: its blocks tile it from its first block's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSegment {
    /// The stream the segment serves (its shard).
    pub stream: StreamHandle,
    /// Its pool kind.
    pub kind: PoolKind,
    /// Its blocks, in address order.
    pub blocks: Vec<CheckpointBlock>,
}

impl CheckpointSegment {
    /// The segment's start address.
    pub fn address(&self) -> DevicePtr {
        self.blocks.first().map_or(0, |b| b.ptr)
    }

    /// The segment's size.
    pub fn size(&self) -> usize {
        self.blocks.iter().map(|b| b.size).sum()
    }

    /// Whether the blocks tile the segment (contiguous, sizes positive multiples of
    /// 512) with no two free neighbours.
    fn well_formed(&self) -> bool {
        let tiled = self.blocks.windows(2).all(|w| {
            w[0].ptr.checked_add(w[0].size) == Some(w[1].ptr) && (w[0].allocated || w[1].allocated)
        });
        !self.blocks.is_empty()
            && tiled
            && self.blocks.iter().all(|b| b.size > 0 && b.size % 512 == 0)
    }
}

impl ShardState {
    /// The segments of pool `id` in this shard (module contract).
    pub fn pool_segments(&mut self, id: MempoolId) -> Result<Vec<CheckpointSegment>, Error> {
        self.finish_merge();
        let Some(tag) = self.private_tag(id) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for head in self.heads_of(tag) {
            let mut blocks = Vec::new();
            let mut cur = Some(head);
            while let Some(c) = cur {
                let b = &self.blocks[c];
                if b.vm.is_some() {
                    return Err(Error::Unsupported(format!(
                        "pool {id:?} has expandable segments: npualloc cannot checkpoint \
                         them (their mapped runs change between a checkpoint and its \
                         restore); set expandable_segments:False for graph capture"
                    )));
                }
                if b.waits() > 0 {
                    return Err(Error::InvalidState(format!(
                        "pool {id:?}: the free of block {:#x} still waits for work on \
                         other streams; checkpoint once that work completed",
                        b.ptr
                    )));
                }
                blocks.push(CheckpointBlock {
                    ptr: b.ptr,
                    size: b.size,
                    allocated: b.is_allocated(),
                });
                cur = b.next;
            }
            let h = &self.blocks[head];
            out.push(CheckpointSegment {
                stream: h.stream,
                kind: h.kind,
                blocks,
            });
        }
        out.sort_by_key(|s| s.address());
        Ok(out)
    }

    /// The first blocks of the segments tagged `tag`.
    fn heads_of(&self, tag: PrivateTag) -> Vec<BlockId> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.prev.is_none() && b.pool == Some(tag))
            .map(|(i, _)| i)
            .collect()
    }

    /// The live allocations of pool `id` in this shard.
    pub fn pool_allocations(&self, id: MempoolId) -> Vec<DevicePtr> {
        let Some(tag) = self.private_tag(id) else {
            return Vec::new();
        };
        self.blocks
            .iter()
            .filter(|(_, b)| b.pool == Some(tag) && b.is_allocated())
            .map(|(_, b)| b.ptr)
            .collect()
    }

    /// Waits for the pending frees of pool `id` in this shard (their events, and a
    /// device synchronisation for a free whose event could not be recorded), so that
    /// none of its blocks is awaiting; no capture may be underway (the caller checks).
    /// A checkpoint or restore lists or re-carves only free and allocated blocks; PyTorch
    /// requires their events to have completed, npualloc waits for them instead (an
    /// event recorded after a capture on a stream whose work was captured completes at
    /// once).
    pub fn settle_pool_waits(&mut self, id: MempoolId) -> Result<(), Error> {
        let Some(tag) = self.private_tag(id) else {
            return Ok(());
        };
        debug_assert!(!self.capture_underway());
        self.insert_deferred_events();
        let index = self.index;
        let mut first_err = None;
        for s in self.waits.pending().streams() {
            let blocks = &self.blocks;
            let taken = self.waits.take_where(s, |b| blocks[b].pool == Some(tag));
            for (ev, b) in taken {
                match self.dev.event_synchronize(index, ev) {
                    Ok(()) => self.waits_ended(vec![(ev, b)]),
                    Err(e) => {
                        self.waits.queue(s, ev, b);
                        first_err.get_or_insert(Error::from(e));
                    }
                }
            }
        }
        let blocks = &self.blocks;
        let parked = self
            .waits
            .take_parked_where(|b| blocks[b].pool == Some(tag));
        if !parked.is_empty() {
            match self.dev.synchronize_device(index) {
                Ok(()) => {
                    for b in parked {
                        self.event_done(b);
                    }
                }
                Err(e) => {
                    parked.into_iter().for_each(|b| self.waits.park(b));
                    first_err.get_or_insert(Error::from(e));
                }
            }
        }
        self.finish_merge();
        first_err.map_or(Ok(()), Err)
    }

    /// Checks, changing nothing, that each checkpointed segment in `segments` (this
    /// shard's part of a checkpoint of pool `id`) is still a segment of the pool here,
    /// of the same size and kind, and well formed.
    pub fn check_restorable(
        &mut self,
        id: MempoolId,
        segments: &[&CheckpointSegment],
    ) -> Result<(), Error> {
        self.finish_merge();
        let tag = self.private_tag(id);
        for seg in segments {
            if !seg.well_formed() {
                return Err(Error::InvalidArgument(format!(
                    "the checkpoint's segment at {:#x} is malformed",
                    seg.address()
                )));
            }
            let found = tag.and_then(|t| self.head_at(t, seg.address()));
            let fits = found.is_some_and(|h| {
                let b = &self.blocks[h];
                b.vm.is_none() && b.kind == seg.kind && self.segment_of(h).1 == seg.size()
            });
            if !fits {
                return Err(Error::InvalidState(format!(
                    "the segment at {:#x} ({} bytes) of the checkpoint is no longer a \
                     segment of pool {id:?} on stream {:?}: a captured graph's memory was \
                     released",
                    seg.address(),
                    seg.size(),
                    seg.stream
                )));
            }
        }
        Ok(())
    }

    /// The first block of the segment of pool tag `tag` starting at `address`.
    fn head_at(&self, tag: PrivateTag, address: DevicePtr) -> Option<BlockId> {
        self.blocks
            .iter()
            .find(|(_, b)| b.prev.is_none() && b.pool == Some(tag) && b.ptr == address)
            .map(|(i, _)| i)
    }

    /// Frees every live allocation of pool `id` in this shard (those used on other
    /// streams wait for them: `settle_pool_waits` next); returns their addresses.
    pub fn free_pool_allocations(&mut self, id: MempoolId) -> Vec<DevicePtr> {
        let freed = self.pool_allocations(id);
        for &p in &freed {
            let b = self.ptrs.remove(&p).expect("a live allocation is mapped");
            if self.shared.history.on() {
                self.free_traced(b);
            } else {
                self.free(b);
            }
        }
        self.finish_merge();
        freed
    }

    /// Re-carves checkpointed segment `seg` of pool `id` (after `check_restorable`,
    /// `free_pool_allocations` and `settle_pool_waits`: the whole segment is one free
    /// block) into exactly its
    /// blocks; returns the allocated ones as new allocations (address, size).
    pub fn restore_segment(
        &mut self,
        id: MempoolId,
        seg: &CheckpointSegment,
    ) -> Vec<(DevicePtr, usize)> {
        let tag = self.private_tag(id).expect("checked by check_restorable");
        let head = self
            .head_at(tag, seg.address())
            .expect("checked by check_restorable");
        debug_assert!(self.blocks[head].is_free() && !self.blocks[head].is_split());
        self.pool_remove(head);
        // Each front is cut off `head`, which keeps the rest: the last block.
        let mut ids = Vec::with_capacity(seg.blocks.len());
        for cb in &seg.blocks[..seg.blocks.len() - 1] {
            ids.push(self.carve_front(head, cb.size));
        }
        ids.push(head);
        let split = ids.len() > 1;
        let mut allocated = Vec::new();
        for (&b, cb) in ids.iter().zip(&seg.blocks) {
            debug_assert_eq!((self.blocks[b].ptr, self.blocks[b].size), (cb.ptr, cb.size));
            if cb.allocated {
                self.count_restored(b);
                self.ptrs.insert(cb.ptr, b);
                allocated.push((cb.ptr, cb.size));
                self.shared.history.emit(|| TraceEvent {
                    action: TraceAction::Alloc,
                    device: self.index,
                    address: cb.ptr as u64,
                    size: cb.size,
                    stream: seg.stream,
                    pool: Some(id),
                });
            } else {
                self.blocks[b].phase = Phase::Free;
                self.pool_insert(b);
                if split {
                    let st = self.blocks[b].kind.stat_type();
                    self.acct.increase_all(
                        st,
                        &[
                            (Kind::InactiveSplit, 1),
                            (Kind::InactiveSplitBytes, cb.size),
                        ],
                    );
                }
            }
        }
        allocated
    }

    /// Block `b` becomes a restored allocation: its phase and statistics (an allocation
    /// of its whole size, as PyTorch counts it).
    fn count_restored(&mut self, b: BlockId) {
        let blk = &mut self.blocks[b];
        blk.phase = Phase::Allocated;
        let (size, st) = (blk.size, blk.kind.stat_type());
        blk.requested = size;
        self.acct.increase_all(
            st,
            &[
                (Kind::Allocation, 1),
                (Kind::AllocatedBytes, size),
                (Kind::Active, 1),
                (Kind::ActiveBytes, size),
                (Kind::RequestedBytes, size),
            ],
        );
        if size >= self.shared.config.max_split_size {
            self.acct
                .increase_all(StatType::Aggregate, &[(Kind::OversizeAllocations, 1)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, malloc_in_ok, shard};
    use super::*;

    const POOL: MempoolId = MempoolId(3, 0);

    /// A shard with pool `POOL` live and three 1000-byte allocations in it.
    fn with_three() -> (
        std::sync::Arc<crate::device::sim::SimDevice>,
        ShardState,
        [DevicePtr; 3],
    ) {
        let (sim, mut st) = shard("hot_cache:False");
        st.shared.pools.incref(POOL).unwrap();
        let mut p = [0; 3];
        for x in &mut p {
            *x = malloc_in_ok(&mut st, POOL, 1000);
        }
        (sim, st, p)
    }

    #[test]
    fn a_restore_puts_back_exactly_the_checkpointed_blocks() {
        let (_sim, mut st, [a, b, c]) = with_three();
        free(&mut st, b);
        let saved = st.pool_segments(POOL).unwrap();
        assert_eq!(saved.len(), 1);
        let shape: Vec<_> = saved[0]
            .blocks
            .iter()
            .map(|x| (x.ptr, x.allocated))
            .collect();
        assert_eq!(shape[..3], [(a, true), (b, false), (c, true)]);
        // Later: c freed, b and two more allocated, a different shape.
        free(&mut st, c);
        let d = malloc_in_ok(&mut st, POOL, 5000);
        let _e = malloc_in_ok(&mut st, POOL, 1000);
        let refs: Vec<_> = saved.iter().collect();
        st.check_restorable(POOL, &refs).unwrap();
        let mut freed = st.free_pool_allocations(POOL);
        st.settle_pool_waits(POOL).unwrap();
        freed.sort_unstable();
        let mut want = vec![a, d, _e];
        want.sort_unstable();
        assert_eq!(freed, want);
        let back = st.restore_segment(POOL, &saved[0]);
        assert_eq!(back, vec![(a, 1024), (c, 1024)]);
        assert_eq!(st.pool_segments(POOL).unwrap(), saved, "the same blocks");
        assert_eq!(st.acct.stats().allocation[0].current, 2);
        assert_eq!(st.acct.stats().allocated_bytes[0].current, 2048);
        check(&st);
        free(&mut st, a);
        free(&mut st, c);
        check(&st);
    }

    #[test]
    fn pending_frees_of_the_pool_are_waited_for_and_a_moved_segment_is_refused() {
        let (sim, mut st, [a, _b, _c]) = with_three();
        let saved = st.pool_segments(POOL).unwrap();
        let refs: Vec<_> = saved.iter().collect();
        let side = sim.create_stream(0).unwrap();
        let id = *st.ptrs.get(&a).unwrap();
        st.record_stream(id, a, side).unwrap();
        sim.launch(0, side, |_| {}).unwrap();
        free(&mut st, a);
        assert!(st.pool_segments(POOL).is_err(), "a free waits for `side`");
        st.settle_pool_waits(POOL).unwrap();
        assert_eq!(st.pending_count(), 0);
        assert_eq!(
            sim.pending(0, side).unwrap(),
            0,
            "the host waited for `side`"
        );
        st.check_restorable(POOL, &refs).unwrap();
        let mut moved = saved[0].clone();
        moved.blocks[0].ptr += 512;
        assert!(matches!(
            st.check_restorable(POOL, &[&moved]),
            Err(Error::InvalidArgument(_))
        ));
        let mut shrunk = saved[0].clone();
        shrunk.blocks.pop();
        assert!(matches!(
            st.check_restorable(POOL, &[&shrunk]),
            Err(Error::InvalidState(_))
        ));
        check(&st);
    }

    #[test]
    fn expandable_segments_are_refused_with_a_clear_error() {
        let (_sim, mut st) = shard("expandable_segments:True");
        st.shared.pools.incref(POOL).unwrap();
        let _p = malloc_in_ok(&mut st, POOL, 1000);
        let e = st.pool_segments(POOL).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        assert!(e.to_string().contains("expandable"));
    }
}
