//! `NPUALLOC_TRACE=path`: appends every malloc, free and record_stream the library
//! serves to a trace file in the text format, so users can record their own workloads
//! and replay them with `npualloc replay`. Buffered; flushed by `npualloc_empty_cache*`
//! and at process exit.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::error::{Failure, NPUALLOC_ERR_IO};

struct Inner {
    out: BufWriter<File>,
    ids: HashMap<usize, u64>,
    streams: HashMap<usize, u32>,
    next_id: u64,
}

/// The trace recorder.
pub(crate) struct Recorder {
    inner: Mutex<Inner>,
}

/// The trace format's header line (`npualloc::trace::HEADER`; the core's `trace` module
/// is compiled only with its `cli` feature, which this library leaves off).
const TRACE_HEADER: &str = "# npualloc-trace v1";

static RECORDER: OnceLock<Option<Recorder>> = OnceLock::new();

extern "C" fn flush_at_exit() {
    if let Some(Some(r)) = RECORDER.get() {
        r.flush();
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// Opens the recorder if `NPUALLOC_TRACE` is set (once per process).
pub(crate) fn init() -> Result<(), Failure> {
    let path = match std::env::var("NPUALLOC_TRACE") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            let _ = RECORDER.set(None);
            return Ok(());
        }
    };
    let file = File::create(&path).map_err(|e| {
        Failure::new(
            NPUALLOC_ERR_IO,
            format!("NPUALLOC_TRACE='{path}': cannot create: {e}"),
        )
    })?;
    let mut out = BufWriter::new(file);
    let _ = writeln!(
        out,
        "{} source=NPUALLOC_TRACE pid={}",
        TRACE_HEADER,
        std::process::id()
    );
    let rec = Recorder {
        inner: Mutex::new(Inner {
            out,
            ids: HashMap::new(),
            streams: HashMap::from([(0, 0)]),
            next_id: 0,
        }),
    };
    if RECORDER.set(Some(rec)).is_ok() {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe { atexit(flush_at_exit) };
    }
    Ok(())
}

/// The recorder, if tracing is on.
pub(crate) fn recorder() -> Option<&'static Recorder> {
    RECORDER.get().and_then(|r| r.as_ref())
}

impl Inner {
    fn label(&mut self, stream: usize) -> u32 {
        let n = self.streams.len() as u32;
        *self.streams.entry(stream).or_insert(n)
    }
}

impl Recorder {
    /// A served allocation.
    pub fn alloc(&self, ptr: usize, size: usize, stream: usize) {
        let mut g = self.inner.lock();
        let id = g.next_id;
        g.next_id += 1;
        g.ids.insert(ptr, id);
        let label = g.label(stream);
        let _ = writeln!(g.out, "a {id} {size} {label}");
    }

    /// A free about to be served (logged first, so a concurrent reuse of `ptr` logs after it).
    pub fn free(&self, ptr: usize) {
        let mut g = self.inner.lock();
        if let Some(id) = g.ids.remove(&ptr) {
            let _ = writeln!(g.out, "f {id}");
        }
    }

    /// A served record_stream.
    pub fn record(&self, ptr: usize, stream: usize) {
        let mut g = self.inner.lock();
        if let Some(&id) = g.ids.get(&ptr) {
            let label = g.label(stream);
            let _ = writeln!(g.out, "r {id} {label}");
        }
    }

    /// Writes buffered lines to the file.
    pub fn flush(&self) {
        let _ = self.inner.lock().out.flush();
    }
}
