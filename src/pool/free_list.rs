//! Free lists: the cached, reusable blocks of one stream, ordered for best fit.
//!
//! Invariant: an entry `(size, ptr, id)` is present exactly when block `id` is free,
//! belongs to this stream and pool, and has that size and address.

use std::collections::BTreeSet;

use super::block::{BlockId, PoolKind};
use crate::device::DevicePtr;

/// Free blocks of one stream and pool kind, ordered by (size, address).
#[derive(Default, Debug)]
pub struct FreeList {
    set: BTreeSet<(usize, DevicePtr, BlockId)>,
}

impl FreeList {
    /// Adds a free block.
    pub fn insert(&mut self, size: usize, ptr: DevicePtr, id: BlockId) {
        let fresh = self.set.insert((size, ptr, id));
        debug_assert!(fresh, "block {id} inserted twice");
    }

    /// Removes a block; returns whether it was present.
    pub fn remove(&mut self, size: usize, ptr: DevicePtr, id: BlockId) -> bool {
        self.set.remove(&(size, ptr, id))
    }

    /// The smallest block of at least `size` bytes (lowest address on ties).
    pub fn best_fit(&self, size: usize) -> Option<(usize, DevicePtr, BlockId)> {
        self.set.range((size, 0, 0)..).next().copied()
    }

    /// The largest block.
    pub fn largest(&self) -> Option<(usize, DevicePtr, BlockId)> {
        self.set.iter().next_back().copied()
    }

    /// Entries from largest to smallest.
    pub fn iter_desc(&self) -> impl Iterator<Item = (usize, DevicePtr, BlockId)> + '_ {
        self.set.iter().rev().copied()
    }

    /// Entries in (size, address) order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, DevicePtr, BlockId)> + '_ {
        self.set.iter().copied()
    }

    /// Number of free blocks.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// No free blocks.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// The small and large free lists of one stream.
#[derive(Default, Debug)]
pub struct StreamPools {
    /// Blocks of the small pool.
    pub small: FreeList,
    /// Blocks of the large pool.
    pub large: FreeList,
}

impl StreamPools {
    /// The free list of `kind`.
    pub fn get(&self, kind: PoolKind) -> &FreeList {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    /// The free list of `kind`, mutably.
    pub fn get_mut(&mut self, kind: PoolKind) -> &mut FreeList {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_prefers_smallest_then_lowest_address() {
        let mut l = FreeList::default();
        l.insert(4096, 0x3000, 3);
        l.insert(2048, 0x2000, 2);
        l.insert(2048, 0x1000, 1);
        assert_eq!(l.best_fit(1024), Some((2048, 0x1000, 1)));
        assert_eq!(l.best_fit(3000), Some((4096, 0x3000, 3)));
        assert_eq!(l.best_fit(5000), None);
        assert!(l.remove(2048, 0x1000, 1));
        assert!(!l.remove(2048, 0x1000, 1));
        assert_eq!(l.best_fit(1024), Some((2048, 0x2000, 2)));
        assert_eq!(l.largest(), Some((4096, 0x3000, 3)));
    }
}
