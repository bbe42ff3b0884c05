//! A block: a contiguous piece of one device segment.
//!
//! Blocks live in a `slab::Slab<Block>` and link to their address neighbours in the
//! same segment by index (`prev`/`next`).
//!
//! Invariants (checked by `CachingAllocator::check_invariants`):
//! - the blocks of a segment tile it exactly: `b.ptr + b.size == next.ptr`, and the
//!   links are symmetric;
//! - a segment's blocks share its stream and pool kind;
//! - a block is in one [`Phase`]: allocated, lent, awaiting events, free or hot; it is
//!   *free* (`Free` or `Hot`) exactly when it sits in its stream's free list (`Free`) or
//!   its stream's hot cache (`Hot`); no two `Free` blocks are neighbours;
//! - blocks of an expandable segment (`vm` is `Some`) cover mapped pages only;
//! - `stream_uses` never contains the block's own stream, and is empty unless allocated
//!   (or a free deferred during a capture);
//! - a `Lent` block was handed to a caller on another stream (the borrower), which is
//!   `stream_uses[0]`;
//! - `dirty` (streams it was lent to may still have work on it queued: the marks are in
//!   the shard's `crate::stream::DirtyMarks`) is set exactly when the block has marks,
//!   only while awaiting events or free, and keeps a block out of the hot cache;
//! - the blocks of a segment share its `shift`, so their places ([`Block::place`]) are
//!   in address order and tile the segment's place range as their addresses tile it.
//!
//! Note [Places]: where best fit breaks a tie between free blocks of equal size (and
//! which whole segment lending gives, which oversize block goes back first), a block
//! sorts by its *place*, its address plus its segment's `shift`. With `shift` 0 the place
//! is the address, PyTorch's rule (the lowest address wins), and placement then depends
//! on where the device puts each segment. npualloc's own policy gives each segment a
//! place range of its own instead, handed out in the order the allocator created the
//! segments (`Shared::place_shift`): the oldest segment wins, then the lowest offset in
//! it, on any device, so a replay on the simulated device places every block as the
//! real device would (decision 044).

use smallvec::SmallVec;

/// The low 32 bits of one of the allocator's clocks, as a block records them: ages are
/// taken with wrapping arithmetic, exact below 2^32 ticks, and a block stays 128 bytes,
/// which keeps each slab lookup to a shift.
pub type Stamp = u32;

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

/// What a block is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Handed out to a caller on the block's own stream.
    Allocated,
    /// Handed out to a caller on another stream (the borrower, `stream_uses[0]`).
    Lent,
    /// Freed by its caller; reusable once this many waits end: events recorded on the
    /// streams it was used on, or frees parked (until a synchronisation) or deferred
    /// (until a capture ends).
    Awaiting(u32),
    /// Reusable, in its free list.
    Free,
    /// Reusable, parked unmerged in its stream's hot cache.
    Hot,
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
    /// What it is doing.
    pub phase: Phase,
    /// Previous block of the same segment.
    pub prev: Option<BlockId>,
    /// Next block of the same segment.
    pub next: Option<BlockId>,
    /// Other streams that used the block (from `record_stream`).
    pub stream_uses: SmallVec<[StreamHandle; 2]>,
    /// Value of the GC call counter when the block became free ([`Stamp`]).
    pub gc_count_base: Stamp,
    /// Value of the allocator's malloc counter when the block became free ([`Stamp`]).
    pub freed_at: Stamp,
    /// Index of the block's entry in its free-list bin (meaningful while free).
    pub bin_pos: u32,
    /// The pool of the block's segment: `None` for the stream's own, else a
    /// graph-private pool.
    pub pool: PoolTag,
    /// The expandable segment holding the block (its index in the shard's segment
    /// table); `None` for an ordinary device allocation.
    pub vm: Option<VmId>,
    /// Free or awaiting events, but streams it was lent to may still have work on it queued; whoever
    /// takes it first waits on the device for them (see `crate::stream::fences`).
    pub dirty: bool,
    /// Added (wrapping) to the address to give the block's place (Note [Places]); the
    /// same for every block of a segment.
    pub shift: usize,
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
            phase: Phase::Free,
            prev: None,
            next: None,
            stream_uses: SmallVec::new(),
            gc_count_base: 0,
            freed_at: 0,
            bin_pos: 0,
            pool: None,
            vm: None,
            dirty: false,
            shift: 0,
        }
    }

    /// A new, unlinked block of the same segment as this one (same stream, pool kind,
    /// pool, mapping and place range) covering `[ptr, ptr + size)`.
    pub fn sibling(&self, ptr: DevicePtr, size: usize) -> Block {
        Block {
            pool: self.pool,
            vm: self.vm,
            shift: self.shift,
            ..Block::segment(ptr, size, self.stream, self.kind)
        }
    }

    /// Where the block sorts among free blocks of its size (Note [Places]).
    #[inline(always)]
    pub fn place(&self) -> usize {
        self.ptr.wrapping_add(self.shift)
    }

    /// The stream of the caller it is lent to, while lent.
    pub fn borrower(&self) -> Option<StreamHandle> {
        (self.phase == Phase::Lent).then(|| self.stream_uses[0])
    }

    /// Part of a segment that has been split.
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Neither handed out nor waiting for events: reusable.
    #[inline]
    pub fn is_free(&self) -> bool {
        matches!(self.phase, Phase::Free | Phase::Hot)
    }

    /// Handed out to a caller (of this stream or, lent, of another).
    #[inline]
    pub fn is_allocated(&self) -> bool {
        matches!(self.phase, Phase::Allocated | Phase::Lent)
    }

    /// Waits that must end before reuse (0 unless awaiting).
    pub fn waits(&self) -> u32 {
        match self.phase {
            Phase::Awaiting(n) => n,
            _ => 0,
        }
    }

    /// One more wait before reuse (the block was just freed, or already awaits).
    pub fn add_wait(&mut self) {
        self.phase = Phase::Awaiting(self.waits() + 1);
    }

    /// One wait ended; returns whether it was the last (the block is then `Free`, but
    /// not yet in a free list).
    pub fn end_wait(&mut self) -> bool {
        let n = self.waits();
        debug_assert!(n > 0, "no wait to end");
        self.phase = if n <= 1 {
            Phase::Free
        } else {
            Phase::Awaiting(n - 1)
        };
        n <= 1
    }
}
