//! The device's graph-private pools and graph captures: one use count per pool
//! (PyTorch's `PrivatePool::use_count` over `graph_pools`), and the count of captures
//! underway (torch_npu's `markCaptureBegin` / `markCaptureEnd`).
//!
//! A pool spans streams: each stream's shard holds the segments it allocated for the
//! pool (the capture stream's, and those of side streams joined to the capture), all
//! under the one count kept here.
//!
//! Contract:
//! - `incref` creates a pool with one use, or adds a use (every capture or
//!   `beginAllocateToPool` into it, an empty one too, and `createOrIncrefPool`);
//!   `release` drops exactly one use;
//! - a pool is *live* while its count is above 0: its segments never go back to the
//!   device, and it may be allocated into; at 0 it is forgotten here, and its segments
//!   go back at the next cache release once nothing in them is allocated;
//! - a forgotten pool id may be used again: `incref` makes it live with one use, and
//!   the segments it still holds (allocations outlived the pool) are its own again;
//! - captures underway are counted device-wide: while any is, no event is queried,
//!   recorded or synchronised by the allocator and nothing goes back to the device
//!   (the runtime refuses those calls during a capture).
//!
//! Invariants: `uses` holds exactly the live pools, each with a count above 0, never
//! the reserved id (0, 0); `captures` is the number of `capture_begin` without their
//! `capture_end`.
//!
//! Locking: `uses` is a leaf lock (no other lock is taken while it is held);
//! `captures` is read without a lock on the allocator's paths.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::error::Error;
use crate::handle::MempoolId;

/// The id no pool may have: PyTorch's "no pool".
pub const NO_POOL: MempoolId = MempoolId(0, 0);

/// Use counts of the live pools and the captures underway of one device.
#[derive(Debug, Default)]
pub(crate) struct GraphPools {
    uses: Mutex<FxHashMap<MempoolId, u32>>,
    captures: AtomicUsize,
}

impl GraphPools {
    /// Creates pool `id` with one use, or adds a use to it; returns the new count.
    pub fn incref(&self, id: MempoolId) -> Result<u32, Error> {
        check_id(id)?;
        let mut uses = self.uses.lock();
        let n = uses.entry(id).or_insert(0);
        *n = n
            .checked_add(1)
            .ok_or_else(|| Error::InvalidState(format!("pool {id:?} has too many uses")))?;
        Ok(*n)
    }

    /// Drops one use of pool `id`; returns the new count (0: the pool is forgotten).
    pub fn release(&self, id: MempoolId) -> Result<u32, Error> {
        check_id(id)?;
        let mut uses = self.uses.lock();
        let Some(n) = uses.get_mut(&id) else {
            return Err(Error::UnknownPool {
                id,
                why: "nothing to release",
            });
        };
        *n -= 1;
        let left = *n;
        if left == 0 {
            uses.remove(&id);
        }
        Ok(left)
    }

    /// Pool `id`'s use count (0 for a pool that is not live).
    pub fn use_count(&self, id: MempoolId) -> u32 {
        self.uses.lock().get(&id).copied().unwrap_or(0)
    }

    /// Whether pool `id` has a use (its segments stay; it may be allocated into).
    pub fn is_live(&self, id: MempoolId) -> bool {
        self.use_count(id) > 0
    }

    /// `Ok` if pool `id` is live, else the error to report for `what`.
    pub fn require_live(&self, id: MempoolId, what: &'static str) -> Result<(), Error> {
        check_id(id)?;
        if self.is_live(id) {
            return Ok(());
        }
        Err(Error::UnknownPool { id, why: what })
    }

    /// The live pools and their counts, in id order.
    pub fn live(&self) -> Vec<(MempoolId, u32)> {
        let mut v: Vec<_> = self.uses.lock().iter().map(|(&id, &n)| (id, n)).collect();
        v.sort_by_key(|&(id, _)| (id.0, id.1));
        v
    }

    /// A graph capture starts on the device.
    pub fn capture_begin(&self) {
        self.captures.fetch_add(1, Ordering::AcqRel);
    }

    /// A graph capture ended; returns the captures still underway. Refused when none is.
    pub fn capture_end(&self) -> Result<usize, Error> {
        self.captures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|was| was - 1)
            .map_err(|_| Error::InvalidState("no graph capture is underway".into()))
    }

    /// Whether a graph capture is underway on the device.
    #[inline]
    pub fn capture_underway(&self) -> bool {
        self.captures.load(Ordering::Acquire) > 0
    }
}

/// Refuses the reserved id (0, 0).
pub(crate) fn check_id(id: MempoolId) -> Result<(), Error> {
    if id == NO_POOL {
        return Err(Error::InvalidArgument(
            "pool id (0, 0) is reserved (it means no pool)".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: MempoolId = MempoolId(1, 2);

    #[test]
    fn one_count_per_pool_up_and_down_to_forgotten() {
        let g = GraphPools::default();
        assert_eq!(g.use_count(P), 0);
        assert_eq!(g.incref(P).unwrap(), 1);
        assert_eq!(g.incref(P).unwrap(), 2);
        assert_eq!(g.release(P).unwrap(), 1);
        assert!(g.is_live(P));
        assert_eq!(g.release(P).unwrap(), 0);
        assert!(!g.is_live(P));
        assert!(g.live().is_empty(), "forgotten at 0");
        assert!(matches!(g.release(P), Err(Error::UnknownPool { .. })));
        assert_eq!(g.incref(P).unwrap(), 1, "used again after 0");
    }

    #[test]
    fn the_reserved_id_is_refused() {
        let g = GraphPools::default();
        assert!(matches!(g.incref(NO_POOL), Err(Error::InvalidArgument(_))));
        assert!(matches!(g.release(NO_POOL), Err(Error::InvalidArgument(_))));
        assert!(g.require_live(NO_POOL, "x").is_err());
        assert!(g.live().is_empty());
    }

    #[test]
    fn captures_nest_and_an_unmatched_end_is_refused() {
        let g = GraphPools::default();
        assert!(!g.capture_underway());
        assert!(g.capture_end().is_err());
        g.capture_begin();
        g.capture_begin();
        assert_eq!(g.capture_end().unwrap(), 1);
        assert!(g.capture_underway());
        assert_eq!(g.capture_end().unwrap(), 0);
        assert!(!g.capture_underway());
        assert!(g.capture_end().is_err(), "the count stays at 0");
        assert!(!g.capture_underway());
    }

    #[test]
    fn require_live_names_the_pool_and_the_reason() {
        let g = GraphPools::default();
        let e = g.require_live(P, "cannot checkpoint it").unwrap_err();
        assert_eq!(
            e.to_string(),
            "pool (1, 2) is not live (it has no use): cannot checkpoint it"
        );
        g.incref(P).unwrap();
        assert!(g.require_live(P, "x").is_ok());
    }
}
