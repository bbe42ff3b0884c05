//! Builds the fake ACL runtime (tests/fake_acl/fake_acl.c) and drives its test controls.

use std::ffi::{c_int, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use libloading::Library;

/// Counters of the fake (layout of `fake_acl_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub mallocs: u64,
    pub frees: u64,
    pub live_bytes: u64,
    pub events_created: u64,
    pub events_destroyed: u64,
    pub event_records: u64,
    pub violations: u64,
    pub set_device_calls: u64,
    pub synchronize_calls: u64,
    pub stream_waits: u64,
    pub init_calls: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub live_reservations: u64,
    pub live_physical: u64,
}

fn build_variant(flags: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let key = flags.join(" ");
    let mut built = BUILT.lock().unwrap();
    if let Some((_, p)) = built.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-acl-{}", built.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("libascendcl.so");
    crate::common::build_c_library("fake_acl/fake_acl.c", flags, &out);
    built.push((key, out.clone()));
    out
}

/// A private copy of the fake (its own globals), optionally built with `flags`.
pub fn fresh(flags: &[&str]) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let src = build_variant(flags);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dst = src.with_file_name(format!("libascendcl-{}-{n}.so", std::process::id()));
    std::fs::copy(&src, &dst).unwrap();
    dst.to_string_lossy().into_owned()
}

/// Test controls of one loaded fake.
pub struct Fake {
    lib: Library,
}

impl Fake {
    pub fn open(path: &str) -> Fake {
        // SAFETY: our own test library, loaded by the same path as the backend, so the
        // loader returns the same instance.
        Fake {
            lib: unsafe { Library::new(path) }.unwrap(),
        }
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the names and types below match tests/fake_acl/fake_acl.c.
        unsafe { *self.lib.get::<T>(name.as_bytes()).unwrap() }
    }

    pub fn create_stream(&self, device: c_int) -> usize {
        let f: unsafe extern "C" fn(c_int, *mut *mut c_void) -> c_int =
            self.sym("fake_acl_create_stream");
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(device, &mut s) }, 0);
        s as usize
    }

    pub fn launch(&self, device: c_int, stream: usize, n: u32) {
        let f: unsafe extern "C" fn(c_int, *mut c_void, u32) -> c_int = self.sym("fake_acl_launch");
        // SAFETY: a stream of the fake.
        assert_eq!(unsafe { f(device, stream as *mut c_void, n) }, 0);
    }

    pub fn complete(&self, device: c_int, stream: usize) {
        let f: unsafe extern "C" fn(c_int, *mut c_void) -> c_int = self.sym("fake_acl_complete");
        // SAFETY: a stream of the fake.
        assert_eq!(unsafe { f(device, stream as *mut c_void) }, 0);
    }

    pub fn counters(&self) -> Counters {
        let f: unsafe extern "C" fn(*mut Counters) = self.sym("fake_acl_get_counters");
        let mut c = Counters::default();
        // SAFETY: valid out-pointer of the fake's struct layout.
        unsafe { f(&mut c) };
        c
    }

    pub fn fail_next_malloc(&self, code: c_int) {
        let f: unsafe extern "C" fn(c_int) = self.sym("fake_acl_fail_next_malloc");
        // SAFETY: plain call.
        unsafe { f(code) }
    }

    pub fn set_capacity(&self, bytes: u64) {
        let f: unsafe extern "C" fn(u64) = self.sym("fake_acl_set_capacity");
        // SAFETY: plain call.
        unsafe { f(bytes) }
    }

    pub fn set_require_init(&self, on: bool) {
        let f: unsafe extern "C" fn(c_int) = self.sym("fake_acl_set_require_init");
        // SAFETY: plain call.
        unsafe { f(on as c_int) }
    }

    pub fn current_device(&self) -> c_int {
        let f: unsafe extern "C" fn() -> c_int = self.sym("fake_acl_current_device");
        // SAFETY: plain call.
        unsafe { f() }
    }

    pub fn force_device(&self, d: c_int) {
        let f: unsafe extern "C" fn(c_int) = self.sym("fake_acl_force_device");
        // SAFETY: plain call.
        unsafe { f(d) }
    }
}

/// A fake built once and shared, for tests that only need it to exist.
#[allow(dead_code)]
pub fn shared() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| fresh(&[]))
}
