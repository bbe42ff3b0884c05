//! mstx markers against a fake libms_tools_ext.so that records every call.

use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libloading::Library;

use npualloc::device::sim::{InjectedFailure, SimConfig, SimDevice};
use npualloc::profiling::mstx::SENT_MESSAGE;
use npualloc::profiling::Mstx;
use npualloc::{CachingAllocator, Config, Error, StreamHandle};

use crate::common::MIB;

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    started: u64,
    ended: u64,
    bad_ends: u64,
    marks: u64,
    domain_calls: u64,
    max_len: u64,
}

struct Fake {
    path: String,
    lib: Library,
}

impl Fake {
    fn build(no_domain: bool) -> Fake {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-mstx");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join(format!("libms_tools_ext-{}-{n}.so", std::process::id()));
        let flags: &[&str] = if no_domain {
            &["-DFAKE_MSTX_NO_DOMAIN"]
        } else {
            &[]
        };
        crate::common::build_c_library("fake_mstx/fake_mstx.c", flags, &out);
        let path = out.to_string_lossy().into_owned();
        // SAFETY: our own test library.
        let lib = unsafe { Library::new(&path) }.unwrap();
        Fake { path, lib }
    }

    fn counts(&self) -> Counts {
        let mut c = Counts::default();
        // SAFETY: matches fake_mstx.c.
        unsafe {
            self.lib
                .get::<unsafe extern "C" fn(*mut Counts)>(b"fake_mstx_counts_get")
                .unwrap()(&mut c)
        };
        c
    }

    fn messages(&self) -> Vec<String> {
        // SAFETY: matches fake_mstx.c.
        let f = unsafe {
            *self
                .lib
                .get::<unsafe extern "C" fn(u64, *mut c_char, usize) -> i32>(b"fake_mstx_message")
                .unwrap()
        };
        let mut out = Vec::new();
        let mut buf = [0 as c_char; 200];
        // SAFETY: buf is writable for its length and NUL-terminated by the fake.
        while unsafe { f(out.len() as u64 + 1, buf.as_mut_ptr(), buf.len()) } == 0 {
            // SAFETY: NUL-terminated by the fake.
            out.push(
                unsafe { CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        out
    }

    fn domain(&self) -> String {
        // SAFETY: matches fake_mstx.c; returns a static buffer.
        let p = unsafe {
            self.lib
                .get::<unsafe extern "C" fn() -> *const c_char>(b"fake_mstx_domain_name")
                .unwrap()()
        };
        // SAFETY: NUL-terminated static buffer.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn fail_starts(&self, on: bool) {
        // SAFETY: matches fake_mstx.c.
        unsafe {
            self.lib
                .get::<unsafe extern "C" fn(i32)>(b"fake_mstx_fail_starts")
                .unwrap()(on as i32)
        };
    }
}

fn allocator(fake: &Fake, capacity: usize) -> (Arc<SimDevice>, CachingAllocator) {
    let sim = SimDevice::new(SimConfig {
        capacity,
        ..SimConfig::default()
    });
    let m = Arc::new(Mstx::load_from(&fake.path).unwrap());
    let a = CachingAllocator::new(
        sim.clone(),
        0,
        Config::parse("reclaim_before_growth:False").unwrap(),
    )
    .unwrap()
    .with_markers(m);
    (sim, a)
}

#[test]
fn slow_paths_open_and_close_named_ranges_in_the_npualloc_domain() {
    let fake = Fake::build(false);
    let (sim, a) = allocator(&fake, 1 << 30);
    let p = a.malloc(4096, StreamHandle::DEFAULT).unwrap();
    let after_first = fake.counts().started;
    // The fast path (cached block) opens nothing.
    for _ in 0..100 {
        a.free(p).unwrap();
        assert_eq!(a.malloc(4096, StreamHandle::DEFAULT).unwrap(), p);
    }
    assert_eq!(
        fake.counts().started,
        after_first,
        "the fast path called mstx"
    );
    let side = sim.create_stream(0).unwrap();
    a.record_stream(p, side).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    let msgs = fake.messages();
    for want in [
        "npualloc.device_malloc 2097152B dev0",
        "npualloc.cache_release dev0",
        "npualloc.event_sync 1 events dev0",
        "npualloc.device_free 2097152B dev0",
    ] {
        assert!(
            msgs.iter().any(|m| m == want),
            "missing {want:?} in {msgs:?}"
        );
    }
    let c = fake.counts();
    assert_eq!(c.started, c.ended, "a range was left open: {c:?}");
    assert_eq!(c.bad_ends, 0);
    assert_eq!(
        c.domain_calls, c.started,
        "ranges must go to the npualloc domain"
    );
    assert_eq!(fake.domain(), "npualloc");
}

#[test]
fn ranges_close_on_error_and_oom_paths() {
    let fake = Fake::build(false);
    let (sim, a) = allocator(&fake, 64 * MIB);
    sim.fail_nth_malloc(0, 1, InjectedFailure::RuntimeError);
    assert!(matches!(
        a.malloc(4096, StreamHandle::DEFAULT),
        Err(Error::Device(_))
    ));
    let big = a.malloc(40 * MIB, StreamHandle::DEFAULT).unwrap();
    assert!(matches!(
        a.malloc(40 * MIB, StreamHandle::DEFAULT),
        Err(Error::OutOfMemory { .. })
    ));
    a.free(big).unwrap();
    let msgs = fake.messages();
    assert!(
        msgs.iter()
            .any(|m| m == "npualloc.oom_retry 41943040B dev0"),
        "{msgs:?}"
    );
    let c = fake.counts();
    assert_eq!(c.started, c.ended, "{c:?}");
    assert_eq!(c.bad_ends, 0);
}

#[test]
fn global_domain_without_domain_functions_and_failed_starts() {
    let fake = Fake::build(true);
    let m = Mstx::load_from(&fake.path).unwrap();
    assert!(m.is_enabled() && !m.has_domain());
    let id = m
        .range_start("npualloc.test", StreamHandle::DEFAULT)
        .unwrap()
        .unwrap();
    m.range_end(id);
    m.mark("npualloc.mark", StreamHandle::DEFAULT).unwrap();
    fake.fail_starts(true);
    assert_eq!(
        m.range_start("npualloc.test", StreamHandle::DEFAULT),
        Ok(None)
    );
    drop(m.range(|| "npualloc.guarded".into())); // a failed start is never ended
    let c = fake.counts();
    assert_eq!(
        (c.started, c.ended, c.bad_ends, c.marks, c.domain_calls),
        (1, 1, 0, 1, 0)
    );
}

#[test]
fn long_messages_are_refused_or_cut() {
    let fake = Fake::build(false);
    let m = Mstx::load_from(&fake.path).unwrap();
    assert!(matches!(
        m.range_start(&"x".repeat(256), StreamHandle::DEFAULT),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        m.range_start("", StreamHandle::DEFAULT),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        m.mark("a\0b", StreamHandle::DEFAULT),
        Err(Error::InvalidArgument(_))
    ));
    let id = m
        .range_start(&"é".repeat(100), StreamHandle::DEFAULT)
        .unwrap()
        .unwrap();
    m.range_end(id);
    let c = fake.counts();
    assert_eq!(c.max_len as usize, SENT_MESSAGE);
    assert_eq!(fake.messages()[0], "é".repeat(78));
}

#[test]
fn absent_library_means_disabled_markers() {
    std::env::set_var("NPUALLOC_MSTX_LIB", "/nonexistent/libms_tools_ext.so");
    let m = Mstx::load();
    std::env::remove_var("NPUALLOC_MSTX_LIB");
    assert!(!m.is_enabled());
    assert_eq!(m.range_start("x", StreamHandle::DEFAULT), Ok(None));
}
