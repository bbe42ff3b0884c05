//! Frees waiting for events: one FIFO per stream the blocks were used on.
//!
//! Events on one stream complete in the order they were recorded, so polling a FIFO
//! stops at its first incomplete event; separate FIFOs per stream keep a slow stream
//! from holding back blocks used only on fast ones.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::device::{Device, DeviceIndex, EventHandle, StreamHandle};
use crate::pool::BlockId;

/// Per-stream FIFOs of (event, block) pairs.
#[derive(Debug, Default)]
pub struct PendingFrees {
    queues: FxHashMap<StreamHandle, VecDeque<(EventHandle, BlockId)>>,
    len: usize,
}

impl PendingFrees {
    /// Queues `block` behind `event`, recorded on `stream`.
    pub fn push(&mut self, stream: StreamHandle, event: EventHandle, block: BlockId) {
        self.queues
            .entry(stream)
            .or_default()
            .push_back((event, block));
        self.len += 1;
    }

    /// Number of queued pairs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No queued pairs.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pops every pair whose event has completed, front to back per stream, stopping at
    /// the first incomplete (or failing) query of each stream; calls `done` for each.
    pub fn poll(
        &mut self,
        dev: &dyn Device,
        index: DeviceIndex,
        mut done: impl FnMut(EventHandle, BlockId),
    ) {
        if self.len == 0 {
            return;
        }
        for q in self.queues.values_mut() {
            while let Some(&(ev, block)) = q.front() {
                if !matches!(dev.event_query(index, ev), Ok(true)) {
                    break;
                }
                q.pop_front();
                self.len -= 1;
                done(ev, block);
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
    }

    /// Removes every pair (after the caller synchronised them).
    pub fn drain(&mut self) -> Vec<(StreamHandle, EventHandle, BlockId)> {
        self.len = 0;
        self.queues
            .drain()
            .flat_map(|(s, q)| q.into_iter().map(move |(e, b)| (s, e, b)))
            .collect()
    }

    /// Every queued pair, for inspection.
    pub fn iter(&self) -> impl Iterator<Item = (StreamHandle, EventHandle, BlockId)> + '_ {
        self.queues
            .iter()
            .flat_map(|(s, q)| q.iter().map(move |&(e, b)| (*s, e, b)))
    }
}
