//! Expandable segments: one reserved address range per stream, pool and size class,
//! with physical pages mapped into it as it grows.
//!
//! Pages are the unit of placement; physical memory comes in *chunks* of whole pages,
//! one runtime mapping each (a grow maps all the pages it needs with one call), and
//! goes back chunk by chunk.
//!
//! Invariants (checked by `CachingAllocator::check_invariants`):
//! - `base` is the reservation's start; page `i` covers `[base + i*page, base + (i+1)*page)`;
//! - a chunk of `len` pages starting at page `i` is `pages[i] = Head`, then `len - 1`
//!   entries `Part { head: i }`;
//! - `mapped` counts the pages that are not `Unmapped`;
//! - the blocks of the segment (those with `Block::vm` naming it) tile exactly the
//!   mapped pages: each maximal run of mapped pages is one chain of blocks (a
//!   "segment" in the statistics and snapshots), and no block covers an unmapped page.

use crate::device::{DevicePtr, PhysHandle, StreamHandle};

use super::{PoolKind, PoolTag};

/// What is mapped at one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// Nothing.
    Unmapped,
    /// The first page of a chunk of `len` pages mapped with `handle`.
    Head {
        /// The runtime's handle of the chunk's physical memory.
        handle: PhysHandle,
        /// Pages in the chunk.
        len: usize,
    },
    /// A later page of the chunk whose first page is `head`.
    Part {
        /// Index of the chunk's first page.
        head: usize,
    },
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
    /// Pool (0: the stream's own; else a graph-private pool).
    pub pool: PoolTag,
    /// Size class.
    pub kind: PoolKind,
    /// What is mapped at each page.
    pub pages: Vec<Page>,
    /// Number of mapped pages.
    pub mapped: usize,
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
            pages: vec![Page::Unmapped; pages],
            mapped: 0,
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

    /// Whether the page starting at `addr` is mapped (false outside the range).
    pub fn is_mapped_at(&self, addr: DevicePtr) -> bool {
        addr >= self.base
            && addr < self.end()
            && self.pages[(addr - self.base) / self.page] != Page::Unmapped
    }

    /// Records a chunk of `len` pages from page `first`.
    pub fn set_chunk(&mut self, first: usize, len: usize, handle: PhysHandle) {
        self.pages[first] = Page::Head { handle, len };
        for p in &mut self.pages[first + 1..first + len] {
            *p = Page::Part { head: first };
        }
        self.mapped += len;
    }

    /// Forgets the chunk starting at page `first`.
    pub fn clear_chunk(&mut self, first: usize, len: usize) {
        for p in &mut self.pages[first..first + len] {
            *p = Page::Unmapped;
        }
        self.mapped -= len;
    }

    /// The chunks lying wholly inside `[ptr, ptr + size)`, which are contiguous:
    /// (first page, handle, pages) each.
    pub fn chunks_inside(&self, ptr: DevicePtr, size: usize) -> Vec<(usize, PhysHandle, usize)> {
        let (first, count) = self.whole_pages(ptr, size);
        let end = first + count;
        let mut i = first;
        // Skip a chunk that starts before the range.
        if let Some(Page::Part { head }) = self.pages.get(i) {
            if let Page::Head { len, .. } = self.pages[*head] {
                i = head + len;
            }
        }
        let mut out = Vec::new();
        while i < end {
            match self.pages[i] {
                Page::Head { handle, len } if i + len <= end => {
                    out.push((i, handle, len));
                    i += len;
                }
                _ => break,
            }
        }
        out
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
            0,
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
    fn chunks_inside_takes_only_whole_chunks() {
        let p = 1usize << 21;
        let mut s = VmSegment::new(1 << 30, p, 8, StreamHandle::DEFAULT, 0, PoolKind::Large);
        s.set_chunk(0, 2, PhysHandle(1));
        s.set_chunk(2, 3, PhysHandle(2));
        s.set_chunk(5, 1, PhysHandle(3));
        assert_eq!(s.mapped, 6);
        assert!(s.is_mapped_at(s.addr(4)) && !s.is_mapped_at(s.addr(6)));
        // From inside the first chunk to the end of the third: only chunks 2 and 3.
        let got = s.chunks_inside(s.addr(1), 5 * p);
        assert_eq!(got, vec![(2, PhysHandle(2), 3), (5, PhysHandle(3), 1)]);
        // A range ending inside a chunk stops before it.
        assert_eq!(s.chunks_inside(s.base, 4 * p), vec![(0, PhysHandle(1), 2)]);
        s.clear_chunk(2, 3);
        assert_eq!(s.mapped, 3);
        assert!(!s.is_mapped_at(s.addr(3)));
    }
}
