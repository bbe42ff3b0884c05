//! The ladder's rungs across shards (`shard/ladder.rs`: `ReleaseClean`, `ReleaseOthers`):
//! a shard's climb stops there with a named outcome, and the caller, holding no shard
//! lock, releases and climbs again.
//!
//! - `ReleaseClean` ([`Outcome::NeedsCleanRelease`]): every stream's cached segments
//!   that can go back without a host wait (whole, free, not dirty; completed events and
//!   fences taken in first) go back, and if any did, the shard climbs the whole ladder
//!   again (an allocation served so counts as a retry); if none did, or the climb stops
//!   again, on to `ReleaseOthers`.
//! - `ReleaseOthers` ([`Outcome::NeedsAllReleased`]): every other stream's cache goes
//!   back (PyTorch's `release_cached_blocks`, host-synchronising what it must), and the
//!   shard climbs again from its cache rungs to the rungs after this one (`ReleaseOwn`
//!   and on), which either serve or end in out of memory.
//!
//! Locking: one shard lock at a time, never two; the allocating shard's lock is not held
//! while the other shards' caches are released (a climb visits the others with
//! `try_lock` only, as lending does). A capture never gets here: its shard's climb is out
//! of memory at the first rung across shards (a capture never synchronises).

use super::shard::{Outcome, Released};
use super::{CachingAllocator, OtherShards, Shard};
use crate::device::{DevicePtr, StreamHandle};
use crate::error::Error;

impl CachingAllocator {
    /// The rungs across shards for a request of `size` bytes on `shard`'s stream, whose
    /// climb stopped with `outcome`.
    #[cold]
    #[inline(never)]
    pub(super) fn last_resort(
        &self,
        outcome: Outcome,
        size: usize,
        shard: &Shard,
    ) -> Result<DevicePtr, Error> {
        let mut outcome = outcome;
        if let Outcome::NeedsCleanRelease = outcome {
            outcome = self.release_clean_and_climb(size, shard)?;
        }
        if let Outcome::NeedsAllReleased = outcome {
            outcome = self.release_others_and_climb(size, shard)?;
        }
        self.end_of_climb(outcome, size)
    }

    /// What the last climb for `size` bytes gives: its address, or out of memory; a
    /// climb that stopped at a release rung again is an error.
    pub(super) fn end_of_climb(&self, outcome: Outcome, size: usize) -> Result<DevicePtr, Error> {
        match outcome {
            Outcome::Served(ptr) => Ok(ptr),
            Outcome::OutOfMemory(e) => Err(self.malloc_failed(e, size)),
            Outcome::NeedsCleanRelease | Outcome::NeedsAllReleased => Err(Error::InvalidState(
                "the ladder stopped at a release rung twice".into(),
            )),
        }
    }

    /// Every shard but `stream`'s gives its cache back (PyTorch's
    /// `release_cached_blocks`); a shard that cannot is left as it is.
    pub(super) fn release_other_caches(&self, stream: StreamHandle) {
        let _ = self.for_other_shards(stream, |st| {
            let _ = st.release_cached_blocks();
            Ok::<(), Error>(())
        });
    }

    /// `ReleaseClean`: every shard's cached segments that need no host wait go back;
    /// if any did, the shard climbs again.
    fn release_clean_and_climb(&self, size: usize, shard: &Shard) -> Result<Outcome, Error> {
        let mut released = false;
        for s in self.shards.all() {
            released |= self.with_shard(s, |st| st.release_clean_segments());
        }
        if !released {
            return Ok(Outcome::NeedsAllReleased);
        }
        let peers = self.peers_of(shard);
        let found = self.with_shard(shard, |st| {
            let found = st.malloc(size, Released::Clean, &peers);
            if let Ok(Outcome::Served(_)) = found {
                // PyTorch's count of allocations that needed the cache released and a
                // retry (`ReleaseOwn` counts its own).
                st.count_retry();
            }
            found
        });
        found.map_err(|e| self.malloc_failed(e, size))
    }

    /// `ReleaseOthers`: the other shards' caches go back, then the shard climbs the
    /// rest of the ladder.
    fn release_others_and_climb(&self, size: usize, shard: &Shard) -> Result<Outcome, Error> {
        self.release_other_caches(shard.stream);
        let peers = self.peers_of(shard);
        let found = self.with_shard(shard, |st| st.malloc(size, Released::Others, &peers));
        found.map_err(|e| self.malloc_failed(e, size))
    }

    /// The shards other than `shard`, for a climb of it.
    fn peers_of<'a>(&'a self, shard: &Shard) -> OtherShards<'a> {
        OtherShards {
            table: &self.shards,
            own: shard.stream,
            shared: &self.shared,
        }
    }
}
