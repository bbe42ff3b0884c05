//! Expandable segments: one reserved address range per stream, pool and size class,
//! with physical pages mapped into it as it grows.
//!
//! Invariants (checked by `CachingAllocator::check_invariants`):
//! - `base` is the reservation's start; page `i` covers `[base + i*page, base + (i+1)*page)`
//!   and holds the handle of the physical memory mapped there, one mapping per page;
//! - the blocks of the segment (those with `Block::vm` naming it) tile exactly the
//!   mapped pages: each maximal run of mapped pages is one chain of blocks (a
//!   "segment" in the statistics and snapshots), and no block covers an unmapped page.

use crate::handle::{DevicePtr, PhysHandle, StreamHandle};

use super::{PoolKind, PoolTag};

/// An expandable segment of a shard: its index in the shard's segment table (stored so
/// that `Option<VmId>` takes no more room than the index itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VmId(std::num::NonZeroU32);

impl VmId {
    /// The id of entry `index`.
    pub fn new(index: usize) -> VmId {
        let n = u32::try_from(index + 1).expect("fewer than 2^32 expandable segments");
        VmId(std::num::NonZeroU32::new(n).expect("index + 1 is not zero"))
    }

    /// Its entry in the shard's segment table.
    pub fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// One expandable segment.
#[derive(Debug)]
pub struct VmSegment {
    /// Start of the reserved address range.
    pub base: DevicePtr,
    /// Mapping unit in bytes.
    pub page: usize,
    /// Stream the segment serves.
    pub stream: StreamHandle,
    /// Pool (`None`: the stream's own; else a graph-private pool).
    pub pool: PoolTag,
    /// Size class.
    pub kind: PoolKind,
    /// Physical memory mapped at each page, if any.
    pub pages: Vec<Option<PhysHandle>>,
    /// The `shift` of its blocks (`Block::place`): one place range for the reservation.
    pub shift: usize,
}

impl VmSegment {
    /// An empty segment over a reservation of `pages` pages at `base`.
    pub fn new(
        base: DevicePtr,
        page: usize,
        pages: usize,
        stream: StreamHandle,
        pool: PoolTag,
        kind: PoolKind,
    ) -> VmSegment {
        VmSegment {
            base,
            page,
            stream,
            pool,
            kind,
            pages: vec![None; pages],
            shift: 0,
        }
    }

    /// End of the reserved range.
    pub fn end(&self) -> DevicePtr {
        self.base + self.pages.len() * self.page
    }

    /// Address of page `i`.
    pub fn addr(&self, i: usize) -> DevicePtr {
        self.base + i * self.page
    }

    /// Number of mapped pages.
    pub fn mapped(&self) -> usize {
        self.pages.iter().filter(|p| p.is_some()).count()
    }

    /// Whether the page starting at `addr` is mapped (false outside the range).
    pub fn is_mapped_at(&self, addr: DevicePtr) -> bool {
        addr >= self.base
            && addr < self.end()
            && self.pages[(addr - self.base) / self.page].is_some()
    }

    /// The whole pages inside `[ptr, ptr + size)`: (first page, page count).
    pub fn whole_pages(&self, ptr: DevicePtr, size: usize) -> (usize, usize) {
        let first = (ptr - self.base).div_ceil(self.page);
        let last = (ptr + size - self.base) / self.page;
        (first, last.saturating_sub(first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_pages_rounds_inwards() {
        let s = VmSegment::new(
            1 << 30,
            1 << 21,
            8,
            StreamHandle::DEFAULT,
            None,
            PoolKind::Large,
        );
        let p = 1usize << 21;
        assert_eq!(s.whole_pages(s.base, 3 * p), (0, 3));
        assert_eq!(s.whole_pages(s.base + 512, 3 * p - 512), (1, 2));
        assert_eq!(s.whole_pages(s.base + 512, p), (1, 0));
        assert_eq!(s.end(), s.base + 8 * p);
        assert!(!s.is_mapped_at(s.base));
        assert!(!s.is_mapped_at(s.end()));
    }

    #[test]
    fn mapped_pages_are_counted_from_the_table() {
        let p = 1usize << 21;
        let mut s = VmSegment::new(1 << 30, p, 8, StreamHandle::DEFAULT, None, PoolKind::Large);
        s.pages[2] = Some(PhysHandle(1));
        s.pages[5] = Some(PhysHandle(2));
        assert_eq!(s.mapped(), 2);
        assert!(s.is_mapped_at(s.addr(5)) && !s.is_mapped_at(s.addr(4)));
        assert!(!s.is_mapped_at(s.addr(7) + p), "past the end");
    }
}
