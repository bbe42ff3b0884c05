//! MindStudio mstx markers (`libms_tools_ext.so`), loaded at run time when present.
//!
//! Absent library: every call is a no-op costing one branch. Present: ranges go to the
//! `npualloc` domain (`mstxDomainCreateA`) when the library has domains, else to the
//! global domain, so `msprof --msproftx=on` timelines show where allocation time goes.
//!
//! Messages must be non-empty, without NUL and at most 255 bytes (MSPTI's limit); they
//! are truncated on a UTF-8 boundary to 156 bytes (msprof's limit) before being sent.
//!
//! Library: `NPUALLOC_MSTX_LIB`, else `$ASCEND_HOME_PATH/lib64/libms_tools_ext.so`,
//! else `libms_tools_ext.so` from the loader path.

use std::ffi::{c_char, c_void, CString};
use std::num::NonZeroU64;
use std::sync::{Arc, OnceLock};

use libloading::Library;

use crate::device::{DeviceError, StreamHandle};
use crate::error::Error;
use crate::loader::{self, Candidate};

/// Longest message accepted (MSPTI).
pub const MAX_MESSAGE: usize = 255;
/// Messages are cut to this many bytes (msprof) before they are sent.
pub const SENT_MESSAGE: usize = 156;
/// The domain npualloc's ranges go to.
pub const DOMAIN: &str = "npualloc";

type Ptr = *mut c_void;

struct Fns {
    range_start: unsafe extern "C" fn(*const c_char, Ptr) -> u64,
    range_end: unsafe extern "C" fn(u64),
    mark: unsafe extern "C" fn(*const c_char, Ptr),
    domain_create: Option<unsafe extern "C" fn(*const c_char) -> Ptr>,
    domain_range_start: Option<unsafe extern "C" fn(Ptr, *const c_char, Ptr) -> u64>,
    domain_range_end: Option<unsafe extern "C" fn(Ptr, u64)>,
    domain_mark: Option<unsafe extern "C" fn(Ptr, *const c_char, Ptr)>,
}

struct Loaded {
    f: Fns,
    /// The `npualloc` domain, or NULL (global domain).
    domain: usize,
    path: String,
    _lib: Library,
}

/// The mstx marker interface (possibly a no-op).
pub struct Mstx {
    loaded: Option<Loaded>,
}

impl std::fmt::Debug for Mstx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mstx")
            .field("library", &self.loaded.as_ref().map(|l| l.path.as_str()))
            .field(
                "domain",
                &self.loaded.as_ref().is_some_and(|l| l.domain != 0),
            )
            .finish()
    }
}

/// A range opened by [`Mstx::range_start`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeId(pub NonZeroU64);

/// Checks a message and returns what is sent: at most [`SENT_MESSAGE`] bytes, cut on a
/// UTF-8 boundary.
pub fn prepare_message(message: &str) -> Result<CString, Error> {
    if message.is_empty() {
        return Err(Error::InvalidArgument("mstx message is empty".into()));
    }
    if message.len() > MAX_MESSAGE {
        return Err(Error::InvalidArgument(format!(
            "mstx message is {} bytes; at most {MAX_MESSAGE} are allowed",
            message.len()
        )));
    }
    let mut end = message.len().min(SENT_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    CString::new(&message[..end])
        .map_err(|_| Error::InvalidArgument("mstx message contains NUL".into()))
}

impl Mstx {
    /// Markers that do nothing.
    pub fn disabled() -> Mstx {
        Mstx { loaded: None }
    }

    /// Loads the library if present; absent or unusable → disabled (logged at debug level).
    /// Under Miri, which cannot load libraries, always disabled.
    pub fn load() -> Mstx {
        if cfg!(miri) {
            return Mstx::disabled();
        }
        let mut search: Vec<Candidate> = loader::under_ascend_home("lib64/libms_tools_ext.so")
            .into_iter()
            .collect();
        search.extend(loader::on_search_path(&["libms_tools_ext.so"]));
        let (c, explicit) = loader::from_env_or("NPUALLOC_MSTX_LIB", search);
        match loader::open(&c, explicit).and_then(|(lib, path)| Self::from_library(lib, path)) {
            Ok(m) => m,
            Err(e) => {
                log::debug!("npualloc: mstx markers off: {e}");
                Mstx::disabled()
            }
        }
    }

    /// Loads the library at `path` (a test aid).
    pub fn load_from(path: &str) -> Result<Mstx, DeviceError> {
        let (lib, path) = loader::open_path(path)?;
        Self::from_library(lib, path)
    }

    fn from_library(lib: Library, path: String) -> Result<Mstx, DeviceError> {
        // SAFETY: the types are the mstx C signatures (ms_tools_ext.h): messages are
        // `const char*`, streams and domains opaque pointers, range ids `uint64_t`.
        let f = unsafe {
            let p = path.as_str();
            Fns {
                range_start: loader::required(&lib, p, "mstxRangeStartA")?,
                range_end: loader::required(&lib, p, "mstxRangeEnd")?,
                mark: loader::required(&lib, p, "mstxMarkA")?,
                domain_create: loader::optional(&lib, "mstxDomainCreateA"),
                domain_range_start: loader::optional(&lib, "mstxDomainRangeStartA"),
                domain_range_end: loader::optional(&lib, "mstxDomainRangeEndA")
                    .or_else(|| loader::optional(&lib, "mstxDomainRangeEnd")),
                domain_mark: loader::optional(&lib, "mstxDomainMarkA"),
            }
        };
        let domain = match (f.domain_create, f.domain_range_start, f.domain_range_end) {
            (Some(create), Some(_), Some(_)) => {
                let name = CString::new(DOMAIN).expect("no NUL");
                // SAFETY: a valid NUL-terminated domain name; NULL means failure.
                unsafe { create(name.as_ptr()) as usize }
            }
            _ => 0,
        };
        Ok(Mstx {
            loaded: Some(Loaded {
                f,
                domain,
                path,
                _lib: lib,
            }),
        })
    }

    /// The process-wide markers, loaded on first use.
    pub fn global() -> Arc<Mstx> {
        static GLOBAL: OnceLock<Arc<Mstx>> = OnceLock::new();
        GLOBAL.get_or_init(|| Arc::new(Mstx::load())).clone()
    }

    /// Whether a library is loaded.
    pub fn is_enabled(&self) -> bool {
        self.loaded.is_some()
    }

    /// Whether ranges go to the `npualloc` domain.
    pub fn has_domain(&self) -> bool {
        self.loaded.as_ref().is_some_and(|l| l.domain != 0)
    }

    /// Opens a range; `None` when markers are off or mstx reports failure (id 0). The
    /// message is checked either way.
    pub fn range_start(
        &self,
        message: &str,
        stream: StreamHandle,
    ) -> Result<Option<RangeId>, Error> {
        // Checked first, so a bad message is an error whether or not markers are on.
        let msg = prepare_message(message)?;
        let Some(l) = &self.loaded else {
            return Ok(None);
        };
        let s = stream.0 as Ptr;
        // SAFETY: valid C string for the call's duration; the domain (if any) came from
        // mstxDomainCreateA; the functions come from the loaded table.
        let id = unsafe {
            match (l.domain, l.f.domain_range_start) {
                (d, Some(f)) if d != 0 => f(d as Ptr, msg.as_ptr(), s),
                _ => (l.f.range_start)(msg.as_ptr(), s),
            }
        };
        Ok(NonZeroU64::new(id).map(RangeId))
    }

    /// Closes a range.
    pub fn range_end(&self, id: RangeId) {
        if let Some(l) = &self.loaded {
            // SAFETY: an id returned by this library's range start, ended once.
            unsafe {
                match (l.domain, l.f.domain_range_end) {
                    (d, Some(f)) if d != 0 => f(d as Ptr, id.0.get()),
                    _ => (l.f.range_end)(id.0.get()),
                }
            }
        }
    }

    /// An instantaneous marker (the message is checked even when markers are off).
    pub fn mark(&self, message: &str, stream: StreamHandle) -> Result<(), Error> {
        let msg = prepare_message(message)?;
        let Some(l) = &self.loaded else {
            return Ok(());
        };
        // SAFETY: as in range_start.
        unsafe {
            match (l.domain, l.f.domain_mark) {
                (d, Some(f)) if d != 0 => f(d as Ptr, msg.as_ptr(), stream.0 as Ptr),
                _ => (l.f.mark)(msg.as_ptr(), stream.0 as Ptr),
            }
        }
        Ok(())
    }

    /// A range that ends when the guard drops (also on error paths). The message is
    /// only built when markers are on.
    pub fn range(&self, message: impl FnOnce() -> String) -> RangeGuard<'_> {
        let id = if self.loaded.is_some() {
            self.range_start(&message(), StreamHandle::DEFAULT)
                .ok()
                .flatten()
        } else {
            None
        };
        RangeGuard { mstx: self, id }
    }

    /// [`range`](Self::range) with a guard that holds the markers, for a range kept
    /// while its opener goes on changing the state the markers were borrowed from.
    pub fn range_held(self: &Arc<Self>, message: impl FnOnce() -> String) -> HeldRange {
        let id = self.range(message).id.take();
        HeldRange {
            mstx: self.clone(),
            id,
        }
    }
}

/// Ends its range when dropped, holding the markers it was opened with
/// ([`Mstx::range_held`]).
#[must_use = "the range ends when the guard is dropped"]
pub struct HeldRange {
    mstx: Arc<Mstx>,
    id: Option<RangeId>,
}

impl Drop for HeldRange {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.mstx.range_end(id);
        }
    }
}

/// Ends its range when dropped.
#[must_use = "the range ends when the guard is dropped"]
pub struct RangeGuard<'a> {
    mstx: &'a Mstx,
    id: Option<RangeId>,
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.mstx.range_end(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_checked_and_cut_on_char_boundaries() {
        assert!(prepare_message("").is_err());
        assert!(prepare_message("a\0b").is_err());
        assert!(prepare_message(&"x".repeat(256)).is_err());
        assert_eq!(
            prepare_message(&"x".repeat(255)).unwrap().as_bytes().len(),
            SENT_MESSAGE
        );
        // 'é' is 2 bytes: 78 of them are 156 bytes; 79 must cut back to 156, not 157.
        let m = prepare_message(&"é".repeat(79)).unwrap();
        assert_eq!(m.as_bytes().len(), 156);
        assert!(std::str::from_utf8(m.as_bytes()).is_ok());
        let m = prepare_message(&format!("a{}", "é".repeat(78))).unwrap();
        assert_eq!(m.as_bytes().len(), 155);
    }

    #[test]
    fn disabled_markers_do_nothing() {
        let m = Mstx::disabled();
        assert_eq!(m.range_start("x", StreamHandle::DEFAULT), Ok(None));
        assert!(m.mark("x", StreamHandle::DEFAULT).is_ok());
        let mut built = false;
        drop(m.range(|| {
            built = true;
            "x".into()
        }));
        assert!(!built, "the message must not be built when markers are off");
    }
}
