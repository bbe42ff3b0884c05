//! Ordering between streams: device-side waits, fences of lent blocks, dirty marks.
//! Shared by lending and release, so that neither imports the other.
//!
//! Contract: a stream is made to wait for another on the device (an event), never on the
//! host unless event calls fail; a dirty block is handed out only after its taker was
//! ordered after every stream it is dirty on whose fence has not been seen complete.
//!
//! Invariants: a block has dirty marks iff its `dirty` flag is set; a mark whose fence
//! completed is clear and may be dropped at any time.

use super::ShardState;
use crate::device::{DeviceError, StreamHandle};
use crate::error::Error;
use crate::pool::BlockId;
use crate::stream::UNFENCED;

impl ShardState {
    /// Orders `taker` after every stream block `id` is still dirty on (other than
    /// `taker` itself, whose own order suffices).
    #[cold]
    pub(super) fn wait_for_dirty(&mut self, id: BlockId, taker: StreamHandle) -> Result<(), Error> {
        let marks: Vec<_> = self.lending.marks(id).to_vec();
        for (s, epoch) in marks {
            if s != taker && !self.lending.is_clear(s, epoch) {
                self.order_after(taker, s)?;
                if taker == self.stream {
                    self.lending.met(s);
                }
            }
        }
        Ok(())
    }

    /// Drops block `id`'s dirty state if all its marks are clear.
    pub(super) fn prune_marks(&mut self, id: BlockId) {
        if self.blocks[id].dirty && self.lending.all_clear(id) {
            self.lending.forget(id);
            self.blocks[id].dirty = false;
        }
    }

    /// Before `stream` starts capturing: waits for the fences on it, so that no block
    /// stays dirty on it (taking one would record an event on the capturing stream).
    pub fn settle_fences_on(&mut self, stream: StreamHandle) -> Result<(), Error> {
        let index = self.index;
        let waits = &mut self.waits;
        self.lending
            .synchronize_fences(&*self.dev, index, Some(stream), |ev| waits.recycle(ev))?;
        if self.lending.unfenced_on(stream) {
            self.dev.synchronize_stream(index, stream)?;
            for id in self.lending.clear_stream(stream) {
                self.blocks[id].dirty = false;
            }
        }
        Ok(())
    }

    /// Synchronises every stream a block is dirty on without a fence (its event could
    /// not be recorded) and drops those marks, so that after a full synchronisation no
    /// block stays dirty for want of a fence (a dirty block's pages are never unmapped).
    pub(super) fn settle_unfenced(&mut self) -> Result<(), DeviceError> {
        for s in self.lending.unfenced_streams() {
            self.dev.synchronize_stream(self.index, s)?;
            for id in self.lending.clear_stream(s) {
                self.blocks[id].dirty = false;
            }
        }
        Ok(())
    }

    /// Takes in the fences that completed (no waiting). Only lending and slow paths poll
    /// them, never the fast path: a fence frees no memory, it only spares the next taker
    /// of a dirty block a device-side wait and lets a dirty segment go back to the
    /// device (a fence that never completes must not cost every malloc a query).
    pub(super) fn poll_fences(&mut self) {
        if self.capture_underway() {
            return; // no event queries while a graph is captured
        }
        let index = self.index;
        let waits = &mut self.waits;
        (self.lending).poll_fences(&*self.dev, index, |ev| waits.recycle(ev));
    }

    /// Whether block `id` may still be in use on a stream it was lent to.
    pub(super) fn is_dirty(&self, id: BlockId) -> bool {
        self.blocks[id].dirty && !self.lending.all_clear(id)
    }

    /// Records a fence on `borrower` for a lent block it just freed; returns the
    /// epoch of the block's dirty mark.
    pub(super) fn fence(&mut self, borrower: StreamHandle) -> u64 {
        let index = self.index;
        let Ok(ev) = self.waits.event(&*self.dev, index) else {
            return UNFENCED;
        };
        match self.dev.event_record(index, ev, borrower) {
            Ok(()) => self.lending.fenced(borrower, ev),
            Err(_) => {
                self.waits.recycle(ev);
                UNFENCED
            }
        }
    }

    /// Makes `stream` wait on the device for the work queued on `from` so far (an
    /// event recorded on `from`); without events, on the host.
    pub(super) fn order_after(
        &mut self,
        stream: StreamHandle,
        from: StreamHandle,
    ) -> Result<(), Error> {
        let index = self.index;
        let ordered = self.waits.event(&*self.dev, index).and_then(|ev| {
            let r = self
                .dev
                .event_record(index, ev, from)
                .and_then(|_| self.dev.stream_wait_event(index, stream, ev));
            self.waits.recycle(ev);
            r
        });
        if ordered.is_err() {
            self.dev.synchronize_device(index)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::shard;
    use crate::stream::UNFENCED;

    #[test]
    fn a_fence_clears_once_its_stream_ran() {
        let (sim, mut st) = shard("");
        let side = sim.create_stream(0).unwrap();
        let epoch = st.fence(side);
        assert_ne!(epoch, UNFENCED);
        st.poll_fences();
        assert!(!st.lending.is_clear(side, epoch));
        sim.complete_stream(0, side).unwrap();
        st.poll_fences();
        assert!(st.lending.is_clear(side, epoch));
    }

    #[test]
    fn ordering_waits_on_the_device_not_the_host() {
        let (sim, mut st) = shard("");
        let side = sim.create_stream(0).unwrap();
        st.order_after(side, st.stream).unwrap();
        let c = sim.counters(0);
        assert_eq!(c.synchronizations, 0);
        assert_eq!(c.event_records, 1);
        assert_eq!(
            sim.pending(0, side).unwrap(),
            1,
            "a wait queued on the side stream"
        );
    }
}
