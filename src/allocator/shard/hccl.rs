//! HCCL's multi-stream memory reuse in one shard (torch_npu's `recordHcclWorkForBlock`
//! / `eraseStreamWithBlockPtr`): the collective (work) that last used an allocation,
//! and erasing the allocation's use of the HCCL stream once its own stream waits for
//! that work.
//!
//! Contract: a work is remembered for a block from `record_hccl_work` until the
//! block's free completes; `erase_stream_for_work` changes a block only if it is the
//! allocation (live, or freed and awaiting) the work was recorded for, of the caller's
//! current stream: then the block's use of `stream` is gone, and a pending free stops
//! waiting for `stream`'s events.
//!
//! Invariant: `works` has entries only for blocks allocated or awaiting.

use rustc_hash::FxHashMap;

use super::ShardState;
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;
use crate::pool::BlockId;

/// The HCCL works remembered for this shard's blocks.
#[derive(Default)]
pub(crate) struct HcclWorks {
    works: FxHashMap<BlockId, usize>,
}

impl HcclWorks {
    /// Whether no work is remembered (the free path tests this before a lookup).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.works.is_empty()
    }

    /// The blocks with a remembered work.
    pub fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.works.keys().copied()
    }
}

impl ShardState {
    /// Remembers `work` as the last HCCL work that used the live allocation `ptr`.
    pub fn record_hccl_work(&mut self, ptr: DevicePtr, work: usize) -> Result<(), Error> {
        let id = *self.ptrs.get(&ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.hccl.works.insert(id, work);
        Ok(())
    }

    /// Block `id`'s free completed: its work is forgotten.
    #[inline]
    pub(super) fn forget_hccl_work(&mut self, id: BlockId) {
        if !self.hccl.is_empty() {
            self.hccl.works.remove(&id);
        }
    }

    /// torch_npu's `eraseStreamWithBlockPtr`: if `ptr` is an allocation of this shard
    /// (live, or freed and awaiting) of stream `current` with `work` remembered, its
    /// use of `stream` is erased (module contract). Returns whether `ptr` is such an
    /// allocation with a remembered work here (changed or not).
    pub fn erase_stream_for_work(
        &mut self,
        ptr: DevicePtr,
        stream: StreamHandle,
        work: usize,
        current: StreamHandle,
    ) -> bool {
        let found = self
            .hccl
            .works
            .iter()
            .find(|(&b, _)| self.blocks.get(b).is_some_and(|blk| blk.ptr == ptr))
            .map(|(&b, &w)| (b, w));
        let Some((id, recorded)) = found else {
            return false;
        };
        let b = &mut self.blocks[id];
        if recorded != work || b.stream != current || stream == b.stream {
            return true;
        }
        if b.is_allocated() {
            if b.borrower() != Some(stream) {
                b.stream_uses.retain(|s| *s != stream);
            }
            return true;
        }
        b.stream_uses.retain(|s| *s != stream);
        let ended = self.waits.take_where(stream, |x| x == id);
        self.waits_ended(ended);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard};

    #[test]
    fn a_pending_free_stops_waiting_for_the_hccl_stream_once_its_work_is_waited_for() {
        let (sim, mut st) = shard("");
        let hccl = sim.create_stream(0).unwrap();
        let own = st.stream;
        let p = malloc_ok(&mut st, 1000);
        st.record_stream(id_of(&st, p), p, hccl).unwrap();
        st.record_hccl_work(p, 0xAA).unwrap();
        sim.launch(0, hccl, |_| {}).unwrap();
        free(&mut st, p);
        assert_eq!(st.pending_count(), 1);
        // Another work, or another current stream: nothing changes.
        assert!(st.erase_stream_for_work(p, hccl, 0xBB, own));
        let other = sim.create_stream(0).unwrap();
        assert!(st.erase_stream_for_work(p, hccl, 0xAA, other));
        assert_eq!(st.pending_count(), 1);
        check(&st);
        assert!(st.erase_stream_for_work(p, hccl, 0xAA, own));
        assert_eq!(
            st.pending_count(),
            0,
            "reusable without the HCCL stream's event"
        );
        assert!(st.hccl.is_empty(), "forgotten once the free completed");
        assert!(
            !st.erase_stream_for_work(p, hccl, 0xAA, own),
            "stale: nothing"
        );
        check(&st);
    }

    #[test]
    fn a_live_allocation_loses_the_use_and_an_unknown_pointer_is_refused() {
        let (sim, mut st) = shard("");
        let hccl = sim.create_stream(0).unwrap();
        let own = st.stream;
        let p = malloc_ok(&mut st, 1000);
        assert!(st.record_hccl_work(p + 512, 1).is_err());
        st.record_stream(id_of(&st, p), p, hccl).unwrap();
        st.record_hccl_work(p, 1).unwrap();
        assert!(st.erase_stream_for_work(p, hccl, 1, own));
        assert!(st.blocks[id_of(&st, p)].stream_uses.is_empty());
        free(&mut st, p);
        assert_eq!(st.pending_count(), 0, "no use left: free at once");
        assert!(st.hccl.is_empty());
        check(&st);
    }
}
