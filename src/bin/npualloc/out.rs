//! Where the tool writes, and how a command stops.
//!
//! Results go to stdout through [`print`]. A reader that closes the pipe early
//! (`npualloc replay ... | head`) makes the next write fail with `BrokenPipe`; [`print`]
//! turns that into [`Stop::Closed`], which ends the command at once with status 0 and
//! no message: nobody is left to read the rest. (Coreutils leave SIGPIPE at its default
//! and die of it, status 141 under a shell; a Rust program ignores SIGPIPE, so the
//! write fails instead, and `println!` would panic on it.)
//!
//! Messages go to stderr through [`note!`], which drops a message it cannot write
//! rather than fail: a closed stderr is no reason to stop a replay.

use std::io::{ErrorKind, Write};

/// Why a command stopped before its end.
#[derive(Debug)]
pub enum Stop {
    /// An error to report (exit status 2).
    Error(String),
    /// stdout was closed by its reader: end quietly (exit status 0).
    Closed,
}

impl From<String> for Stop {
    fn from(e: String) -> Self {
        Stop::Error(e)
    }
}

/// Writes `text` to stdout and flushes it.
pub fn print(text: impl AsRef<[u8]>) -> Result<(), Stop> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_ref())
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            ErrorKind::BrokenPipe => Stop::Closed,
            _ => Stop::Error(format!("cannot write to stdout: {e}")),
        })
}

/// Writes a line to stderr; a failed write is dropped.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use note;
