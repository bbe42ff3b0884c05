//! Shared by the C ABI benchmark (`benches/abi.rs`) and the steady-state test
//! (`tests/abi_steady_state.rs`): loads `libnpualloc.so` with dlopen and calls
//! `npualloc_malloc` / `npualloc_free` through function pointers, as torch_npu's
//! NPUPluggableAllocator does; loads the PyTorch-style reference
//! (`benches/reference/pytorch_style.cpp`) the same way; and drives the size mixes.
//!
//! Each allocator gets its own copy of the library file (so its own globals: a
//! process-wide runtime reads its environment once) and its own copy of the fake ACL
//! runtime (`tests/fake_acl/fake_acl.c`), so device counters are its alone.

#![allow(dead_code)] // each user takes what it needs

use std::ffi::{c_int, c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use libloading::Library;

/// `npualloc_malloc`'s signature (and the reference's `ref_malloc`).
pub type MallocFn = unsafe extern "C" fn(usize, c_int, *mut c_void) -> *mut c_void;
/// `npualloc_free`'s signature (and the reference's `ref_free`).
pub type FreeFn = unsafe extern "C" fn(*mut c_void, usize, c_int, *mut c_void);

/// The sizes of issue #18: a window of 64 live blocks cycles through them.
pub const ISSUE_MIX: [usize; 8] = [
    512,
    4 << 10,
    64 << 10,
    1 << 20,
    4 << 20,
    8 << 20,
    1536,
    200_000,
];
/// Live blocks per window: each step frees the oldest and allocates the next size.
pub const WINDOW: usize = 64;
/// Length of the trace-derived mix.
pub const TRACE_MIX_LEN: usize = 4096;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `TRACE_MIX_LEN` sizes drawn (fixed seed) from the allocation sizes of every shipped
/// trace (`traces/*.trace`), each size weighted by how often the traces allocate it.
pub fn trace_mix() -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(repo_root().join("traces"))
        .expect("traces/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    files.sort();
    for f in files {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let mut w = line.split_whitespace();
            if w.next() == Some("a") {
                let size: usize = w.nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                if size > 0 {
                    sizes.push(size);
                }
            }
        }
    }
    assert!(!sizes.is_empty(), "no allocations in traces/*.trace");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..TRACE_MIX_LEN)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes[(x % sizes.len() as u64) as usize]
        })
        .collect()
}

/// Where built helper libraries go: next to the bench or test binary, one folder per
/// binary (a library file is never rewritten while another process has it loaded).
fn out_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
    let dir = exe.parent().unwrap().join(format!("abi-libs-{stem}"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed");
}

/// Builds `libnpualloc.so` with the profile of this binary (`cargo build -p
/// npualloc-ffi`, `--release` for benchmarks: test and bench targets do not build the
/// cdylib) and returns its path; `NPUALLOC_ABI_LIB` names a library built beforehand
/// instead (a machine without cargo: the binary, the library and a C/C++ compiler for
/// the fake runtime and the reference are all it needs).
pub fn build_npualloc() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(lib) = std::env::var_os("NPUALLOC_ABI_LIB") {
                return PathBuf::from(lib);
            }
            let exe = std::env::current_exe().unwrap();
            let profile_dir = exe.parent().unwrap().parent().unwrap();
            let target_dir = profile_dir.parent().unwrap();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-q", "-p", "npualloc-ffi", "--target-dir"])
                .arg(target_dir)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile_dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            run(&mut cmd);
            profile_dir.join("libnpualloc.so")
        })
        .clone()
}

/// Compiles the fake ACL runtime into `name` (a fresh file: its own globals).
fn build_fake(name: &str) -> PathBuf {
    let out = out_dir().join(name);
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-fvisibility=hidden"])
        .arg("-o")
        .arg(&out)
        .arg(repo_root().join("tests/fake_acl/fake_acl.c"))
        .arg("-lpthread"));
    out
}

/// Compiles the PyTorch-style reference allocator.
fn build_reference() -> PathBuf {
    let out = out_dir().join("libpytorch_style.so");
    run(Command::new("c++")
        .args([
            "-std=c++17",
            "-O2",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
        ])
        .arg("-o")
        .arg(&out)
        .arg(repo_root().join("benches/reference/pytorch_style.cpp"))
        .arg("-ldl"));
    out
}

/// Which allocator behind the ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// npualloc over the ACL backend and the fake ACL runtime.
    NpuallocAcl,
    /// npualloc over the simulated device (manual mode).
    NpuallocSim,
    /// The PyTorch-style reference over the fake ACL runtime.
    Reference,
    /// glibc's malloc and free (host memory; the floor of a host allocator).
    Glibc,
}

/// Device counters that must not move at steady state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCalls {
    /// Device allocations.
    pub mallocs: u64,
    /// Device frees.
    pub frees: u64,
    /// Events created.
    pub events_created: u64,
    /// Event records.
    pub event_records: u64,
    /// Misuses the fake or the simulator saw.
    pub violations: u64,
}

/// `fake_acl_counters` (tests/fake_acl/fake_acl.c).
#[repr(C)]
#[derive(Default)]
struct FakeCounters {
    v: [u64; 15],
}

/// `npualloc_sim_counters` (include/npualloc.h).
#[repr(C)]
#[derive(Default)]
struct SimCounters {
    v: [u64; 8],
}

/// One loaded allocator: its entry points, its streams and its device counters.
pub struct Allocator {
    /// Which one.
    pub kind: Kind,
    /// Its malloc.
    pub malloc: MallocFn,
    /// Its free.
    pub free: FreeFn,
    lib: Option<Library>,
    fake: Option<Library>,
    streams: [usize; 2],
}

// SAFETY: the libraries' entry points are thread-safe (npualloc's by its contract, the
// reference's behind its mutexes, the fake's behind its own).
unsafe impl Send for Allocator {}
// SAFETY: as above.
unsafe impl Sync for Allocator {}

fn sym<T: Copy>(lib: &Library, name: &str) -> T {
    // SAFETY: every name looked up here is declared with this type in
    // include/npualloc.h, tests/fake_acl/fake_acl.c or benches/reference.
    unsafe {
        *lib.get::<T>(name.as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

fn open(path: &Path) -> Library {
    // SAFETY: our own libraries, whose initialisers only set up their globals.
    unsafe { Library::new(path) }.unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Allocator {
    /// Loads a fresh instance. Sets environment variables: call before other threads
    /// use the environment (each user loads all it needs once, under a `OnceLock`).
    pub fn load(kind: Kind) -> Allocator {
        Allocator::load_with_conf(kind, "")
    }

    /// [`Allocator::load`] with npualloc settings (`NPUALLOC_CONF` syntax; ignored by
    /// the reference).
    pub fn load_with_conf(kind: Kind, conf: &str) -> Allocator {
        static LOADED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = LOADED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if kind == Kind::Glibc {
            return Allocator {
                kind,
                malloc: glibc_malloc,
                free: glibc_free,
                lib: None,
                fake: None,
                streams: [0; 2],
            };
        }
        let tag = format!("{}-{n}", format!("{kind:?}").to_lowercase());
        let fake_path =
            (kind != Kind::NpuallocSim).then(|| build_fake(&format!("libascendcl-{tag}.so")));
        std::env::set_var("FAKE_ACL_DEVICES", "1");
        std::env::set_var("FAKE_ACL_CAPACITY", (256u64 << 30).to_string());
        let lib = match kind {
            Kind::Reference => {
                let lib = open(&build_reference());
                let init: unsafe extern "C" fn(*const std::ffi::c_char) -> c_int =
                    sym(&lib, "ref_init");
                let path = CString::new(fake_path.as_ref().unwrap().to_str().unwrap()).unwrap();
                // SAFETY: a NUL-terminated path that outlives the call.
                assert_eq!(unsafe { init(path.as_ptr()) }, 0, "ref_init");
                lib
            }
            Kind::NpuallocAcl | Kind::NpuallocSim | Kind::Glibc => {
                let copy = out_dir().join(format!("libnpualloc-{tag}.so"));
                std::fs::copy(build_npualloc(), &copy).unwrap();
                if kind == Kind::NpuallocAcl {
                    std::env::set_var("NPUALLOC_BACKEND", "acl");
                    std::env::set_var("NPUALLOC_ACL_LIB", fake_path.as_ref().unwrap());
                } else {
                    std::env::set_var("NPUALLOC_BACKEND", "sim");
                    std::env::set_var("NPUALLOC_SIM_MODE", "manual");
                    std::env::set_var("NPUALLOC_SIM_CAPACITY", "256G");
                }
                std::env::set_var("NPUALLOC_CONF", conf);
                std::env::remove_var("NPUALLOC_TRACE");
                let lib = open(&copy);
                let init: unsafe extern "C" fn(c_int) = sym(&lib, "npualloc_init");
                // SAFETY: npualloc_init takes any device index.
                unsafe { init(0) };
                let count: unsafe extern "C" fn() -> c_int = sym(&lib, "npualloc_device_count");
                // SAFETY: no arguments.
                assert_eq!(unsafe { count() }, 1, "npualloc runtime did not start");
                lib
            }
        };
        let (m, f) = match kind {
            Kind::Reference => ("ref_malloc", "ref_free"),
            _ => ("npualloc_malloc", "npualloc_free"),
        };
        let mut a = Allocator {
            kind,
            malloc: sym(&lib, m),
            free: sym(&lib, f),
            fake: fake_path.map(|p| open(&p)),
            lib: Some(lib),
            streams: [0; 2],
        };
        a.streams = [a.create_stream(), a.create_stream()];
        a
    }

    /// Stream `i` (0 or 1) of the two created at load: every workload on this instance
    /// uses these, so no stream sits idle with cache another would borrow from.
    pub fn stream(&self, i: usize) -> usize {
        self.streams[i]
    }

    fn lib(&self) -> &Library {
        self.lib.as_ref().expect("a loaded library")
    }

    /// A new stream (the fake's `aclrtStream`, or a simulated stream).
    pub fn create_stream(&self) -> usize {
        if self.kind == Kind::Glibc {
            return 0;
        }
        let mut s: *mut c_void = std::ptr::null_mut();
        let rc = match &self.fake {
            Some(fake) => {
                let f: unsafe extern "C" fn(c_int, *mut *mut c_void) -> c_int =
                    sym(fake, "fake_acl_create_stream");
                // SAFETY: a valid out-pointer.
                unsafe { f(0, &mut s) }
            }
            None => {
                let f: unsafe extern "C" fn(c_int, *mut *mut c_void) -> c_int =
                    sym(self.lib(), "npualloc_sim_create_stream");
                // SAFETY: a valid out-pointer.
                unsafe { f(0, &mut s) }
            }
        };
        assert_eq!(rc, 0, "create stream");
        s as usize
    }

    /// The device counters so far.
    pub fn device_calls(&self) -> DeviceCalls {
        if self.kind == Kind::Glibc {
            return DeviceCalls::default();
        }
        match &self.fake {
            Some(fake) => {
                let f: unsafe extern "C" fn(*mut FakeCounters) = sym(fake, "fake_acl_get_counters");
                let mut c = FakeCounters::default();
                // SAFETY: a valid out-pointer to the struct's layout.
                unsafe { f(&mut c) };
                // mallocs, frees, live_bytes, events_created, events_destroyed,
                // event_records, violations, ...
                DeviceCalls {
                    mallocs: c.v[0] + c.v[11],
                    frees: c.v[1] + c.v[12],
                    events_created: c.v[3],
                    event_records: c.v[5],
                    violations: c.v[6],
                }
            }
            None => {
                let f: unsafe extern "C" fn(c_int, *mut SimCounters) -> c_int =
                    sym(self.lib(), "npualloc_sim_get_counters");
                let mut c = SimCounters::default();
                // SAFETY: a valid out-pointer to the struct's layout.
                assert_eq!(unsafe { f(0, &mut c) }, 0);
                // mallocs, frees, live_bytes, peak_bytes, events_created,
                // events_destroyed, event_records, violations
                DeviceCalls {
                    mallocs: c.v[0],
                    frees: c.v[1],
                    events_created: c.v[4],
                    event_records: c.v[6],
                    violations: c.v[7],
                }
            }
        }
    }
}

extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn free(p: *mut c_void);
}

unsafe extern "C" fn glibc_malloc(size: usize, _: c_int, _: *mut c_void) -> *mut c_void {
    // SAFETY: libc's malloc takes any size.
    unsafe { malloc(size) }
}

unsafe extern "C" fn glibc_free(p: *mut c_void, _: usize, _: c_int, _: *mut c_void) {
    // SAFETY: `p` came from glibc_malloc and is freed once (the caller's contract).
    unsafe { free(p) }
}

/// A window of `WINDOW` live blocks on one stream, cycling through a size mix.
pub struct Window<'a> {
    a: &'a Allocator,
    mix: &'a [usize],
    stream: usize,
    live: [(usize, usize); WINDOW],
    slot: usize,
    next: usize,
}

impl<'a> Window<'a> {
    /// Allocates the first `WINDOW` blocks of `mix` on `stream`.
    pub fn new(a: &'a Allocator, mix: &'a [usize], stream: usize) -> Window<'a> {
        let mut w = Window {
            a,
            mix,
            stream,
            live: [(0, 0); WINDOW],
            slot: 0,
            next: 0,
        };
        for i in 0..WINDOW {
            w.live[i] = w.alloc();
        }
        w
    }

    #[inline(always)]
    fn alloc(&mut self) -> (usize, usize) {
        let size = self.mix[self.next];
        self.next += 1;
        if self.next == self.mix.len() {
            self.next = 0;
        }
        // SAFETY: the allocator's malloc with a valid device and stream.
        let p = unsafe { (self.a.malloc)(size, 0, self.stream as *mut c_void) };
        assert!(!p.is_null(), "{:?}: malloc({size}) failed", self.a.kind);
        (p as usize, size)
    }

    /// Frees the oldest block and allocates the next size: one malloc+free pair.
    #[inline(always)]
    pub fn step(&mut self) {
        let (p, size) = self.live[self.slot];
        // SAFETY: `p` is a live allocation of this allocator, freed once.
        unsafe { (self.a.free)(p as *mut c_void, size, 0, self.stream as *mut c_void) };
        self.live[self.slot] = self.alloc();
        self.slot = (self.slot + 1) % WINDOW;
    }

    /// Steps `n` times.
    pub fn run(&mut self, n: u64) {
        for _ in 0..n {
            self.step();
        }
    }
}

impl Drop for Window<'_> {
    fn drop(&mut self) {
        for &(p, size) in &self.live {
            // SAFETY: live allocations of this allocator, each freed once.
            unsafe { (self.a.free)(p as *mut c_void, size, 0, self.stream as *mut c_void) };
        }
    }
}
