//! The values the miss path passes between its rungs: a request sized once, where it
//! is served, how a climb of the ladder ends, and the small choices a rung is asked to
//! make. A leaf of the shard: pure data, no methods on `ShardState`, so that the rungs
//! (`lending.rs`, `pressure.rs`, `keep_whole.rs`, ...) and the ladder that calls them
//! (`ladder.rs`) all stand above it.

use crate::error::Error;
use crate::handle::{DevicePtr, StreamHandle};
use crate::pool::{BlockId, PoolKind};

/// One malloc request, sized once (PyTorch's `AllocParams`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request {
    /// Bytes the caller asked for.
    pub size: usize,
    /// The block size that serves it (padded and rounded).
    pub rounded: usize,
    /// The pool the block comes from.
    pub kind: PoolKind,
    /// The stream that will use the block: this shard's own, or a borrower's.
    pub stream: StreamHandle,
    /// Best fit's block for it in the own cache was kept whole (`keep_whole.rs`): it
    /// grows the least it can. Set once the cache rungs missed.
    pub kept_whole: bool,
}

/// Where a request that missed this stream's free lists is served.
pub(crate) enum Grant {
    /// A block of this shard (from a new or borrowed segment, or pages mapped).
    Own(BlockId),
    /// A block lent by another stream's shard, which keeps it (`lending.rs`).
    Lent(DevicePtr),
}

/// How a shard's climb of the ladder ended (`ladder.rs`).
#[must_use]
pub(crate) enum Outcome {
    /// The request is served at this address.
    Served(DevicePtr),
    /// Only the rung `ReleaseClean` can help now: the caller, holding no shard lock,
    /// gives back every stream's cached segments that need no host wait and climbs
    /// again with [`Released::Clean`].
    NeedsCleanRelease,
    /// Only the rung `ReleaseOthers` can help now: the caller, holding no shard lock,
    /// gives back the other streams' caches and climbs again with
    /// [`Released::Others`].
    NeedsAllReleased,
    /// Out of memory, counted; the error carries torch_npu's message.
    OutOfMemory(Error),
}

impl Outcome {
    /// The address served, if any (tests).
    #[cfg(test)]
    pub fn served(&self) -> Option<DevicePtr> {
        match self {
            Outcome::Served(ptr) => Some(*ptr),
            _ => None,
        }
    }

    /// The error of an out-of-memory outcome (tests).
    #[cfg(test)]
    #[track_caller]
    pub fn unwrap_oom(self) -> Error {
        match self {
            Outcome::OutOfMemory(e) => e,
            _ => panic!("the climb did not end in out of memory"),
        }
    }
}

/// What the caller released across shards before this climb: where the climb goes
/// past the rungs that reach across shards (`ladder.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Nothing: a fresh request.
    Nothing,
    /// Every stream's clean cached segments (rung `ReleaseClean`): the whole ladder
    /// again, that rung passed over.
    Clean,
    /// The other streams' caches (rung `ReleaseOthers`): the cache rungs again, then
    /// the rungs after it.
    Others,
}

/// Whether a miss grows this shard's cache before it borrows, and why (`lending.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GrowFirst {
    /// No: lending first, as usual.
    No,
    /// Yes, for a repeat borrow: that growth does not count as the device growing.
    Repeat,
    /// Yes, because this shard is steady: that growth counts as the device growing.
    Steady,
}

/// Whether a borrow counts for lending's repeat rule (`lending.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counting {
    /// It counts: a borrow of a climb that did not grow first.
    Counted,
    /// It does not: the climb grew first and failed (memory is short), or the ladder
    /// has no repeat rule, or the borrow comes after the release rungs.
    Uncounted,
}

/// Which best fit a lender uses for a borrower's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BestFit {
    /// The own cache's: a whole segment may be kept for its size (`keep_whole.rs`).
    KeepingWhole,
    /// PyTorch's `get_free_block`.
    Plain,
}
