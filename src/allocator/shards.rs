//! The stream → shard table: one shard (block state behind its own mutex) per stream,
//! found without taking any lock.
//!
//! Open addressing over a fixed number of slots. A slot's key is `stream + 1` (0 means
//! empty); a key, once claimed, never changes, and its shard is published once through
//! a `OnceLock`. Readers only load keys and wait for the shard of a claimed key.
//!
//! Shards are boxed: an empty table is its keys, slot pointers and creation order
//! (about 28 bytes per slot, ~112 KiB for 4,096 slots), not 4,096 inline shard states.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;

use parking_lot::{Mutex, MutexGuard};

use super::shard::ShardState;
use crate::device::StreamHandle;

/// Most streams one device's allocator serves.
pub const MAX_STREAMS: usize = 4096;

/// One stream's allocator state.
pub(crate) struct Shard {
    pub stream: StreamHandle,
    /// Reached only through [`Shard::lock`] and [`Shard::try_lock`], which mark the
    /// start of an operation for the statistics log.
    state: Mutex<ShardState>,
    /// Frees of this shard waiting for events (so others can skip polling it).
    pub pending: AtomicUsize,
}

impl Shard {
    /// Locks the shard's state: one operation, for the statistics log.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, ShardState> {
        let mut st = self.state.lock();
        st.acct.begin_op();
        st
    }

    /// Locks the shard's state if no one holds it.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, ShardState>> {
        let mut st = self.state.try_lock()?;
        st.acct.begin_op();
        Some(st)
    }
}

pub(crate) struct ShardTable {
    keys: Box<[AtomicUsize]>,
    slots: Box<[OnceLock<Box<Shard>>]>,
    /// Slot indices in creation order (`u32::MAX` until written), for lock-free iteration.
    order: Box<[AtomicU32]>,
    count: AtomicUsize,
}

fn hash(stream: StreamHandle) -> usize {
    // Fibonacci hashing of the handle (pointers are aligned: mix the high bits down).
    (stream.0 as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(32) as usize
}

impl ShardTable {
    pub fn new() -> Self {
        ShardTable {
            keys: (0..MAX_STREAMS).map(|_| AtomicUsize::new(0)).collect(),
            slots: (0..MAX_STREAMS).map(|_| OnceLock::new()).collect(),
            order: (0..MAX_STREAMS).map(|_| AtomicU32::new(u32::MAX)).collect(),
            count: AtomicUsize::new(0),
        }
    }

    /// The shard of `stream`, if it exists.
    #[inline]
    pub fn get(&self, stream: StreamHandle) -> Option<(u32, &Shard)> {
        let key = stream.0.wrapping_add(1);
        let mut i = hash(stream) % MAX_STREAMS;
        for _ in 0..MAX_STREAMS {
            match self.keys[i].load(Ordering::Acquire) {
                0 => return None,
                k if k == key => return Some((i as u32, self.slot(i))),
                _ => i = (i + 1) % MAX_STREAMS,
            }
        }
        None
    }

    /// The shard of `stream`, created with `make` if needed; `None` when the table is full.
    pub fn get_or_insert(
        &self,
        stream: StreamHandle,
        make: impl FnOnce() -> ShardState,
    ) -> Option<(u32, &Shard)> {
        let key = stream.0.wrapping_add(1);
        let mut i = hash(stream) % MAX_STREAMS;
        for _ in 0..MAX_STREAMS {
            match self.keys[i].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let shard = Shard {
                        stream,
                        state: Mutex::new(make()),
                        pending: AtomicUsize::new(0),
                    };
                    let _ = self.slots[i].set(Box::new(shard));
                    let n = self.count.fetch_add(1, Ordering::AcqRel);
                    self.order[n].store(i as u32, Ordering::Release);
                    return Some((i as u32, self.slots[i].wait()));
                }
                Err(k) if k == key => return Some((i as u32, self.slot(i))),
                Err(_) => i = (i + 1) % MAX_STREAMS,
            }
        }
        None
    }

    /// Shard by its index (as stored in the pointer map).
    #[inline]
    pub fn by_index(&self, i: u32) -> &Shard {
        self.slot(i as usize)
    }

    /// The shard of a claimed slot (its creator may still be publishing it).
    #[inline]
    fn slot(&self, i: usize) -> &Shard {
        match self.slots[i].get() {
            Some(s) => s,
            None => self.slots[i].wait(),
        }
    }

    /// Every shard with its index, in creation order, without locking.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Shard)> + '_ {
        let n = self.count.load(Ordering::Acquire).min(MAX_STREAMS);
        (0..n).filter_map(move |k| {
            let i = self.order[k].load(Ordering::Acquire);
            if i == u32::MAX {
                return None;
            }
            self.slots[i as usize].get().map(|s| (i, &**s))
        })
    }

    /// Every shard, in creation order.
    pub fn all(&self) -> Vec<&Shard> {
        self.iter().map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_table_holds_no_shard_state() {
        // Each slot is a pointer-sized cell, not a shard (which is over a kilobyte).
        assert!(std::mem::size_of::<OnceLock<Box<Shard>>>() <= 16);
        assert!(std::mem::size_of::<Shard>() > 1000);
        let t = ShardTable::new();
        assert_eq!(t.iter().count(), 0);
        assert!(t.get(StreamHandle::DEFAULT).is_none());
    }
}
