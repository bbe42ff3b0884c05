//! The state of lending, both sides, as one value: the lender's fences and dirty marks
//! (which free blocks streams they were lent to may still use), and the borrower's
//! counts and steadiness (when a miss grows its own cache instead of borrowing again).
//! `lending.rs` says what the rules are; this is their bookkeeping.
//!
//! Invariants: a block has marks only while dirty (`ordering.rs`); a mark whose fence
//! completed is clear and may be dropped; a mark without a fence (`UNFENCED`) clears
//! only when its stream is synchronised. Pure data: the device is passed in for the
//! fences' event calls, never held.

use rustc_hash::FxHashMap;

use super::request::Request;
use crate::device::Device;
use crate::handle::{DeviceError, DeviceIndex, EventHandle, StreamHandle};
use crate::pool::{BlockId, PoolKind};
use crate::stream::{DirtyMarks, Fences, UNFENCED};

/// At most this many borrowed request sizes are counted (all are forgotten at once past
/// it: the table only bounds memory; a steady loop borrows far fewer sizes).
const BORROWED_SIZES: usize = 1024;
/// Borrows of one request size, with no other growth on the device, after which a miss
/// for it grows this shard's cache instead.
pub(super) const REPEATS: u32 = 64;
/// Malloc calls of this shard in which the device's reserved high-water mark may rise at
/// most once for the shard to be steady (module doc).
pub(super) const STEADY_CALLS: u64 = 1 << 18;

/// Borrows per request size (pool, rounded bytes) by this shard since the device's
/// `since`-th growth (`Shared::growths`).
#[derive(Default)]
struct Borrowed {
    sizes: FxHashMap<(PoolKind, usize), u32>,
    since: u64,
}

impl Borrowed {
    /// Forgets the borrows counted before the device's `growths`-th growth.
    fn age(&mut self, growths: u64) {
        if self.since != growths {
            self.sizes.clear();
            self.since = growths;
        }
    }

    /// Counts a borrow for `req`.
    fn note(&mut self, req: &Request, growths: u64) {
        self.age(growths);
        if self.sizes.len() >= BORROWED_SIZES {
            self.sizes.clear();
        }
        *self.sizes.entry((req.kind, req.rounded)).or_default() += 1;
    }

    /// Whether `req`'s size was borrowed `REPEATS` times since the device last grew;
    /// if so, forgets them.
    fn take(&mut self, req: &Request, growths: u64) -> bool {
        self.age(growths);
        let key = (req.kind, req.rounded);
        if self.sizes.get(&key).is_some_and(|&n| n >= REPEATS) {
            self.sizes.remove(&key);
            return true;
        }
        false
    }
}

/// When this shard saw the device's reserved high-water mark rise, by its malloc clock
/// (`Reclaim::now`): the last two times (module doc).
#[derive(Default)]
struct Steadiness {
    /// The mark as last seen (it never falls).
    mark: usize,
    /// When this shard saw it rise before the last time.
    before_last: u64,
    /// When this shard last saw it rise.
    last: u64,
}

impl Steadiness {
    /// Takes note of the mark `hwm` at this shard's malloc clock `now`. Several rises
    /// since the last look count as one.
    fn note(&mut self, hwm: usize, now: u64) {
        if hwm != self.mark {
            self.mark = hwm;
            self.before_last = self.last;
            self.last = now;
        }
    }

    /// Whether the mark rose at most once in this shard's last `STEADY_CALLS` calls.
    fn steady(&self, now: u64) -> bool {
        now.saturating_sub(self.before_last) >= STEADY_CALLS
    }
}

/// Both sides of block lending (module doc).
#[derive(Default)]
pub(crate) struct Lending {
    /// How far the streams this shard lent blocks to have run.
    fences: Fences,
    /// Which free blocks streams they were lent to may still use (`Block::dirty`).
    dirty: DirtyMarks,
    /// The borrower's side: borrows per request size since the device last grew.
    borrowed: Borrowed,
    /// When this shard saw the device's reserved high-water mark rise.
    steadiness: Steadiness,
}

impl Lending {
    /// Marks block `id` as possibly in use on `borrower` until the fence of `epoch`.
    pub fn mark(&mut self, id: BlockId, borrower: StreamHandle, epoch: u64) {
        self.dirty.add(id, borrower, epoch);
    }

    /// Block `id`'s marks: (stream, epoch).
    pub fn marks(&self, id: BlockId) -> &[(StreamHandle, u64)] {
        self.dirty.get(id)
    }

    /// Every marked block with its marks.
    pub fn marked(&self) -> impl Iterator<Item = (BlockId, &[(StreamHandle, u64)])> + '_ {
        self.dirty.iter()
    }

    /// Drops block `id`'s marks (it is handed out, released, or its marks are clear).
    pub fn forget(&mut self, id: BlockId) {
        self.dirty.take(id);
    }

    /// Block `src` merged into `dst`: `dst` keeps the marks of both.
    pub fn merge_marks(&mut self, dst: BlockId, src: BlockId) {
        self.dirty.merge_into(dst, src);
    }

    /// Whether a mark on `stream` from `epoch` is clear (its fence completed).
    pub fn is_clear(&self, stream: StreamHandle, epoch: u64) -> bool {
        self.fences.is_clear(stream, epoch)
    }

    /// Whether every mark of block `id` is clear.
    pub fn all_clear(&self, id: BlockId) -> bool {
        self.fences.all_clear(self.dirty.get(id))
    }

    /// The streams of block `id`'s marks that are not clear.
    pub fn open_streams(&self, id: BlockId) -> Vec<StreamHandle> {
        (self.dirty.get(id).iter())
            .filter(|&&(s, e)| !self.fences.is_clear(s, e))
            .map(|&(s, _)| s)
            .collect()
    }

    /// This shard's stream now waits on the device for everything queued on `stream`
    /// so far: every mark on `stream` is met (`Fences::met`).
    pub fn met(&mut self, stream: StreamHandle) {
        self.fences.met(stream);
    }

    /// The streams some block is marked on without a fence, each once, in order.
    pub fn unfenced_streams(&self) -> Vec<StreamHandle> {
        let mut streams: Vec<StreamHandle> = (self.dirty.iter())
            .flat_map(|(_, m)| m.iter().filter(|&&(_, e)| e == UNFENCED).map(|&(s, _)| s))
            .collect();
        streams.sort();
        streams.dedup();
        streams
    }

    /// Whether some block is marked on `stream` without a fence.
    pub fn unfenced_on(&self, stream: StreamHandle) -> bool {
        (self.dirty.iter()).any(|(_, m)| m.iter().any(|&(s, e)| s == stream && e == UNFENCED))
    }

    /// `stream` was synchronised: drops its marks; returns the blocks left without any.
    pub fn clear_stream(&mut self, stream: StreamHandle) -> Vec<BlockId> {
        self.dirty.clear_stream(stream)
    }

    /// A fence `event` was just recorded on `borrower`; returns the epoch of the marks
    /// it clears.
    pub fn fenced(&mut self, borrower: StreamHandle, event: EventHandle) -> u64 {
        self.fences.push(borrower, event)
    }

    /// Takes in the fences that completed (no waiting); `put` gets their events back.
    pub fn poll_fences(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        put: impl FnMut(EventHandle),
    ) {
        if !self.fences.is_empty() {
            self.fences.poll(dev, index, put);
        }
    }

    /// Waits for the fences on `only` (every stream: `None`); `put` gets their events
    /// back (`Fences::synchronize`).
    pub fn synchronize_fences(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        only: Option<StreamHandle>,
        put: impl FnMut(EventHandle),
    ) -> Result<(), DeviceError> {
        self.fences.synchronize(dev, index, only, put)
    }

    /// The latest fence epoch handed out (0: none).
    pub fn fence_epoch(&self) -> u64 {
        self.fences.epoch()
    }

    /// Counts a borrow for `req` (the repeat rule), the device having grown `growths`
    /// times.
    pub fn note_borrow(&mut self, req: &Request, growths: u64) {
        self.borrowed.note(req, growths);
    }

    /// Whether `req`'s size was borrowed `REPEATS` times since the device last grew;
    /// if so, the count starts again.
    pub fn take_repeat(&mut self, req: &Request, growths: u64) -> bool {
        self.borrowed.take(req, growths)
    }

    /// Takes note of the device's reserved high-water mark `hwm` at malloc clock `now`.
    pub fn note_mark(&mut self, hwm: usize, now: u64) {
        self.steadiness.note(hwm, now);
    }

    /// Whether the mark rose at most once in the last `STEADY_CALLS` malloc calls.
    pub fn steady(&self, now: u64) -> bool {
        self.steadiness.steady(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_open_until_its_fence_is_met_and_an_unfenced_one_until_a_sync() {
        let (a, b) = (StreamHandle(0x10), StreamHandle(0x20));
        let mut l = Lending::default();
        let epoch = l.fenced(a, EventHandle(1));
        l.mark(1, a, epoch);
        l.mark(2, b, UNFENCED);
        assert_eq!(l.open_streams(1), [a]);
        assert!(!l.all_clear(1));
        l.met(a);
        assert!(l.all_clear(1) && l.open_streams(1).is_empty());
        l.met(b);
        assert_eq!(l.open_streams(2), [b], "no fence clears an unfenced mark");
        assert_eq!(l.unfenced_streams(), [b]);
        assert!(l.unfenced_on(b) && !l.unfenced_on(a));
        assert_eq!(l.clear_stream(b), [2]);
        assert!(l.unfenced_streams().is_empty());
    }

    #[test]
    fn a_size_borrowed_repeatedly_grows_first_until_the_device_grows() {
        let req = Request {
            size: 4 << 20,
            rounded: 4 << 20,
            kind: PoolKind::Large,
            stream: StreamHandle::DEFAULT,
            kept_whole: false,
        };
        let mut l = Lending::default();
        for _ in 0..REPEATS {
            assert!(!l.take_repeat(&req, 0));
            l.note_borrow(&req, 0);
        }
        assert!(l.take_repeat(&req, 0));
        assert!(!l.take_repeat(&req, 0), "the count starts again");
        for _ in 0..REPEATS {
            l.note_borrow(&req, 0);
        }
        assert!(!l.take_repeat(&req, 1), "the device grew: forgotten");
    }

    #[test]
    fn a_stream_is_steady_while_the_mark_rose_at_most_once_lately() {
        let mut l = Lending::default();
        l.note_mark(100, 10);
        assert!(l.steady(STEADY_CALLS), "one rise");
        l.note_mark(200, 20);
        assert!(!l.steady(STEADY_CALLS), "two rises");
        assert!(l.steady(10 + STEADY_CALLS), "the first rise is old enough");
        l.note_mark(200, 30);
        assert!(l.steady(10 + STEADY_CALLS), "no rise: nothing changes");
    }
}
