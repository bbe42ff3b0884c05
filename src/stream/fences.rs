//! Lending fences: how far each borrower stream has run, learnt without host waits.
//!
//! A block lent to another stream comes back to its owner's free list as soon as the
//! borrower frees it, marked *dirty* on the borrower with an epoch: work the borrower
//! queued on it may not have run yet. At that free an event (the fence) is recorded on
//! the borrower; once polling sees it complete, every mark on that stream up to its
//! epoch is clear. Until then, whoever takes the block waits on the device for the
//! borrower, and the block is not given back to the device.
//!
//! The marks live in a side table ([`DirtyMarks`], by block) so that blocks, and the
//! fast path that moves them, stay small; a block's `dirty` flag says it has some.
//!
//! Invariants: epochs are handed out in increasing order and never reused; per stream,
//! fences are queued in epoch order; `cleared[s]` is the epoch of the latest completed
//! fence of `s` (absent: none). [`UNFENCED`] marks a free whose fence could not be
//! recorded: it is clear only after a synchronisation of its stream. A block has one
//! mark per stream at most (the latest epoch), and an entry only while it has marks.

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::pending::EventQueues;
use crate::device::{Device, DeviceError, DeviceIndex, EventHandle, StreamHandle};
use crate::pool::BlockId;

/// A block's marks: (stream, epoch of the fence recorded when it was freed there).
pub type Marks = SmallVec<[(StreamHandle, u64); 1]>;

/// The dirty marks of one shard's blocks.
#[derive(Debug, Default)]
pub struct DirtyMarks {
    marks: FxHashMap<BlockId, Marks>,
}

impl DirtyMarks {
    /// Marks block `id` dirty on `stream` since fence `epoch`.
    pub fn add(&mut self, id: BlockId, stream: StreamHandle, epoch: u64) {
        merge(self.marks.entry(id).or_default(), &[(stream, epoch)]);
    }

    /// Block `id`'s marks (empty if none).
    pub fn get(&self, id: BlockId) -> &[(StreamHandle, u64)] {
        self.marks.get(&id).map_or(&[], |m| m.as_slice())
    }

    /// Removes and returns block `id`'s marks.
    pub fn take(&mut self, id: BlockId) -> Marks {
        self.marks.remove(&id).unwrap_or_default()
    }

    /// Block `src` was merged into `dst`: `dst` gets its marks too.
    pub fn merge_into(&mut self, dst: BlockId, src: BlockId) {
        if let Some(m) = self.marks.remove(&src) {
            merge(self.marks.entry(dst).or_default(), &m);
        }
    }

    /// Drops every mark on `stream`; returns the blocks left with none.
    pub fn clear_stream(&mut self, stream: StreamHandle) -> Vec<BlockId> {
        let mut emptied = Vec::new();
        for (&id, m) in self.marks.iter_mut() {
            m.retain(|x| x.0 != stream);
            if m.is_empty() {
                emptied.push(id);
            }
        }
        for id in &emptied {
            self.marks.remove(id);
        }
        emptied
    }

    /// Blocks with marks, and their marks.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &[(StreamHandle, u64)])> + '_ {
        self.marks.iter().map(|(&id, m)| (id, m.as_slice()))
    }

    /// Number of blocks with marks.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.marks.len()
    }

    /// No block has marks.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

/// Adds `new` marks to `into`, keeping the latest epoch per stream.
fn merge(into: &mut Marks, new: &[(StreamHandle, u64)]) {
    for &(stream, epoch) in new {
        match into.iter_mut().find(|m| m.0 == stream) {
            Some(m) => m.1 = m.1.max(epoch),
            None => into.push((stream, epoch)),
        }
    }
}

/// The epoch of a dirty mark whose fence could not be recorded.
pub const UNFENCED: u64 = u64::MAX;

/// Fences of one shard.
#[derive(Debug, Default)]
pub struct Fences {
    queued: EventQueues<u64>,
    cleared: FxHashMap<StreamHandle, u64>,
    epoch: u64,
}

impl Fences {
    /// Queues fence `event`, just recorded on `stream`; returns its epoch.
    pub fn push(&mut self, stream: StreamHandle, event: EventHandle) -> u64 {
        self.epoch += 1;
        self.queued.push(stream, event, self.epoch);
        self.epoch
    }

    /// Whether a mark on `stream` from `epoch` is clear: its fence has completed.
    pub fn is_clear(&self, stream: StreamHandle, epoch: u64) -> bool {
        self.cleared.get(&stream).is_some_and(|&c| c >= epoch)
    }

    /// No fence is outstanding.
    pub fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// The latest epoch handed out (0: none).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Takes in the completed fences (no waiting); `put` gets their events back.
    pub fn poll(&mut self, dev: &dyn Device, index: DeviceIndex, mut put: impl FnMut(EventHandle)) {
        let cleared = &mut self.cleared;
        self.queued.poll(dev, index, |s, ev, epoch| {
            let c = cleared.entry(s).or_default();
            *c = (*c).max(epoch);
            put(ev);
        });
    }

    /// The shard's own stream now waits on the device for everything queued on `stream`
    /// so far, fences included: every mark handed out on `stream` is met for whoever
    /// takes the shard's blocks next (a borrower first waits on the shard's stream).
    pub fn met(&mut self, stream: StreamHandle) {
        let c = self.cleared.entry(stream).or_default();
        *c = (*c).max(self.epoch);
    }

    /// Whether every mark in `marks` is clear.
    pub fn all_clear(&self, marks: &[(StreamHandle, u64)]) -> bool {
        marks.iter().all(|&(s, e)| self.is_clear(s, e))
    }

    /// Waits for the fences on `only` (every stream: `None`); `put` gets their events
    /// back. Returns the first error; fences that failed stay queued.
    pub fn synchronize(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        only: Option<StreamHandle>,
        mut put: impl FnMut(EventHandle),
    ) -> Result<(), DeviceError> {
        let mut first_err = None;
        let mut drained = self.queued.drain();
        drained.sort_by_key(|&(_, _, epoch)| epoch);
        for (s, ev, epoch) in drained {
            if only.is_some_and(|o| o != s) {
                self.queued.push(s, ev, epoch);
                continue;
            }
            match dev.event_synchronize(index, ev) {
                Ok(()) => {
                    let c = self.cleared.entry(s).or_default();
                    *c = (*c).max(epoch);
                    put(ev);
                }
                Err(e) => {
                    self.queued.push(s, ev, epoch);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{SimConfig, SimDevice, SimMode};

    #[test]
    fn marks_merge_per_stream_and_clear_by_stream() {
        let (a, b) = (StreamHandle(0x10), StreamHandle(0x20));
        let mut d = DirtyMarks::default();
        d.add(1, a, 3);
        d.add(2, a, 5);
        d.add(2, b, 4);
        d.merge_into(1, 2);
        assert_eq!(d.get(1), &[(a, 5), (b, 4)]);
        assert!(d.get(2).is_empty() && d.len() == 1);
        d.add(3, b, 6);
        let mut emptied = d.clear_stream(b);
        emptied.sort();
        assert_eq!(emptied, vec![3]);
        assert_eq!(d.get(1), &[(a, 5)]);
        assert_eq!(d.take(1).as_slice(), &[(a, 5)]);
        assert!(d.is_empty());
    }

    #[test]
    fn a_mark_clears_once_its_fence_has_run() {
        let sim = SimDevice::new(SimConfig {
            mode: SimMode::Manual,
            ..SimConfig::default()
        });
        let s = sim.create_stream(0).unwrap();
        let mut f = Fences::default();
        let (e1, e2) = (sim.event_create(0).unwrap(), sim.event_create(0).unwrap());
        sim.event_record(0, e1, s).unwrap();
        let first = f.push(s, e1);
        sim.event_record(0, e2, s).unwrap();
        let second = f.push(s, e2);
        assert!(second > first);
        let mut back = Vec::new();
        f.poll(&*sim, 0, |e| back.push(e));
        assert!(back.is_empty() && !f.is_clear(s, first));
        sim.step(0, s, 1).unwrap();
        f.poll(&*sim, 0, |e| back.push(e));
        assert_eq!(back, vec![e1]);
        assert!(f.is_clear(s, first) && !f.is_clear(s, second));
        assert!(
            !f.is_clear(StreamHandle::DEFAULT, first),
            "other streams stay dirty"
        );
        assert!(!f.is_clear(s, UNFENCED));
        sim.complete_stream(0, s).unwrap();
        f.synchronize(&*sim, 0, None, |e| back.push(e)).unwrap();
        assert!(f.is_clear(s, second) && f.is_empty());
        assert_eq!(back, vec![e1, e2]);
    }
}
