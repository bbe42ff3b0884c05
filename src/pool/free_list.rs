//! Free lists: the cached, reusable blocks of one stream and pool, in segregated bins.
//!
//! Bins follow TLSF's two-level mapping over 512-byte units: below 32 KiB one bin per
//! size; above, 64 bins per power of two. Two bitmaps find the first non-empty bin at
//! or above a size in constant time. Best fit is exact up to a scan limit: within the
//! request's own bin the smallest block that fits wins, and in a higher bin the
//! smallest of its blocks (scanning at most [`SCAN_LIMIT`] entries); among blocks of
//! equal size the lowest place wins (`Block::place`, Note [Places] in `block.rs`): the
//! lowest address, as in PyTorch, or, with npualloc's own ties, the oldest segment's
//! block, then the lowest offset in it.
//!
//! Invariants: an entry `(size, place, id)` is present exactly when block `id` is free,
//! belongs to this stream and pool, and has that size and place; the block's
//! `bin_pos` is the entry's index in its bin; a bitmap bit is set exactly when its bin
//! is non-empty; `full_bins` counts the bins of at least [`SCAN_LIMIT`] entries.

use std::num::NonZeroU32;

use slab::Slab;

use super::block::{Block, BlockId};

const SL_LOG2: u32 = 6;
const SL: usize = 1 << SL_LOG2;
/// First-level classes: sizes up to 2^(9 + 6 + FL - 1) bytes (beyond: the last class).
const FL: usize = 40;
/// Most entries examined in a bin when looking for the smallest fit.
pub const SCAN_LIMIT: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Entry {
    size: usize,
    place: usize,
    id: u32,
}

/// Free blocks of one stream and pool kind.
#[derive(Debug)]
pub struct FreeList {
    bins: Vec<Vec<Entry>>,
    sl_bitmap: [u64; FL],
    fl_bitmap: u64,
    len: usize,
    /// Bins holding at least [`SCAN_LIMIT`] entries.
    full_bins: u32,
}

impl Default for FreeList {
    fn default() -> Self {
        FreeList {
            bins: (0..FL * SL).map(|_| Vec::new()).collect(),
            sl_bitmap: [0; FL],
            fl_bitmap: 0,
            len: 0,
            full_bins: 0,
        }
    }
}

/// The (first, second) level of a size.
fn mapping(size: usize) -> (usize, usize) {
    let u = (size >> 9).max(1);
    if u < SL {
        return (0, u);
    }
    let f = (usize::BITS - 1 - u.leading_zeros()) as usize; // >= 6
    let fl = f - SL_LOG2 as usize + 1;
    if fl >= FL {
        return (FL - 1, SL - 1);
    }
    (fl, (u >> (f - SL_LOG2 as usize)) & (SL - 1))
}

impl FreeList {
    /// Adds free block `id` (its size and place as they are now).
    pub fn insert(&mut self, blocks: &mut Slab<Block>, id: BlockId) {
        let b = &mut blocks[id];
        let (fl, sl) = mapping(b.size);
        let bin = &mut self.bins[fl * SL + sl];
        b.bin_pos = bin.len() as u32;
        bin.push(Entry {
            size: b.size,
            place: b.place(),
            id: id as u32,
        });
        if bin.len() == SCAN_LIMIT {
            self.full_bins += 1;
        }
        self.sl_bitmap[fl] |= 1 << sl;
        self.fl_bitmap |= 1 << fl;
        self.len += 1;
    }

    /// Removes block `id` (before its size or place change); returns whether it was present.
    pub fn remove(&mut self, blocks: &mut Slab<Block>, id: BlockId) -> bool {
        let b = &blocks[id];
        let (fl, sl) = mapping(b.size);
        let pos = b.bin_pos as usize;
        let bin = &mut self.bins[fl * SL + sl];
        if bin.get(pos).is_none_or(|e| e.id as usize != id) {
            return false;
        }
        bin.swap_remove(pos);
        if bin.len() == SCAN_LIMIT - 1 {
            self.full_bins -= 1;
        }
        if let Some(moved) = bin.get(pos) {
            blocks[moved.id as usize].bin_pos = pos as u32;
        }
        if bin.is_empty() {
            self.sl_bitmap[fl] &= !(1 << sl);
            if self.sl_bitmap[fl] == 0 {
                self.fl_bitmap &= !(1 << fl);
            }
        }
        self.len -= 1;
        true
    }

    /// The smallest entry of `bin` of at least `size` bytes (within the scan limit), other
    /// than that of block `skip`.
    #[inline(always)]
    fn smallest_fit(bin: &[Entry], size: usize, skip: u32) -> Option<&Entry> {
        let mut best: Option<&Entry> = None;
        for e in bin.iter().take(SCAN_LIMIT) {
            if e.size >= size
                && e.id != skip
                && best.is_none_or(|b| (e.size, e.place) < (b.size, b.place))
            {
                best = Some(e);
            }
        }
        best
    }

    /// The next non-empty bin above bin `bin`.
    #[inline(always)]
    fn next_bin(&self, bin: usize) -> Option<usize> {
        let (fl, sl) = (bin / SL, bin % SL);
        let above = if sl + 1 < SL {
            self.sl_bitmap[fl] & (!0u64 << (sl + 1))
        } else {
            0
        };
        if above != 0 {
            return Some(fl * SL + above.trailing_zeros() as usize);
        }
        let higher = if fl + 1 < FL {
            self.fl_bitmap & (!0u64 << (fl + 1))
        } else {
            0
        };
        if higher == 0 {
            return None;
        }
        let f = higher.trailing_zeros() as usize;
        Some(f * SL + self.sl_bitmap[f].trailing_zeros() as usize)
    }

    /// The smallest cached block of at least `size` bytes, the lowest place among equals:
    /// (size, place, block).
    pub fn best_fit(&self, size: usize) -> Option<(usize, usize, BlockId)> {
        if self.len == 0 {
            return None;
        }
        let (fl, sl) = mapping(size);
        let mut bin = fl * SL + sl;
        loop {
            if let Some(e) = Self::smallest_fit(&self.bins[bin], size, u32::MAX) {
                return Some((e.size, e.place, e.id as usize));
            }
            bin = self.next_bin(bin)?;
        }
    }

    /// Whether best fit for `size` would return a block of `cand` = (size, place)
    /// were it inserted and block `skip`'s entry removed (`cand` fits `size`): no entry
    /// of a lower bin fits, and none of its own bin is smaller, or as small at a lower
    /// place. Exact when every bin is scanned whole (removing an entry then reorders a
    /// bin without changing what best fit sees).
    pub fn would_pick(&self, size: usize, cand: (usize, usize), skip: Option<BlockId>) -> bool {
        let skip = skip.map_or(u32::MAX, |id| id as u32);
        let (fl, sl) = mapping(cand.0);
        let own = fl * SL + sl;
        let mut bin = if size == cand.0 {
            own
        } else {
            let (fl, sl) = mapping(size);
            fl * SL + sl
        };
        if bin == own {
            // The usual case (the candidate is of the request's bin): later bins are
            // above `own`, so only this bin can hold a better fit.
            return Self::smallest_fit(&self.bins[bin], size, skip)
                .is_none_or(|e| cand < (e.size, e.place));
        }
        loop {
            if bin > own {
                return true;
            }
            if let Some(e) = Self::smallest_fit(&self.bins[bin], size, skip) {
                return bin == own && cand < (e.size, e.place);
            }
            match self.next_bin(bin) {
                Some(b) => bin = b,
                None => return true,
            }
        }
    }

    /// Whether every bin holds fewer than [`SCAN_LIMIT`] entries: best fit then scans
    /// every bin whole, even after one more insertion.
    #[inline]
    pub fn scanned_whole(&self) -> bool {
        self.full_bins == 0
    }

    /// Block `new` (not in this list, its size and place as they are now) takes the
    /// entry of block `old` (in this list, its size and place as they were
    /// inserted): the same as `remove(old)` then `insert(new)`, done in place when
    /// `old`'s entry is last in its bin and `new` belongs in the same bin.
    pub fn replace(&mut self, blocks: &mut Slab<Block>, old: BlockId, new: BlockId) {
        let o = &blocks[old];
        let (from, to) = (mapping(o.size), mapping(blocks[new].size));
        let pos = o.bin_pos as usize;
        let bin = &mut self.bins[from.0 * SL + from.1];
        if from == to && pos + 1 == bin.len() {
            debug_assert_eq!(bin[pos].id as usize, old);
            let n = &mut blocks[new];
            bin[pos] = Entry {
                size: n.size,
                place: n.place(),
                id: new as u32,
            };
            n.bin_pos = pos as u32;
            return;
        }
        let present = self.remove(blocks, old);
        debug_assert!(present, "block {old} was not in this list");
        self.insert(blocks, new);
    }

    /// Every entry (size, place, block), in no particular order (bins by size, each in
    /// the order of its insertions and removals: never by address).
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize, BlockId)> + '_ {
        let mut fls = self.fl_bitmap;
        std::iter::from_fn(move || {
            if fls == 0 {
                return None;
            }
            let f = fls.trailing_zeros() as usize;
            fls &= fls - 1;
            Some(f)
        })
        .flat_map(move |f| {
            let mut sls = self.sl_bitmap[f];
            std::iter::from_fn(move || {
                if sls == 0 {
                    return None;
                }
                let s = sls.trailing_zeros() as usize;
                sls &= sls - 1;
                Some(f * SL + s)
            })
        })
        .flat_map(move |bin| {
            self.bins[bin]
                .iter()
                .map(|e| (e.size, e.place, e.id as usize))
        })
    }

    /// Entries from largest to smallest (among equals, the highest place first).
    pub fn iter_desc(&self) -> Vec<(usize, usize, BlockId)> {
        let mut v: Vec<_> = self.iter().collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    }

    /// Number of free blocks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No free blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Most blocks a stream's hot cache holds.
pub const HOT_CAPACITY: usize = 16;

/// The small and large free lists of one stream, and its hot cache: small-pool blocks
/// freed recently, kept unmerged so that the next request of the same size takes one
/// back without a search, split or merge. The cache is flushed into the free lists before
/// any slow path (a device allocation, a cache release), so it never makes the
/// allocator reserve more memory.
#[derive(Default, Debug)]
pub struct StreamPools {
    /// Blocks of the small pool.
    pub small: FreeList,
    /// Blocks of the large pool.
    pub large: FreeList,
    /// Hot cache: (block size, block), most recent last.
    pub hot: Vec<(usize, BlockId)>,
}

impl StreamPools {
    /// The free list of `kind`.
    pub fn get(&self, kind: super::PoolKind) -> &FreeList {
        match kind {
            super::PoolKind::Small => &self.small,
            super::PoolKind::Large => &self.large,
        }
    }

    /// The free list of `kind`, mutably.
    pub fn get_mut(&mut self, kind: super::PoolKind) -> &mut FreeList {
        match kind {
            super::PoolKind::Small => &mut self.small,
            super::PoolKind::Large => &mut self.large,
        }
    }
}

/// Which pool a block's segment belongs to: `None` is the stream's own pool, `Some` a
/// graph-private pool.
pub type PoolTag = Option<PrivateTag>;

/// A graph-private pool of a shard: an index in the shard's table of private pools
/// (stored so that `Option<PrivateTag>` takes no more room, nor time to compare, than
/// the index itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrivateTag(NonZeroU32);

impl PrivateTag {
    /// The tag of entry `index`.
    pub fn new(index: usize) -> PrivateTag {
        let n = u32::try_from(index + 1).expect("fewer than 2^32 private pools");
        PrivateTag(NonZeroU32::new(n).expect("index + 1 is not zero"))
    }

    /// Its entry in the shard's table.
    pub fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// The pools of a shard (which serves one stream), by pool tag: in practice one or a
/// few, so a short vector searched linearly beats hashing.
#[derive(Default, Debug)]
pub struct StreamMap {
    entries: Vec<(PoolTag, StreamPools)>,
}

impl StreamMap {
    /// The free lists of pool `key`.
    #[inline]
    pub fn get(&self, key: &PoolTag) -> Option<&StreamPools> {
        self.entries.iter().find(|e| e.0 == *key).map(|e| &e.1)
    }

    /// The free lists of pool `key`, mutably.
    #[inline]
    pub fn get_mut(&mut self, key: &PoolTag) -> Option<&mut StreamPools> {
        self.entries
            .iter_mut()
            .find(|e| e.0 == *key)
            .map(|e| &mut e.1)
    }

    /// The free lists of pool `key`, created empty if needed.
    #[inline(always)]
    pub fn get_or_default(&mut self, key: PoolTag) -> &mut StreamPools {
        match self.entries.iter().position(|e| e.0 == key) {
            Some(i) => &mut self.entries[i].1,
            None => self.push_default(key),
        }
    }

    /// Adds empty free lists for pool `key` (once per pool: out of the fast path).
    #[cold]
    #[inline(never)]
    fn push_default(&mut self, key: PoolTag) -> &mut StreamPools {
        self.entries.push((key, StreamPools::default()));
        &mut self.entries.last_mut().expect("just pushed").1
    }

    /// Every stream's pools.
    pub fn values(&self) -> impl Iterator<Item = &StreamPools> {
        self.entries.iter().map(|e| &e.1)
    }

    /// Every stream's pools, mutably.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut StreamPools> {
        self.entries.iter_mut().map(|e| &mut e.1)
    }

    /// Every (pool tag, free lists).
    pub fn iter(&self) -> impl Iterator<Item = (&PoolTag, &StreamPools)> {
        self.entries.iter().map(|e| (&e.0, &e.1))
    }

    /// Keeps the entries whose pools satisfy `keep`.
    pub fn retain(&mut self, mut keep: impl FnMut(&PoolTag, &mut StreamPools) -> bool) {
        self.entries.retain_mut(|e| keep(&e.0, &mut e.1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::StreamHandle;
    use crate::pool::PoolKind;

    fn block(blocks: &mut Slab<Block>, size: usize, ptr: usize) -> BlockId {
        blocks.insert(Block::segment(
            ptr,
            size,
            StreamHandle::DEFAULT,
            PoolKind::Large,
        ))
    }

    #[test]
    fn mapping_is_monotonic_and_exact_below_32k() {
        let mut last = (0, 0);
        for units in 1..100_000usize {
            let m = mapping(units << 9);
            assert!(m >= last, "{units}");
            last = m;
        }
        assert_eq!(mapping(512), (0, 1));
        assert_eq!(mapping(63 << 9), (0, 63));
        assert_ne!(mapping(64 << 9), mapping(63 << 9));
    }

    #[test]
    fn best_fit_takes_the_smallest_block_that_fits() {
        let mut blocks = Slab::new();
        let mut l = FreeList::default();
        let ids: Vec<_> = [
            (4096, 0x3000),
            (2048, 0x2000),
            (2048, 0x1000),
            (40 << 20, 0x9000),
            (33 << 20, 0x8000),
        ]
        .iter()
        .map(|&(s, p)| block(&mut blocks, s, p))
        .collect();
        for &id in &ids {
            l.insert(&mut blocks, id);
        }
        assert_eq!(l.best_fit(1024).unwrap().0, 2048);
        assert_eq!(l.best_fit(3000), Some((4096, 0x3000, ids[0])));
        assert_eq!(l.best_fit(5000), Some((33 << 20, 0x8000, ids[4])));
        assert_eq!(l.best_fit(34 << 20), Some((40 << 20, 0x9000, ids[3])));
        assert_eq!(l.best_fit(41 << 20), None);
        assert!(l.remove(&mut blocks, ids[2]));
        assert!(!l.remove(&mut blocks, ids[2]));
        assert_eq!(l.best_fit(1024), Some((2048, 0x2000, ids[1])));
        assert_eq!(l.len(), 4);
        assert_eq!(l.iter_desc()[0].0, 40 << 20);
        for &id in &[ids[0], ids[1], ids[3], ids[4]] {
            assert!(l.remove(&mut blocks, id));
        }
        assert!(l.is_empty());
        assert_eq!(l.best_fit(1), None);
    }

    /// Sizes spread over a few bins, several per bin, from a fixed seed.
    fn scattered(blocks: &mut Slab<Block>, n: usize) -> Vec<BlockId> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let size =
                    [3usize << 20, 12 << 20, 13 << 20, 40 << 20][i % 4] + ((x as usize % 48) << 9);
                block(blocks, size, 0x10_0000_0000 + i * (64 << 20))
            })
            .collect()
    }

    #[test]
    fn would_pick_answers_as_best_fit_after_the_change() {
        let mut blocks = Slab::new();
        let ids = scattered(&mut blocks, 40);
        // One block alone in its bin: without it, the search goes on to the next bin.
        let alone = block(&mut blocks, 6 << 20, 0x8_0000_0000);
        let all: Vec<_> = ids.iter().copied().chain([alone]).collect();
        let cands = [
            ((12 << 20) + 4096, 0x1000),
            ((12 << 20) + 4096, 0xF0_0000_0000),
            (6 << 20, 0x1000),
            (20 << 20, 0x1000),
            (40 << 20, 0xF0_0000_0000),
            (64 << 20, 0x1000),
        ];
        let skips = [None, Some(alone), Some(ids[1]), Some(ids[3]), Some(ids[6])];
        for skip in skips {
            for (cs, cp) in cands {
                let mut list = FreeList::default();
                let mut after = FreeList::default();
                let mut b = blocks.clone();
                let cand = block(&mut b, cs, cp);
                for &id in &all {
                    list.insert(&mut b, id);
                    if Some(id) != skip {
                        after.insert(&mut b, id);
                    }
                }
                after.insert(&mut b, cand);
                for size in (1..=(cs >> 19)).map(|k| k << 19) {
                    let picked = after.best_fit(size).map(|e| e.2) == Some(cand);
                    assert_eq!(
                        list.would_pick(size, (cs, cp), skip),
                        picked,
                        "{size} for ({cs}, {cp:#x}) without {skip:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn replace_is_remove_then_insert() {
        let mut blocks = Slab::new();
        let ids = scattered(&mut blocks, 24);
        let last = *ids.last().unwrap();
        // (old entry, the new block's size): last in its bin, the new block in the same
        // bin (done in place) or another; in the middle of its bin, same bin or another.
        for (old, grow) in [
            (last, 512),
            (last, 20 << 20),
            (ids[2], 512),
            (ids[2], 9 << 20),
        ] {
            let mut copies: Vec<Slab<Block>> = vec![blocks.clone(), blocks.clone()];
            let (mut a, mut b) = (FreeList::default(), FreeList::default());
            for &i in &ids {
                a.insert(&mut copies[0], i);
                b.insert(&mut copies[1], i);
            }
            let (ptr, size) = (copies[0][old].ptr - 512, copies[0][old].size + grow);
            for c in &mut copies {
                let new = block(c, size, ptr);
                assert_eq!(new, 24);
            }
            assert!(a.remove(&mut copies[0], old));
            a.insert(&mut copies[0], 24);
            b.replace(&mut copies[1], old, 24);
            let (ea, eb): (Vec<_>, Vec<_>) = (a.iter().collect(), b.iter().collect());
            assert_eq!(
                ea, eb,
                "{old} by {grow}: the same entries in the same order"
            );
            for i in ids.iter().copied().chain([24]) {
                assert_eq!(copies[0][i].bin_pos, copies[1][i].bin_pos, "{i}");
            }
            assert!(!b.remove(&mut copies[1], old), "the old entry is gone");
        }
    }

    #[test]
    fn full_bins_are_counted() {
        let mut blocks = Slab::new();
        let mut l = FreeList::default();
        let ids: Vec<_> = (0..SCAN_LIMIT)
            .map(|i| block(&mut blocks, 4 << 20, 0x1000 * (i + 1)))
            .collect();
        for &id in &ids[..SCAN_LIMIT - 1] {
            l.insert(&mut blocks, id);
        }
        assert!(l.scanned_whole());
        l.insert(&mut blocks, ids[SCAN_LIMIT - 1]);
        assert!(!l.scanned_whole(), "a bin of SCAN_LIMIT entries");
        assert!(l.remove(&mut blocks, ids[0]));
        assert!(l.scanned_whole());
    }

    #[test]
    fn among_equal_sizes_the_lowest_place_wins_whatever_the_address() {
        // Two 4 MiB blocks: the one at the higher address has the lower place (its
        // segment was made first), and best fit takes it; with places equal to
        // addresses (shift 0) the lower address wins, as in PyTorch.
        let mut blocks = Slab::new();
        let (low, high) = (
            block(&mut blocks, 4 << 20, 0x2000_0000),
            block(&mut blocks, 4 << 20, 0x9000_0000),
        );
        let mut by_address = FreeList::default();
        by_address.insert(&mut blocks, high);
        by_address.insert(&mut blocks, low);
        assert_eq!(by_address.best_fit(1 << 20).unwrap().2, low);
        blocks[high].shift = 0usize.wrapping_sub(0x9000_0000); // place 0
        blocks[low].shift = (64usize << 20).wrapping_sub(0x2000_0000); // place 64 MiB
        let mut by_place = FreeList::default();
        by_place.insert(&mut blocks, low);
        by_place.insert(&mut blocks, high);
        assert_eq!(by_place.best_fit(1 << 20), Some((4 << 20, 0, high)));
        assert!(by_place.would_pick(1 << 20, (4 << 20, 1 << 20), Some(high)));
        assert!(!by_place.would_pick(1 << 20, (4 << 20, 65 << 20), Some(high)));
        assert_eq!(by_place.iter_desc()[0].2, low, "the highest place first");
    }

    #[test]
    fn within_a_bin_the_smallest_fit_wins() {
        // 33 MiB + k * 64 KiB all share one bin (64 sub-bins per power of two).
        let mut blocks = Slab::new();
        let mut l = FreeList::default();
        for (i, k) in [7usize, 3, 9, 5].iter().enumerate() {
            let id = block(&mut blocks, (33 << 20) + k * 65536, 0x1000 * (i + 1));
            l.insert(&mut blocks, id);
        }
        assert_eq!(
            l.best_fit((33 << 20) + 4 * 65536).unwrap().0,
            (33 << 20) + 5 * 65536
        );
        assert_eq!(l.best_fit(33 << 20).unwrap().0, (33 << 20) + 3 * 65536);
    }
}
