//! The last rungs of a malloc, across shards: what the shard's own ladder
//! (`shard/ladder.rs`) asks for with `Ok(None)` when only the other streams' caches can
//! help (issue #16's ladder, after own cache → lending → device-side wait):
//!
//! 1. **release cached segments on every stream** that can go back without a host wait
//!    (whole, free, not dirty; completed events and fences taken in first), then run the
//!    shard's ladder again, which may now grow (npualloc's path: `wait_before_growth`,
//!    without expandable segments; skipped when nothing was released);
//! 2. **host-synchronise only the streams that hold pending frees** (each once, at the
//!    event of its last pending free: `synchronize_and_free_events`), release every
//!    cached segment of every stream; take a free block of this stream, grow, else
//!    borrow a free block of another stream (frees just synchronised may have merged
//!    into one that fits), else (a small request) take a free block of this stream's
//!    large pool (`shard/small_spill.rs`); else out of memory.
//!    PyTorch's policy takes this rung alone, synchronises every pending event, as
//!    PyTorch does, and borrows nothing.
//!
//! Locking: one shard lock at a time, never two; the allocating shard's lock is not held
//! while the other shards' caches are released (the retry of rung 1 visits the others
//! with `try_lock` only, as lending does). A capture never gets here: its shard reports
//! out of memory at once (a capture never synchronises).

use super::shard::NoPeers;
use super::{CachingAllocator, OtherShards, Shard};
use crate::device::DevicePtr;
use crate::error::Error;

impl CachingAllocator {
    /// Rungs 1 and 2 for a request of `size` bytes on `shard`'s stream.
    #[cold]
    #[inline(never)]
    pub(super) fn last_resort(&self, size: usize, shard: &Shard) -> Result<DevicePtr, Error> {
        let config = &self.shared.config;
        if config.wait_before_growth && !config.expandable_segments {
            if let Some(ptr) = self.release_clean_and_retry(size, shard)? {
                return Ok(ptr);
            }
        }
        let _ = self.for_other_shards(shard.stream, |st| {
            let _ = st.release_cached_blocks();
            Ok::<(), Error>(())
        });
        let peers = OtherShards {
            table: &self.shards,
            own: shard.stream,
            shared: &self.shared,
        };
        let lend = config.wait_before_growth && config.lend_blocks;
        let found = self.with_shard(shard, |st| {
            st.malloc(size, true, if lend { &peers } else { &NoPeers })
        });
        let ptr = found
            .map_err(|e| self.malloc_failed(e, size))?
            .expect("the last attempt either allocates or reports out of memory");
        Ok(ptr)
    }

    /// Rung 1: every shard's cached segments that need no host wait go back; if any did,
    /// the shard's ladder runs again (an allocation served so counts as a retry, as
    /// rung 2's do). `Ok(None)`: rung 2 is needed.
    fn release_clean_and_retry(
        &self,
        size: usize,
        shard: &Shard,
    ) -> Result<Option<DevicePtr>, Error> {
        let mut released = false;
        for s in self.shards.all() {
            released |= self.with_shard(s, |st| st.release_clean_segments());
        }
        if !released {
            return Ok(None);
        }
        let peers = OtherShards {
            table: &self.shards,
            own: shard.stream,
            shared: &self.shared,
        };
        let found = self.with_shard(shard, |st| {
            let found = st.malloc(size, false, &peers);
            if matches!(found, Ok(Some(_))) {
                // PyTorch's count of allocations that needed the cache released and a
                // retry (rung 2 counts its own).
                st.acct.stats.num_alloc_retries += 1;
            }
            found
        });
        found.map_err(|e| self.malloc_failed(e, size))
    }
}
