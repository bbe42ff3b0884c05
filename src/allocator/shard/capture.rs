//! Graph-private pools in one stream's shard (PyTorch's `beginAllocateToPool` /
//! `endAllocateToPool` routing, and the frees deferred while a capture is underway).
//!
//! A pool is device-wide (its use count lives in `../graph_pools.rs`); each shard
//! holds the segments its stream allocated for it, tagged with a local [`PrivateTag`].
//! Allocations go to a pool in two ways: a *route* (this stream's allocations go to
//! the pool until `end_route`) or one *request* (`malloc_in`: the caller's filter chose
//! the pool for this allocation). Routing is not capturing: a real capture is the
//! device-wide count of `graph_pools.rs`, and only it stops event calls.
//!
//! Contract:
//! - while the shard routes to a pool, or serves a request for one, its allocations
//!   come only from that pool's segments (its free blocks, or a new segment tagged
//!   with it), never from another pool, another stream or lending;
//! - cached segments of a live pool never go back to the device;
//! - while a capture is underway on the device, a free of a block used on other
//!   streams records no event: the free is deferred, and once no capture is underway
//!   its events are recorded (PyTorch's `needs_events_deferred_until_no_capture`). For
//!   every stream it was used on: PyTorch drops the uses recorded from a capturing
//!   stream, but a device-wide capture count cannot tell those from uses by eager work
//!   on other streams during the capture, which must be waited for (an event recorded
//!   on a stream whose captured work never runs eagerly completes at once).
//!
//! Invariants:
//! - pool tag 0 is the stream's own pool; tag `t > 0` names `ids[t - 1]`, and a tag,
//!   once given, always names the same pool id;
//! - `current` is `routed` except during a request's malloc;
//! - every deferred free holds one wait (`Phase::Awaiting`) until its events are
//!   recorded, and still lists its stream uses;
//! - every change of a private pool's device memory (a segment allocated or released,
//!   pages mapped or unmapped) goes through `note_device_memory`, so the device-wide
//!   `Shared::private_reserved` equals the bytes of the pool's blocks over all shards.

use super::request::{Outcome, Released};
use super::{Peers, ShardState};
use crate::allocator::history::{TraceAction, TraceEvent};
use crate::device::{DevicePtr, MempoolId};
use crate::error::Error;
use crate::pool::{BlockId, PoolKind, PoolTag, PrivateTag};

/// The graph-pool state of one shard.
#[derive(Default)]
pub(crate) struct Capture {
    /// Pool ids by local tag: `PrivateTag::new(i)` names `ids[i]`.
    ids: Vec<MempoolId>,
    /// The pool this stream's allocations go to until `end_route` (a route).
    routed: PoolTag,
    /// Whether the route holds a capture mark (the legacy `begin_allocate_to_pool`).
    marked: bool,
    /// The pool allocations go to now: `routed`, or one request's pool.
    current: PoolTag,
    /// Frees of blocks used on other streams made while a capture was underway.
    deferred: Vec<BlockId>,
}

impl Capture {
    /// The pool id tag `t` names.
    pub fn id_of(&self, t: PrivateTag) -> MempoolId {
        self.ids[t.index()]
    }

    /// How many pool tags this shard has given.
    pub fn tag_count(&self) -> usize {
        self.ids.len()
    }

    /// The frees deferred until no capture is underway.
    pub fn deferred(&self) -> &[BlockId] {
        &self.deferred
    }

    /// Whether block `id`'s free is deferred.
    pub fn is_deferred(&self, id: BlockId) -> bool {
        self.deferred.contains(&id)
    }

    /// The pool this shard's stream routes to, if any.
    pub fn routed(&self) -> PoolTag {
        self.routed
    }
}

impl ShardState {
    /// The pool this shard's allocations go to now.
    #[inline]
    pub(super) fn route(&self) -> PoolTag {
        self.capture.current
    }

    /// Whether a graph capture is underway on the device: then no event query,
    /// record or synchronisation and no device free may be made (the runtime refuses
    /// them during a capture; PyTorch's `captures_underway` guards).
    #[inline]
    pub(super) fn capture_underway(&self) -> bool {
        self.shared.capture_underway()
    }

    /// Whether cached segments of pool `tag` may go back to the device: the stream's
    /// own pool, or a pool with no use left.
    pub(super) fn pool_releasable(&self, tag: PoolTag) -> bool {
        tag.is_none_or(|t| !self.shared.pools.is_live(self.capture.id_of(t)))
    }

    /// The pool id of tag `tag` (`None`: the stream's own pool).
    pub fn pool_id(&self, tag: PoolTag) -> Option<MempoolId> {
        tag.map(|t| self.capture.id_of(t))
    }

    /// The tag of private pool `id`, if this shard has given one.
    pub(super) fn private_tag(&self, id: MempoolId) -> Option<PrivateTag> {
        self.capture
            .ids
            .iter()
            .position(|&p| p == id)
            .map(PrivateTag::new)
    }

    /// The tag of private pool `id`, given now if this shard has none yet.
    pub(super) fn tag_for(&mut self, id: MempoolId) -> PrivateTag {
        self.private_tag(id).unwrap_or_else(|| {
            self.capture.ids.push(id);
            PrivateTag::new(self.capture.ids.len() - 1)
        })
    }

    /// Routes this stream's allocations to pool `id` until `end_route` (the caller
    /// checked that the pool is live). `marked`: the route holds a capture mark, ended
    /// with it. Refused while the stream routes to a pool.
    pub fn route_to(&mut self, id: MempoolId, marked: bool) -> Result<(), Error> {
        if let Some(t) = self.capture.routed {
            return Err(Error::InvalidState(format!(
                "this stream is already allocating to pool {:?}",
                self.capture.id_of(t)
            )));
        }
        let tag = Some(self.tag_for(id));
        self.capture.routed = tag;
        self.capture.current = tag;
        self.capture.marked = marked;
        Ok(())
    }

    /// Whether this stream routes to private pool `id` now.
    pub fn is_capturing_to(&self, id: MempoolId) -> bool {
        self.capture
            .routed
            .is_some_and(|t| self.capture.id_of(t) == id)
    }

    /// Ends this stream's route; returns whether it held a capture mark (which the
    /// caller ends). Frees deferred meanwhile record their events once no capture is
    /// underway.
    pub fn end_route(&mut self) -> bool {
        self.capture.routed = None;
        self.capture.current = None;
        std::mem::take(&mut self.capture.marked)
    }

    /// Legacy begin on this shard alone (PyTorch's `beginAllocateToPool` for a capture
    /// on this stream): adds a use of pool `id`, marks a capture underway and routes
    /// this stream's allocations to the pool. The allocator's
    /// `begin_allocate_to_pool` first settles the stream's lending fences.
    #[cfg(test)]
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), Error> {
        crate::allocator::graph_pools::check_id(id)?;
        if let Some(t) = self.capture.routed {
            return Err(Error::InvalidState(format!(
                "this stream is already allocating to pool {:?}",
                self.capture.id_of(t)
            )));
        }
        self.shared.pools.incref(id)?;
        self.shared.pools.capture_begin();
        self.route_to(id, true)
    }

    /// Ends this shard's route and the capture mark it holds; records the events of the
    /// frees deferred during the capture if no other capture is underway.
    #[cfg(test)]
    pub fn end_allocate_to_pool(&mut self) {
        if self.end_route() {
            let _ = self.shared.pools.capture_end();
        }
        self.insert_deferred_events();
    }

    /// Serves one request of `size` bytes from private pool `id` (the caller checked
    /// that the pool is live), whatever this stream routes to; as `malloc` otherwise.
    pub fn malloc_in(
        &mut self,
        id: MempoolId,
        size: usize,
        released: Released,
        peers: &dyn Peers,
    ) -> Result<Outcome, Error> {
        self.capture.current = Some(self.tag_for(id));
        let found = self.malloc(size, released, peers);
        self.capture.current = self.capture.routed;
        found
    }

    /// A free of block `id`, used on other streams, made while a capture is underway:
    /// its events wait until no capture is (it holds one wait until then).
    pub(super) fn defer_free(&mut self, id: BlockId) {
        self.blocks[id].add_wait();
        self.capture.deferred.push(id);
    }

    /// Records the events of the frees deferred while a capture was underway, if none
    /// is now.
    pub fn insert_deferred_events(&mut self) {
        if self.capture.deferred.is_empty() || self.capture_underway() {
            return;
        }
        for id in std::mem::take(&mut self.capture.deferred) {
            // The deferral's wait ends; the events' waits begin (its uses may have been
            // erased meanwhile: then it is free now).
            let last = self.blocks[id].end_wait();
            if !self.blocks[id].stream_uses.is_empty() {
                self.insert_events(id);
            } else if last {
                self.free_completed(id);
            }
        }
    }

    /// Releases the cached whole segments of pool `id`, which is no longer live
    /// (PyTorch's `emptyCache(mempool_id)`): its pending frees are waited for first
    /// (only theirs, `settle_pool_waits`), then every whole free segment of the pool goes back. Expandable
    /// segments' pages of the pool go back at the next full cache release.
    pub fn release_pool_cache(&mut self, id: MempoolId) -> Result<(), Error> {
        let Some(tag) = self.private_tag(id) else {
            return Ok(());
        };
        debug_assert!(self.pool_releasable(Some(tag)));
        let index = self.index;
        let mut first_err = self.settle_pool_waits(id).err();
        let whole: Vec<BlockId> = self
            .pools
            .get(&Some(tag))
            .into_iter()
            .flat_map(|p| p.small.iter().chain(p.large.iter()))
            .map(|(_, _, b)| b)
            .filter(|&b| self.is_whole_segment(b))
            .collect();
        if !whole.is_empty() {
            self.dev.drain_before_free(index)?;
        }
        for b in whole {
            if let Err(e) = self.release_block(b) {
                first_err.get_or_insert(e);
            }
        }
        self.pools
            .retain(|_, p| !(p.small.is_empty() && p.large.is_empty() && p.hot.is_empty()));
        first_err.map_or(Ok(()), Err)
    }

    /// Notes `bytes` of device memory at `ptr` that pool `tag` gained or gave back
    /// (`action`: a segment allocated or freed, pages mapped or unmapped): in the
    /// device-wide reserved bytes per private pool (the stream's own pool, `None`, is
    /// not counted there) and in the memory history. Called on slow paths only (device
    /// allocation and free).
    pub(super) fn note_device_memory(
        &self,
        tag: PoolTag,
        kind: PoolKind,
        ptr: DevicePtr,
        bytes: usize,
        action: TraceAction,
    ) {
        let pool = self.pool_id(tag);
        self.shared.history.emit(|| TraceEvent {
            action,
            device: self.index,
            address: ptr as u64,
            size: bytes,
            stream: self.stream,
            pool,
        });
        let grew = matches!(action, TraceAction::SegmentAlloc | TraceAction::SegmentMap);
        let Some(id) = pool else { return };
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
    use super::super::testing::{check, free, id_of, malloc_in_ok, malloc_ok, shard};

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
        assert_eq!(st.shared.pools.release(MempoolId(7, 9)).unwrap(), 0);
        assert!(st.shared.pools.release(MempoolId(1, 1)).is_err(), "unknown");
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
        st.shared.pools.release(MempoolId(7, 9)).unwrap();
        st.release_cached_blocks().unwrap();
        assert_eq!(
            reserved(&st),
            vec![(MempoolId(7, 9), 0)],
            "given back, kept"
        );
        check(&st);
    }

    #[test]
    fn pool_ids_are_checked_and_a_released_pool_may_be_begun_again() {
        let (_sim, mut st) = shard("");
        assert!(matches!(
            st.begin_allocate_to_pool(MempoolId(0, 0)),
            Err(Error::InvalidArgument(_))
        ));
        assert!(!st.capture_underway(), "a refused begin marks nothing");
        st.begin_allocate_to_pool(MempoolId(1, 2)).unwrap();
        assert!(matches!(
            st.begin_allocate_to_pool(MempoolId(3, 4)),
            Err(Error::InvalidState(_))
        ));
        assert_eq!(st.shared.pools.use_count(MempoolId(3, 4)), 0);
        st.end_allocate_to_pool();
        assert!(!st.capture_underway());
        st.shared.pools.release(MempoolId(1, 2)).unwrap();
        st.begin_allocate_to_pool(MempoolId(1, 2)).unwrap();
        assert_eq!(st.shared.pools.use_count(MempoolId(1, 2)), 1);
    }

    #[test]
    fn a_request_for_a_pool_leaves_the_stream_s_route_alone() {
        let (_sim, mut st) = shard("");
        let pool = MempoolId(5, 0);
        st.shared.pools.incref(pool).unwrap();
        let p = malloc_in_ok(&mut st, pool, 1000);
        assert_eq!(st.pool_id(st.blocks[id_of(&st, p)].pool), Some(pool));
        assert_eq!(st.route(), None, "back to the stream's own pool");
        let q = malloc_ok(&mut st, 1000);
        assert_eq!(st.blocks[id_of(&st, q)].pool, None);
        assert!(!st.capture_underway(), "a request is not a capture");
        check(&st);
    }

    #[test]
    fn a_free_during_a_capture_records_its_events_once_no_capture_is_underway() {
        let (sim, mut st) = shard("");
        let (before, during) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
        let pool = MempoolId(5, 0);
        let p = malloc_ok(&mut st, 1000);
        let q = malloc_ok(&mut st, 1000);
        st.record_stream(id_of(&st, p), p, before).unwrap();
        st.begin_allocate_to_pool(pool).unwrap();
        st.record_stream(id_of(&st, p), p, during).unwrap();
        st.record_stream(id_of(&st, q), q, during).unwrap();
        let records = sim.counters(0).event_records;
        free(&mut st, p);
        free(&mut st, q);
        assert_eq!(st.capture.deferred().len(), 2, "no event while capturing");
        assert_eq!(sim.counters(0).event_records, records);
        check(&st);
        st.shared.pools.capture_begin(); // a second capture: still none
        st.end_allocate_to_pool();
        assert_eq!(st.capture.deferred().len(), 2);
        st.shared.pools.capture_end().unwrap();
        st.insert_deferred_events();
        assert!(st.capture.deferred().is_empty());
        assert_eq!(
            sim.counters(0).event_records,
            records + 3,
            "one event per use, recorded during the capture or before it"
        );
        assert_eq!(st.pending_count(), 3);
        check(&st);
    }
}
