//! Graph-private pools and capture (PyTorch's `beginAllocateToPool` / `endAllocateToPool`
//! / `releasePool`).
//!
//! Contract: while the shard captures (`capturing` is `Some(tag)`), its allocations come
//! only from segments of that private pool and its frees of blocks used on other streams
//! are deferred (no event may be recorded during a capture) until the capture ends.
//!
//! Invariants:
//! - pool tag 0 is the stream's own pool; tag `t > 0` is `private[t - 1]`;
//! - a private pool's cached segments go back to the device only when its `use_count`
//!   is 0 (every capture using it was released);
//! - every deferred free holds one wait (`Phase::Awaiting`) until `end_allocate_to_pool`;
//! - every change of a private pool's device memory (a segment allocated or released,
//!   pages mapped or unmapped) goes through `note_pool_reserved`, so the device-wide
//!   `Shared::private_reserved` equals the bytes of the pool's blocks over all shards.

use super::ShardState;
use crate::device::MempoolId;
use crate::error::Error;
use crate::pool::{PoolKind, PoolTag, PrivateTag};

/// A graph-private pool (PyTorch's `PrivatePool`).
#[derive(Clone, Copy, Debug)]
pub struct PrivatePool {
    /// The caller's pool id (`MempoolId_t`).
    pub id: MempoolId,
    /// Captures using it that were not released; 0 = its memory may go back.
    pub use_count: u32,
}

impl ShardState {
    /// The pool this shard's allocations go to now.
    #[inline]
    pub(super) fn route(&self) -> PoolTag {
        self.capture.capturing
    }

    /// Whether a graph capture is underway: this shard's, or another stream's on the
    /// device. Then no event query, synchronisation or device free may be made (the
    /// runtime refuses them from a capturing thread; PyTorch's `captures_underway`).
    #[inline]
    pub(super) fn capture_underway(&self) -> bool {
        self.capture.capturing.is_some() || self.shared.capture_underway()
    }

    /// Whether cached segments of pool `tag` may go back to the device.
    pub(super) fn pool_releasable(&self, tag: PoolTag) -> bool {
        tag.is_none_or(|t| self.capture.private[t.index()].use_count == 0)
    }

    /// The tag of private pool `id`, if this shard has it.
    pub(super) fn private_tag(&self, id: MempoolId) -> Option<PrivateTag> {
        self.capture
            .private
            .iter()
            .position(|p| p.id == id)
            .map(PrivateTag::new)
    }

    /// Starts routing this stream's allocations to private pool `id` (created, or its
    /// use count raised).
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), Error> {
        if id == MempoolId(0, 0) {
            return Err(Error::InvalidArgument("pool id (0, 0) is reserved".into()));
        }
        if let Some(t) = self.capture.capturing {
            return Err(Error::InvalidState(format!(
                "this stream is already allocating to pool {:?}",
                self.capture.private[t.index()].id
            )));
        }
        let tag = match self.private_tag(id) {
            Some(t) => {
                let p = &mut self.capture.private[t.index()];
                if p.use_count == 0 {
                    return Err(Error::InvalidState(format!("pool {id:?} was released")));
                }
                p.use_count += 1;
                t
            }
            None => {
                self.capture.private.push(PrivatePool { id, use_count: 1 });
                PrivateTag::new(self.capture.private.len() - 1)
            }
        };
        self.capture.capturing = Some(tag);
        Ok(())
    }

    /// Whether this stream is allocating to private pool `id` now.
    pub fn is_capturing_to(&self, id: MempoolId) -> bool {
        self.capture
            .capturing
            .is_some_and(|t| self.capture.private[t.index()].id == id)
    }

    /// Stops routing to the private pool and records the events of frees deferred
    /// during the capture.
    pub fn end_allocate_to_pool(&mut self) {
        self.capture.capturing = None;
        for id in std::mem::take(&mut self.capture.deferred) {
            // The deferred free's wait ends; its events are recorded now.
            self.blocks[id].end_wait();
            self.insert_events(id);
        }
    }

    /// Drops one use of private pool `id`; at zero its cached memory may go back to
    /// the device (at the next cache release). Returns whether this shard has the pool.
    pub fn release_pool(&mut self, id: MempoolId) -> bool {
        match self.private_tag(id) {
            Some(t) => {
                let p = &mut self.capture.private[t.index()];
                p.use_count = p.use_count.saturating_sub(1);
                true
            }
            None => false,
        }
    }

    /// Counts `bytes` of device memory that pool `tag` gained (`grew`) or gave back in
    /// the device-wide reserved bytes per private pool; the stream's own pool (`None`)
    /// is not counted there. Called on slow paths only (device allocation and free).
    pub(super) fn note_pool_reserved(
        &self,
        tag: PoolTag,
        kind: PoolKind,
        bytes: usize,
        grew: bool,
    ) {
        let Some(t) = tag else { return };
        let id = self.capture.private[t.index()].id;
        let mut pools = self.shared.private_reserved.lock();
        if grew {
            pools.increase(id, kind.stat_type(), bytes);
        } else {
            pools.decrease(id, kind.stat_type(), bytes);
        }
    }

    /// Device bytes held by private-pool segments.
    pub fn private_pool_bytes(&self) -> usize {
        self.blocks
            .iter()
            .filter(|(_, b)| b.pool.is_some())
            .map(|(_, b)| b.size)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{check, free, id_of, malloc_ok, shard};

    use crate::device::MempoolId;
    use crate::error::Error;
    use crate::pool::PrivateTag;

    #[test]
    fn a_capture_allocates_from_its_private_pool_until_released() {
        let (_sim, mut st) = shard("");
        st.begin_allocate_to_pool(MempoolId(7, 9)).unwrap();
        assert!(st.is_capturing_to(MempoolId(7, 9)));
        let p = malloc_ok(&mut st, 1000);
        assert_eq!(st.blocks[id_of(&st, p)].pool, Some(PrivateTag::new(0)));
        st.end_allocate_to_pool();
        free(&mut st, p);
        let held = st.private_pool_bytes();
        assert_eq!(held, 2 << 20);
        st.release_cached_blocks().unwrap();
        assert_eq!(
            st.private_pool_bytes(),
            held,
            "the capture was not released"
        );
        assert!(st.release_pool(MempoolId(7, 9)));
        assert!(!st.release_pool(MempoolId(1, 1)), "an unknown pool");
        st.release_cached_blocks().unwrap();
        assert_eq!((st.private_pool_bytes(), st.acct.reserved()), (0, 0));
        check(&st);
    }

    #[test]
    fn a_private_pool_s_segments_are_counted_device_wide_until_given_back() {
        let (_sim, mut st) = shard("");
        let reserved = |st: &super::ShardState| {
            let e = st.shared.private_reserved.lock().entries();
            e.iter()
                .map(|p| (p.id, p.reserved_bytes[0].current))
                .collect::<Vec<_>>()
        };
        let own = malloc_ok(&mut st, 1000);
        assert_eq!(
            reserved(&st),
            vec![],
            "the stream's own pool is not counted"
        );
        st.begin_allocate_to_pool(MempoolId(7, 9)).unwrap();
        let p = malloc_ok(&mut st, 1000);
        st.end_allocate_to_pool();
        assert_eq!(reserved(&st), vec![(MempoolId(7, 9), 2 << 20)]);
        free(&mut st, p);
        free(&mut st, own);
        st.release_pool(MempoolId(7, 9));
        st.release_cached_blocks().unwrap();
        assert_eq!(
            reserved(&st),
            vec![(MempoolId(7, 9), 0)],
            "given back, kept"
        );
        check(&st);
    }

    #[test]
    fn pool_ids_are_checked() {
        let (_sim, mut st) = shard("");
        assert!(matches!(
            st.begin_allocate_to_pool(MempoolId(0, 0)),
            Err(Error::InvalidArgument(_))
        ));
        st.begin_allocate_to_pool(MempoolId(1, 2)).unwrap();
        assert!(matches!(
            st.begin_allocate_to_pool(MempoolId(3, 4)),
            Err(Error::InvalidState(_))
        ));
        st.end_allocate_to_pool();
        st.release_pool(MempoolId(1, 2));
        assert!(matches!(
            st.begin_allocate_to_pool(MempoolId(1, 2)),
            Err(Error::InvalidState(_))
        ));
    }
}
