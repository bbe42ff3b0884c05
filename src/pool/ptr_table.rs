//! A shard's map from live pointers to their blocks: open addressing with linear
//! probing and backward-shift deletion (no tombstones), hashed on the 512-byte-aligned
//! address. Cheaper than a general hash map on the allocator's fast path.
//!
//! Invariants: every key is non-zero (0 marks an empty slot) and sits at or after its
//! home slot with no empty slot in between (cyclically); `len` counts the keys; the
//! table is at most 3/8 full (short runs: a remove's backward shift stays short).

use crate::handle::DevicePtr;

use super::BlockId;

/// Pointer → block map.
#[derive(Debug, Clone)]
pub struct PtrTable {
    keys: Vec<DevicePtr>,
    vals: Vec<BlockId>,
    len: usize,
    /// Most entries before the table grows: 3/8 of the slots.
    limit: usize,
    shift: u32,
}

impl Default for PtrTable {
    fn default() -> Self {
        Self::with_slots(64)
    }
}

impl PtrTable {
    fn with_slots(slots: usize) -> Self {
        PtrTable {
            keys: vec![0; slots],
            vals: vec![0; slots],
            len: 0,
            limit: slots / 8 * 3,
            shift: 64 - slots.trailing_zeros(),
        }
    }

    #[inline]
    fn home(&self, ptr: DevicePtr) -> usize {
        (((ptr >> 9) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Maps `ptr` (non-zero) to `id`, replacing an earlier mapping.
    #[inline]
    pub fn insert(&mut self, ptr: DevicePtr, id: BlockId) {
        debug_assert!(ptr != 0);
        if self.len >= self.limit {
            self.grow();
        }
        let mut i = self.home(ptr);
        loop {
            match self.keys[i] {
                0 => {
                    self.keys[i] = ptr;
                    self.vals[i] = id;
                    self.len += 1;
                    return;
                }
                k if k == ptr => {
                    self.vals[i] = id;
                    return;
                }
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    #[inline]
    fn find(&self, ptr: DevicePtr) -> Option<usize> {
        if ptr == 0 {
            return None;
        }
        let mut i = self.home(ptr);
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == ptr => return Some(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    /// The block of `ptr`.
    #[inline]
    pub fn get(&self, ptr: &DevicePtr) -> Option<&BlockId> {
        self.find(*ptr).map(|i| &self.vals[i])
    }

    /// Removes `ptr`, returning its block.
    #[inline]
    pub fn remove(&mut self, ptr: &DevicePtr) -> Option<BlockId> {
        let mut hole = self.find(*ptr)?;
        let id = self.vals[hole];
        self.len -= 1;
        // Backward shift: pull later keys of the run into the hole when that keeps
        // them at or after their home slot.
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.keys[j];
            if k == 0 {
                break;
            }
            let home = self.home(k);
            // Does `home` lie cyclically in (hole, j]? Then the key must stay.
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.keys[hole] = k;
                self.vals[hole] = self.vals[j];
                hole = j;
            }
        }
        self.keys[hole] = 0;
        Some(id)
    }

    /// Every mapped pointer.
    pub fn keys(&self) -> impl Iterator<Item = &DevicePtr> {
        self.keys.iter().filter(|&&k| k != 0)
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, Self::with_slots(self.keys.len() * 2));
        for (k, v) in old.keys.into_iter().zip(old.vals) {
            if k != 0 {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn behaves_like_a_hash_map_under_churn() {
        let mut t = PtrTable::default();
        let mut model: HashMap<usize, usize> = HashMap::new();
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for step in 0..200_000usize {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Few distinct keys (heavy reuse, long probe runs) and some far apart.
            let ptr = if seed % 3 == 0 {
                ((seed >> 8) as usize % 4096 + 1) << 9
            } else {
                ((seed >> 20) as usize % 300 + 1) << 9
            };
            if seed % 2 == 0 {
                t.insert(ptr, step);
                model.insert(ptr, step);
            } else {
                assert_eq!(t.remove(&ptr), model.remove(&ptr), "step {step}");
            }
            if step % 997 == 0 {
                assert_eq!(t.len(), model.len());
                for (k, v) in &model {
                    assert_eq!(t.get(k), Some(v));
                }
                assert_eq!(t.keys().count(), model.len());
            }
        }
        assert_eq!(t.get(&0), None);
        assert_eq!(t.remove(&512_000_000), None);
    }
}
