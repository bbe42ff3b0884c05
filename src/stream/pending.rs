//! Things waiting for events: one FIFO per stream the events were recorded on. Frees
//! waiting for the streams their blocks were used on are one kind (`PendingFrees`);
//! the lending fences (`super::fences`) are the other.
//!
//! Events on one stream complete in the order they were recorded, so polling a FIFO
//! stops at its first incomplete event; separate FIFOs per stream keep a slow stream
//! from holding back blocks used only on fast ones.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::device::{Device, DeviceIndex, EventHandle, StreamHandle};
use crate::pool::BlockId;

/// Per-stream FIFOs of (event, item) pairs.
#[derive(Debug)]
pub struct EventQueues<T> {
    queues: FxHashMap<StreamHandle, VecDeque<(EventHandle, T)>>,
    len: usize,
}

/// Frees waiting for the events of the streams their blocks were used on.
pub type PendingFrees = EventQueues<BlockId>;

impl<T> Default for EventQueues<T> {
    fn default() -> Self {
        EventQueues {
            queues: FxHashMap::default(),
            len: 0,
        }
    }
}

impl<T: Copy> EventQueues<T> {
    /// Queues `block` behind `event`, recorded on `stream`.
    pub fn push(&mut self, stream: StreamHandle, event: EventHandle, block: T) {
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
        mut done: impl FnMut(StreamHandle, EventHandle, T),
    ) {
        if self.len == 0 {
            return;
        }
        for (&s, q) in self.queues.iter_mut() {
            while let Some(&(ev, block)) = q.front() {
                if !matches!(dev.event_query(index, ev), Ok(true)) {
                    break;
                }
                q.pop_front();
                self.len -= 1;
                done(s, ev, block);
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
    }

    /// Removes every pair (after the caller synchronised them).
    pub fn drain(&mut self) -> Vec<(StreamHandle, EventHandle, T)> {
        self.len = 0;
        self.queues
            .drain()
            .flat_map(|(s, q)| q.into_iter().map(move |(e, b)| (s, e, b)))
            .collect()
    }

    /// The streams with queued pairs.
    pub fn streams(&self) -> Vec<StreamHandle> {
        self.queues.keys().copied().collect()
    }

    /// The last event queued on `stream`, if any.
    pub fn last_on(&self, stream: StreamHandle) -> Option<EventHandle> {
        self.queues.get(&stream)?.back().map(|&(e, _)| e)
    }

    /// Removes every pair queued on `stream` (after the caller synchronised its last
    /// event), front to back.
    pub fn take_stream(&mut self, stream: StreamHandle) -> Vec<(EventHandle, T)> {
        let q: Vec<_> = self.queues.remove(&stream).unwrap_or_default().into();
        self.len -= q.len();
        q
    }

    /// Removes the pairs queued on `stream` whose item passes `take`, front to back;
    /// the others stay queued in their order.
    pub fn take_where(
        &mut self,
        stream: StreamHandle,
        mut take: impl FnMut(T) -> bool,
    ) -> Vec<(EventHandle, T)> {
        let Some(q) = self.queues.get_mut(&stream) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        q.retain(|&(ev, it)| {
            let hit = take(it);
            if hit {
                out.push((ev, it));
            }
            !hit
        });
        if q.is_empty() {
            self.queues.remove(&stream);
        }
        self.len -= out.len();
        out
    }

    /// Removes every pair whose item is `item` (wherever it is queued); returns them.
    pub fn remove_item(&mut self, item: T) -> Vec<(StreamHandle, EventHandle)>
    where
        T: PartialEq,
    {
        let mut out = Vec::new();
        for s in self.streams() {
            let taken = self.take_where(s, |it| it == item);
            out.extend(taken.into_iter().map(|(ev, _)| (s, ev)));
        }
        out
    }

    /// Every queued pair, for inspection.
    pub fn iter(&self) -> impl Iterator<Item = (StreamHandle, EventHandle, T)> + '_ {
        self.queues
            .iter()
            .flat_map(|(s, q)| q.iter().map(move |&(e, b)| (*s, e, b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_where_removes_the_chosen_pairs_of_one_stream_in_order() {
        let (a, b) = (StreamHandle(1), StreamHandle(2));
        let mut q: EventQueues<u32> = EventQueues::default();
        for (s, e, x) in [(a, 1, 10), (b, 2, 20), (a, 3, 31), (a, 4, 40)] {
            q.push(s, EventHandle(e), x);
        }
        let even = |x: u32| x % 2 == 0;
        assert_eq!(
            q.take_where(a, even),
            vec![(EventHandle(1), 10), (EventHandle(4), 40)]
        );
        assert_eq!(q.len(), 2);
        assert_eq!(
            q.last_on(a),
            Some(EventHandle(3)),
            "the odd one stays queued"
        );
        assert_eq!(q.take_where(b, even), vec![(EventHandle(2), 20)]);
        assert_eq!(q.streams(), vec![a]);
    }
}
