//! Cross-stream lending: whole free segments (`lend_segments`) and free blocks
//! (`lend_blocks`) of another stream's shard, ordered on the device.
//!
//! Contract: the borrower waits on the device for an event recorded on the lender's
//! stream before it uses lent memory; the host never blocks; nothing is lent to or by a
//! capturing stream. A lent block stays the lender's: allocated, with the borrower as
//! its first stream use; freed, it comes back at once, dirty on the borrower.
//!
//! Invariant: a lent block is allocated and `stream_uses[0]` is its borrower.

use super::ladder::Request;
use super::Peers;
use super::ShardState;
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::{Block, BlockId, Phase, PoolKind};

/// A lent segment is at most this many times the segment a new allocation would get.
const LEND_SIZE_FACTOR: usize = 2;

impl ShardState {
    /// A lent block freed by its borrower: back to this stream's pool at once (the
    /// caller continues as for any free), marked dirty until a fence on the borrower
    /// completes, so that whoever takes it sooner waits on the device. Returns true if
    /// it was kept back instead: no event may be recorded on a capturing borrower, so
    /// the block waits for the next full synchronisation (cache release or OOM retry).
    #[cold]
    pub(super) fn return_lent(&mut self, id: BlockId) -> bool {
        self.poll_fences(); // recycles the events of completed fences
        let b = &mut self.blocks[id];
        let borrower = b.stream_uses.remove(0);
        if self.shared.is_capturing(borrower) {
            let b = &mut self.blocks[id];
            b.stream_uses.clear();
            b.add_wait();
            self.waits.parked.push(id);
            return true;
        }
        let epoch = self.fence(borrower);
        self.lending.dirty.add(id, borrower, epoch);
        self.blocks[id].dirty = true;
        false
    }

    /// Cross-stream lending (`lend_segments`; never while capturing): instead of a new
    /// device allocation, take a wholly free cached segment from another stream's shard.
    /// This stream waits on the device for an event recorded on the lender's stream
    /// (work queued there on the segment finishes first); the host never blocks.
    pub(super) fn borrow_segment(
        &mut self,
        req: &Request,
        seg_size: usize,
        peers: &dyn Peers,
    ) -> Result<Option<BlockId>, Error> {
        let (stream, kind) = (req.stream, req.kind);
        if !self.shared.config.lend_segments || self.capture.capturing.is_some() {
            return Ok(None);
        }
        let limit = seg_size.saturating_mul(LEND_SIZE_FACTOR);
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_segment(kind, req.rounded, limit, stream);
            lent.is_none()
        });
        let Some((ptr, size)) = lent else {
            return Ok(None);
        };
        self.segment_added(kind, size);
        Ok(Some(
            self.blocks.insert(Block::segment(ptr, size, stream, kind)),
        ))
    }

    /// Gives up the smallest wholly free cached segment of `kind` holding at least
    /// `size` bytes (and at most `limit`) to stream `borrower`, ordered on the device
    /// after the work queued on this stream (and on any stream it is dirty on):
    /// (address, size).
    pub fn lend_segment(
        &mut self,
        kind: PoolKind,
        size: usize,
        limit: usize,
        borrower: StreamHandle,
    ) -> Option<(DevicePtr, usize)> {
        if self.capture.capturing.is_some() {
            return None;
        }
        let (bsize, _, id) = self
            .pools
            .iter()
            .filter(|(tag, _)| tag.is_none())
            .flat_map(|(_, p)| p.get(kind).iter())
            .filter(|&(s, _, id)| s >= size && s <= limit && self.is_whole_segment(id))
            .min_by_key(|&(s, p, _)| (s, p))?;
        self.order_after(borrower, self.stream).ok()?;
        self.wait_for_dirty(id, borrower).ok()?;
        self.pool_remove(id);
        let b = self.blocks.remove(id);
        self.lending.dirty.take(id);
        self.segment_removed(kind, bsize);
        Some((b.ptr, bsize))
    }

    /// Serves `req`, made on another stream (the borrower, `req.stream`), from this
    /// shard's free blocks (best fit, as for its own requests). The borrower first waits
    /// on the device for the work queued on this stream so far. The block stays this
    /// shard's, allocated, with the borrower as its user; once freed it comes back at
    /// once, dirty on the borrower (`return_lent`).
    pub(super) fn lend_block(&mut self, req: &Request) -> Option<DevicePtr> {
        if self.capture.capturing.is_some() {
            return None;
        }
        let (own, borrower) = (self.stream, req.stream);
        let id = self.get_free_block(req.kind, req.rounded)?;
        if self.order_after(borrower, own).is_err() {
            self.pool_insert(id);
            return None;
        }
        let (ptr, id) = self.hand_out(id, req).ok()?;
        let b = &mut self.blocks[id];
        b.phase = Phase::Lent;
        b.stream_uses.insert(0, borrower);
        Some(ptr)
    }

    /// Block lending, the borrower's side (`lend_blocks`; never while capturing): another
    /// stream's free block for this request (see `lend_block`).
    pub(super) fn borrow_block(&mut self, req: &Request, peers: &dyn Peers) -> Option<DevicePtr> {
        if !self.shared.config.lend_blocks || self.capture.capturing.is_some() {
            return None;
        }
        let mut lent = None;
        peers.visit(&mut |other| {
            lent = other.lend_block(req);
            lent.is_none()
        });
        lent
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::super::testing::{check, device, id_of, Others};
    use super::super::ShardState;
    use crate::device::StreamHandle;
    use crate::stream::UNFENCED;

    #[test]
    fn a_free_block_is_lent_and_comes_back_dirty() {
        let (sim, shared) = device(1 << 30, "lend_segments:False");
        let side = sim.create_stream(0).unwrap();
        let lender = RefCell::new(ShardState::new(StreamHandle::DEFAULT, shared.clone()));
        let mut borrower = ShardState::new(side, shared);
        let p = {
            let mut l = lender.borrow_mut();
            let p = l.malloc(4 << 20, false, &Others(vec![])).unwrap().unwrap();
            let id = l.ptrs.remove(&p).unwrap();
            l.free(id);
            p
        };
        let q = borrower
            .malloc(4 << 20, false, &Others(vec![&lender]))
            .unwrap()
            .unwrap();
        assert_eq!(q, p, "served from the lender's free block");
        assert_eq!(
            sim.counters(0).mallocs,
            1,
            "no device malloc for the borrower"
        );
        assert!(borrower.ptrs.get(&q).is_none());
        let mut l = lender.borrow_mut();
        let id = id_of(&l, q);
        assert_eq!(l.blocks[id].borrower(), Some(side));
        check(&l);
        l.ptrs.remove(&q);
        l.free(id);
        assert!(
            l.blocks[id].dirty,
            "free, but the borrower may still use it"
        );
        check(&l);
        // The borrower's queue starts with its wait for the lender's stream.
        sim.complete_stream(0, side).unwrap();
        l.poll_fences();
        assert!(l.is_dirty(id), "the borrower is held behind the lender");
        sim.complete_stream(0, StreamHandle::DEFAULT).unwrap();
        sim.complete_stream(0, side).unwrap();
        l.poll_fences();
        assert!(!l.is_dirty(id), "the borrower's fence completed");
    }

    /// Issue #17 item 8: with expandable segments, a lent block freed by its borrower
    /// while no event could be created stayed dirty (unfenced) through every full
    /// synchronisation, so its pages were never unmapped.
    #[test]
    fn a_block_freed_without_a_fence_goes_back_at_the_next_full_synchronisation() {
        let (sim, shared) = device(1 << 30, "expandable_segments:True");
        let side = sim.create_stream(0).unwrap();
        let lender = RefCell::new(ShardState::new(StreamHandle::DEFAULT, shared.clone()));
        let mut borrower = ShardState::new(side, shared);
        {
            let mut l = lender.borrow_mut();
            let p = l.malloc(4 << 20, false, &Others(vec![])).unwrap().unwrap();
            let id = l.ptrs.remove(&p).unwrap();
            l.free(id);
        }
        let q = borrower
            .malloc(4 << 20, false, &Others(vec![&lender]))
            .unwrap()
            .unwrap();
        let mut l = lender.borrow_mut();
        let id = id_of(&l, q);
        assert_eq!(l.blocks[id].borrower(), Some(side));
        // No idle event to reuse, and creating one fails: the fence cannot be recorded.
        l.waits.events.destroy_idle(&*sim, 0).unwrap();
        sim.fail_nth_event_create(0, 1);
        l.ptrs.remove(&q);
        l.free(id);
        assert_eq!(l.lending.dirty.get(id), [(side, UNFENCED)]);
        check(&l);
        l.release_cached_blocks().unwrap();
        check(&l);
        assert_eq!(
            l.acct.reserved, 0,
            "pages of the unfenced block stayed mapped"
        );
        let c = sim.counters(0);
        assert_eq!(c.maps, c.unmaps);
    }

    #[test]
    fn a_wholly_free_segment_moves_to_the_borrower() {
        let (sim, shared) = device(1 << 30, "");
        let side = sim.create_stream(0).unwrap();
        let lender = RefCell::new(ShardState::new(StreamHandle::DEFAULT, shared.clone()));
        let mut borrower = ShardState::new(side, shared);
        {
            let mut l = lender.borrow_mut();
            let p = l.malloc(4 << 20, false, &Others(vec![])).unwrap().unwrap();
            let id = l.ptrs.remove(&p).unwrap();
            l.free(id);
        }
        borrower
            .malloc(4 << 20, false, &Others(vec![&lender]))
            .unwrap()
            .unwrap();
        assert_eq!(sim.counters(0).mallocs, 1);
        assert_eq!(
            (lender.borrow().acct.reserved, borrower.acct.reserved),
            (0, 20 << 20)
        );
        check(&lender.borrow());
        check(&borrower);
    }
}
