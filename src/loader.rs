//! Run-time loading of a dynamic library and its symbols (never linked at build time),
//! for the device backends (`device::acl`, `device::cuda`) and the profiler markers
//! (`profiling::mstx`).

use std::ffi::OsString;

use libloading::Library;

use crate::handle::DeviceError;

/// Where a candidate library path came from, for error messages.
pub(crate) struct Candidate {
    /// Path or bare name handed to the dynamic loader.
    pub path: OsString,
    /// How this candidate was chosen (e.g. "NPUALLOC_ACL_LIB").
    pub source: String,
}

/// A library's search order: the path in environment variable `var` alone when it is
/// set and not empty (explicit: nothing else is tried), else `search` in turn.
pub(crate) fn from_env_or(var: &str, search: Vec<Candidate>) -> (Vec<Candidate>, bool) {
    match std::env::var_os(var).filter(|p| !p.is_empty()) {
        Some(path) => (
            vec![Candidate {
                path,
                source: var.to_owned(),
            }],
            true,
        ),
        None => (search, false),
    }
}

/// Bare library names, for the dynamic loader's search path.
pub(crate) fn on_search_path(names: &[&str]) -> Vec<Candidate> {
    names
        .iter()
        .map(|n| Candidate {
            path: OsString::from(n),
            source: "the loader's search path".into(),
        })
        .collect()
}

/// `$ASCEND_HOME_PATH/<relative>`, when that variable is set (CANN's environment).
pub(crate) fn under_ascend_home(relative: &str) -> Option<Candidate> {
    std::env::var_os("ASCEND_HOME_PATH").map(|home| Candidate {
        path: std::path::PathBuf::from(home).join(relative).into(),
        source: "ASCEND_HOME_PATH".into(),
    })
}

/// Opens the first candidate that loads; the error lists every attempt.
///
/// An explicitly configured path (the first candidate, when `explicit`) is the only one
/// tried: a wrong path must be reported, not silently replaced by another library.
pub(crate) fn open(
    candidates: &[Candidate],
    explicit: bool,
) -> Result<(Library, String), DeviceError> {
    let mut tried = Vec::new();
    let list = if explicit {
        &candidates[..1]
    } else {
        candidates
    };
    for c in list {
        // SAFETY: loading a runtime library runs its initialisers; the libraries we load
        // (libascendcl, libcudart, their test fakes) are designed to be dlopen'ed.
        match unsafe { Library::new(&c.path) } {
            Ok(lib) => return Ok((lib, c.path.to_string_lossy().into_owned())),
            Err(e) => tried.push(format!(
                "'{}' (from {}): {e}",
                c.path.to_string_lossy(),
                c.source
            )),
        }
    }
    Err(DeviceError::Unavailable(format!(
        "cannot load the runtime library; tried {}",
        tried.join("; ")
    )))
}

/// Opens the library at `path` and nothing else (test aids' explicit paths).
pub(crate) fn open_path(path: &str) -> Result<(Library, String), DeviceError> {
    let c = [Candidate {
        path: path.into(),
        source: "an explicit path".into(),
    }];
    open(&c, true)
}

/// Resolves a required symbol; the error names it and the library.
///
/// # Safety
/// `T` must be the exact function-pointer type of the symbol.
pub(crate) unsafe fn required<T: Copy>(
    lib: &Library,
    lib_path: &str,
    name: &str,
) -> Result<T, DeviceError> {
    // SAFETY: forwarded to the caller (T is the symbol's true type).
    unsafe { optional(lib, name) }.ok_or_else(|| {
        DeviceError::Unavailable(format!(
            "required symbol {name} is missing from '{lib_path}'"
        ))
    })
}

/// Resolves an optional symbol.
///
/// # Safety
/// `T` must be the exact function-pointer type of the symbol.
pub(crate) unsafe fn optional<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller guarantees T is the symbol's type; the copied function pointer
    // stays valid while `lib` is loaded, and backends keep `lib` alive with the pointers.
    unsafe { lib.get::<T>(name.as_bytes()).ok().map(|s| *s) }
}
