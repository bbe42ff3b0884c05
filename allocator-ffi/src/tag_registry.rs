//! The C ABI's registry of torchair's tag-keyed streams and events (`npu_stream_switch(tag)`,
//! `npu_create_tagged_event(tag)`, `npu_tagged_event_record/wait`,
//! `npu_record_tagged_stream`).
//!
//! Rules: a tag is UTF-8, 1–255 bytes, without NUL. A tag names one stream; binding it
//! again to another stream is an error, to the same stream a no-op. `"default"` always
//! names the default stream. A tag names one event; creating it twice is an error. The
//! device event behind a tagged event is created at its first record, on the recording
//! thread's current device. Waiting on an event never recorded is a no-op, as in ACL.

use std::collections::HashMap;

use parking_lot::Mutex;

use npualloc_core::device::{Device, DeviceIndex, EventHandle};
use npualloc_core::{Error, StreamHandle};

/// The tag that always names the default stream.
pub const DEFAULT_TAG: &str = "default";

/// Checks a tag: UTF-8 (guaranteed by `&str`), 1–255 bytes, no NUL.
pub fn validate_tag(tag: &str) -> Result<(), Error> {
    if tag.is_empty() || tag.len() > 255 || tag.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "tag must be 1-255 bytes of UTF-8 without NUL (got {} bytes)",
            tag.len()
        )));
    }
    Ok(())
}

#[derive(Default)]
struct Tags {
    streams: HashMap<String, StreamHandle>,
    /// `None` until first recorded.
    events: HashMap<String, Option<(DeviceIndex, EventHandle)>>,
}

/// A process-wide, thread-safe registry of tagged streams and events.
#[derive(Default)]
pub struct TagRegistry {
    inner: Mutex<Tags>,
}

impl std::fmt::Debug for TagRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.inner.lock();
        f.debug_struct("TagRegistry")
            .field("streams", &t.streams.len())
            .field("events", &t.events.len())
            .finish()
    }
}

impl TagRegistry {
    /// Binds `tag` to `stream`.
    pub fn tag_stream(&self, tag: &str, stream: StreamHandle) -> Result<(), Error> {
        validate_tag(tag)?;
        if tag == DEFAULT_TAG {
            return if stream == StreamHandle::DEFAULT {
                Ok(())
            } else {
                Err(Error::InvalidState(format!(
                    "tag 'default' always names the default stream, not {stream}"
                )))
            };
        }
        let mut t = self.inner.lock();
        match t.streams.get(tag) {
            Some(&s) if s == stream => Ok(()),
            Some(&s) => Err(Error::InvalidState(format!(
                "tag '{tag}' is already bound to {s}, cannot bind it to {stream}"
            ))),
            None => {
                t.streams.insert(tag.to_owned(), stream);
                Ok(())
            }
        }
    }

    /// The stream `tag` names.
    pub fn stream_of(&self, tag: &str) -> Result<StreamHandle, Error> {
        validate_tag(tag)?;
        if tag == DEFAULT_TAG {
            return Ok(StreamHandle::DEFAULT);
        }
        self.inner
            .lock()
            .streams
            .get(tag)
            .copied()
            .ok_or_else(|| Error::UnknownTag(tag.to_owned()))
    }

    /// Creates the event named `tag`.
    pub fn event_create(&self, tag: &str) -> Result<(), Error> {
        validate_tag(tag)?;
        let mut t = self.inner.lock();
        if t.events.contains_key(tag) {
            return Err(Error::InvalidState(format!(
                "tagged event '{tag}' already exists"
            )));
        }
        t.events.insert(tag.to_owned(), None);
        Ok(())
    }

    /// Records the event named `tag` on `stream`.
    pub fn event_record(
        &self,
        dev: &dyn Device,
        tag: &str,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        validate_tag(tag)?;
        let mut t = self.inner.lock();
        let slot = t
            .events
            .get_mut(tag)
            .ok_or_else(|| Error::UnknownTag(tag.to_owned()))?;
        let (device, ev) = match *slot {
            Some(h) => h,
            None => {
                let device = dev.current_device()?;
                let ev = dev.event_create(device)?;
                *slot = Some((device, ev));
                (device, ev)
            }
        };
        dev.event_record(device, ev, stream)?;
        Ok(())
    }

    /// Makes `stream` wait on the device for the event named `tag`; never blocks the host.
    pub fn event_wait(
        &self,
        dev: &dyn Device,
        tag: &str,
        stream: StreamHandle,
    ) -> Result<(), Error> {
        validate_tag(tag)?;
        let t = self.inner.lock();
        match t.events.get(tag) {
            None => Err(Error::UnknownTag(tag.to_owned())),
            Some(None) => Ok(()), // never recorded: nothing to wait for
            Some(Some((device, ev))) => Ok(dev.stream_wait_event(*device, stream, *ev)?),
        }
    }

    /// Destroys every device event and forgets every tag.
    #[cfg(test)]
    pub fn clear(&self, dev: &dyn Device) {
        let mut t = self.inner.lock();
        for (device, ev) in t.events.drain().filter_map(|(_, h)| h) {
            let _ = dev.event_destroy(device, ev);
        }
        t.streams.clear();
    }
}

#[cfg(test)]
mod torchair_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use npualloc_core::device::sim::{SimConfig, SimDevice};

    #[test]
    fn streams_bind_once_and_default_is_fixed() {
        let r = TagRegistry::default();
        let s = StreamHandle(0x40);
        r.tag_stream("66", s).unwrap();
        r.tag_stream("66", s).unwrap();
        assert!(matches!(
            r.tag_stream("66", StreamHandle(0x50)),
            Err(Error::InvalidState(_))
        ));
        assert_eq!(r.stream_of("66").unwrap(), s);
        assert_eq!(r.stream_of("default").unwrap(), StreamHandle::DEFAULT);
        assert!(matches!(
            r.tag_stream("default", s),
            Err(Error::InvalidState(_))
        ));
        assert_eq!(r.stream_of("77"), Err(Error::UnknownTag("77".into())));
    }

    #[test]
    fn tags_are_validated() {
        let r = TagRegistry::default();
        for bad in ["", "a\0b", &"x".repeat(256)] {
            assert!(matches!(
                r.tag_stream(bad, StreamHandle(1)),
                Err(Error::InvalidArgument(_))
            ));
        }
        r.tag_stream(&"é".repeat(127), StreamHandle(1)).unwrap(); // 254 bytes
    }

    #[test]
    fn events_are_created_once_and_wait_before_record_is_a_noop() {
        let sim = SimDevice::new(SimConfig::default());
        let r = TagRegistry::default();
        assert_eq!(
            r.event_record(&*sim, "e", StreamHandle::DEFAULT),
            Err(Error::UnknownTag("e".into()))
        );
        r.event_create("e").unwrap();
        assert!(matches!(r.event_create("e"), Err(Error::InvalidState(_))));
        let s = sim.create_stream(0).unwrap();
        r.event_wait(&*sim, "e", s).unwrap();
        assert_eq!(
            sim.pending(0, s).unwrap(),
            0,
            "wait on an unrecorded event queued work"
        );
        r.event_record(&*sim, "e", StreamHandle::DEFAULT).unwrap();
        r.event_wait(&*sim, "e", s).unwrap();
        assert_eq!(sim.pending(0, s).unwrap(), 1);
        assert_eq!(sim.counters(0).events_created, 1);
        r.clear(&*sim);
        assert_eq!(sim.counters(0).events_destroyed, 1);
    }
}
