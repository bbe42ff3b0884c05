//! A block: a contiguous piece of one device segment.
//!
//! Blocks live in a `slab::Slab<Block>` and link to their address neighbours in the
//! same segment by index (`prev`/`next`).
//!
//! Invariants (checked by `CachingAllocator::check_invariants`):
//! - the blocks of a segment tile it exactly: `b.ptr + b.size == next.ptr`, and the
//!   links are symmetric;
//! - a segment's blocks share its stream and pool kind;
//! - a block is *free* (`!allocated && event_count == 0`) exactly when it sits in its
//!   stream's free list or, marked `hot`, in its stream's hot cache; no two free blocks
//!   outside the hot cache are neighbours;
//! - blocks of an expandable segment (`vm` is `Some`) cover mapped pages only;
//! - `stream_uses` never contains the block's own stream, and is empty unless allocated;
//! - `lent` (handed to a caller on another stream, the borrower) is set only while
//!   allocated, and the borrower is then `stream_uses[0]`;
//! - `dirty` (streams it was lent to may still have work on it queued: the marks are in
//!   the shard's `crate::stream::DirtyMarks`) is set exactly when the block has marks,
//!   never while allocated, and keeps a block out of the hot cache.

use smallvec::SmallVec;

use super::{PoolTag, VmId};
use crate::handle::{DevicePtr, StreamHandle};
use crate::stats::StatType;

/// Index of a block in the arena.
pub type BlockId = usize;

/// Which pool a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// Requests of at most 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The pool serving a request of `rounded` bytes.
    pub fn for_size(rounded: usize) -> PoolKind {
        if rounded <= super::rounding::SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// The statistics slot of this pool.
    pub fn stat_type(self) -> StatType {
        match self {
            PoolKind::Small => StatType::SmallPool,
            PoolKind::Large => StatType::LargePool,
        }
    }
}

/// One block of device memory.
#[derive(Clone, Debug)]
pub struct Block {
    /// Start address.
    pub ptr: DevicePtr,
    /// Size in bytes (a multiple of 512).
    pub size: usize,
    /// Bytes the caller asked for (0 when not allocated).
    pub requested: usize,
    /// Stream the segment was allocated for; the block is reused only on it.
    pub stream: StreamHandle,
    /// Pool the segment belongs to.
    pub kind: PoolKind,
    /// Handed out to a caller and not yet freed.
    pub allocated: bool,
    /// Previous block of the same segment.
    pub prev: Option<BlockId>,
    /// Next block of the same segment.
    pub next: Option<BlockId>,
    /// Other streams that used the block (from `record_stream`).
    pub stream_uses: SmallVec<[StreamHandle; 2]>,
    /// Outstanding events (or parked frees) that must complete before reuse.
    pub event_count: u32,
    /// Value of the GC call counter when the block became free.
    pub gc_count_base: u64,
    /// Value of the allocator's malloc counter when the block became free.
    pub freed_at: u64,
    /// Index of the block's entry in its free-list bin (meaningful while free).
    pub bin_pos: u32,
    /// Free, but parked in its stream's hot cache instead of the free lists (not merged).
    pub hot: bool,
    /// The pool of the block's segment: `None` for the stream's own, else a
    /// graph-private pool.
    pub pool: PoolTag,
    /// The expandable segment holding the block (its index in the shard's segment
    /// table); `None` for an ordinary device allocation.
    pub vm: Option<VmId>,
    /// Handed to a caller on another stream (the borrower, `stream_uses[0]`).
    pub lent: bool,
    /// Free, but streams it was lent to may still have work on it queued; whoever
    /// takes it first waits on the device for them (see `crate::stream::fences`).
    pub dirty: bool,
}

impl Block {
    /// A fresh, unsplit block covering a whole segment.
    pub fn segment(ptr: DevicePtr, size: usize, stream: StreamHandle, kind: PoolKind) -> Block {
        Block {
            ptr,
            size,
            requested: 0,
            stream,
            kind,
            allocated: false,
            prev: None,
            next: None,
            stream_uses: SmallVec::new(),
            event_count: 0,
            gc_count_base: 0,
            freed_at: 0,
            bin_pos: 0,
            hot: false,
            pool: None,
            vm: None,
            lent: false,
            dirty: false,
        }
    }

    /// A new, unlinked block of the same segment as this one (same stream, pool kind,
    /// pool and mapping) covering `[ptr, ptr + size)`.
    pub fn sibling(&self, ptr: DevicePtr, size: usize) -> Block {
        Block {
            pool: self.pool,
            vm: self.vm,
            ..Block::segment(ptr, size, self.stream, self.kind)
        }
    }

    /// The stream of the caller it is lent to, while lent.
    pub fn borrower(&self) -> Option<StreamHandle> {
        self.lent.then(|| self.stream_uses[0])
    }

    /// Part of a segment that has been split.
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Neither handed out nor waiting for events: reusable.
    pub fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0
    }
}
