//! The panic boundary every exported function runs in.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use npualloc_core::allocator::boundary_depth;

use crate::error::{set_last_error, Failure, NPUALLOC_ERR_PANIC, NPUALLOC_OK};

/// Keeps panics inside the boundary silent (the message goes to the last error);
/// panics elsewhere in the process still reach the previous hook.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if boundary_depth(0) == 0 {
                previous(info);
            }
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Runs `f`, turning a panic into `on_panic` plus a last-error message. The depth of
/// nested boundaries is kept per thread in the allocator's own thread-local state
/// (`boundary_depth`): in a shared library each thread-local is a `__tls_get_addr`
/// call, and `npualloc_malloc` reaches that state anyway (issue #18).
pub(crate) fn boundary<T>(function: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    install_quiet_hook();
    boundary_depth(1);
    let result = catch_unwind(AssertUnwindSafe(f));
    boundary_depth(-1);
    match result {
        Ok(v) => v,
        Err(payload) => {
            set_last_error(
                function,
                &format!("internal panic: {}", panic_message(&*payload)),
            );
            on_panic
        }
    }
}

/// Runs a fallible `f` in the boundary and returns its `NPUALLOC_*` code.
pub(crate) fn code(function: &str, f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    boundary(function, NPUALLOC_ERR_PANIC, || match f() {
        Ok(()) => NPUALLOC_OK,
        Err(e) => {
            set_last_error(function, &e.message);
            e.code
        }
    })
}

/// Runs a fallible `f` for a function without a status return: failures become
/// `fallback` and a last-error message.
pub(crate) fn or_default<T: Copy>(
    function: &str,
    fallback: T,
    f: impl FnOnce() -> Result<T, Failure>,
) -> T {
    boundary(function, fallback, || match f() {
        Ok(v) => v,
        Err(e) => {
            set_last_error(function, &e.message);
            fallback
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::npualloc_last_error;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is NULL-checked and valid until the next failing call.
        unsafe { CStr::from_ptr(npualloc_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn panics_become_codes_and_messages() {
        let rc = code("npualloc_test", || panic!("boom {}", 7));
        assert_eq!(rc, NPUALLOC_ERR_PANIC);
        assert_eq!(last(), "npualloc_test: internal panic: boom 7");
        let v = or_default("npualloc_test2", 5usize, || -> Result<usize, Failure> {
            panic!("x")
        });
        assert_eq!(v, 5);
        assert!(last().starts_with("npualloc_test2: internal panic"));
        // Successful calls keep the last error.
        assert_eq!(code("ok", || Ok(())), NPUALLOC_OK);
        assert!(last().starts_with("npualloc_test2"));
    }
}
