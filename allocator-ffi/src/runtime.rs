//! The process-wide runtime: the backend, one lazily created allocator per device, the
//! settings and the tag registry.
//!
//! Created on first use from the environment (read once): `NPUALLOC_BACKEND`
//! (`acl` | `cuda` | `sim`, default `acl`), `NPUALLOC_CONF` or else
//! `PYTORCH_NPU_ALLOC_CONF`, and for the simulated device `NPUALLOC_SIM_CAPACITY`
//! (bytes, `K`/`M`/`G` suffixes; default 64G), `NPUALLOC_SIM_DEVICES` (default 1) and
//! `NPUALLOC_SIM_MODE` (`threaded` | `manual`, default `threaded`); `NPUALLOC_TRACE`
//! (record a trace of every call to that file).

use std::ffi::c_int;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use npualloc_core::device::acl::AclDevice;
use npualloc_core::device::cuda::CudaDevice;
use npualloc_core::device::sim::{SimConfig, SimDevice, SimMode};
use npualloc_core::{CachingAllocator, Config, Device, Error};

use crate::error::*;
use crate::hooks::{npualloc_runtime_hooks, HookedDevice};
use crate::record::Recorder;
use crate::tag_registry::TagRegistry;

/// What can be set before the runtime exists.
#[derive(Default)]
struct PreInit {
    config: Option<Config>,
    hooks: Option<npualloc_runtime_hooks>,
}

// SAFETY: the hooks' context pointer is only handed back to the host's hook functions,
// which are documented to be callable from any thread.
unsafe impl Send for PreInit {}

static PRE: Mutex<PreInit> = Mutex::new(PreInit {
    config: None,
    hooks: None,
});
static RUNTIME: OnceLock<Result<Runtime, Failure>> = OnceLock::new();

/// The live runtime.
pub(crate) struct Runtime {
    /// The trace recorder (`NPUALLOC_TRACE`), read here on the malloc/free path: one
    /// load from the runtime instead of a second `OnceLock`.
    pub recorder: Option<&'static Recorder>,
    pub backend: Arc<dyn Device>,
    pub sim: Option<Arc<SimDevice>>,
    config: Mutex<Config>,
    /// `per_process_memory_fraction` from `PYTORCH_NPU_ALLOC_CONF`, set on each allocator.
    memory_fraction: Option<f64>,
    allocators: Box<[OnceLock<CachingAllocator>]>,
    pub tags: TagRegistry,
}

/// Parses `64G`, `512M`, `1024K` or plain bytes.
pub(crate) fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1usize << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        'T' | 't' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn unavailable(e: npualloc_core::DeviceError) -> Failure {
    Failure::new(NPUALLOC_ERR_BACKEND_UNAVAILABLE, e.to_string())
}

fn invalid(msg: String) -> Failure {
    Failure::new(NPUALLOC_ERR_INVALID_ARGUMENT, msg)
}

fn sim_from_env() -> Result<Arc<SimDevice>, Failure> {
    let capacity = match env("NPUALLOC_SIM_CAPACITY") {
        Some(v) => parse_bytes(&v).filter(|&n| n > 0).ok_or_else(|| {
            invalid(format!(
                "NPUALLOC_SIM_CAPACITY='{v}' is not a size such as 64G or 1073741824"
            ))
        })?,
        None => 64 << 30,
    };
    let devices = match env("NPUALLOC_SIM_DEVICES") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=64).contains(n))
            .ok_or_else(|| {
                invalid(format!(
                    "NPUALLOC_SIM_DEVICES='{v}' is not a count from 1 to 64"
                ))
            })?,
        None => 1,
    };
    let mode = match env("NPUALLOC_SIM_MODE").as_deref() {
        None | Some("threaded") => SimMode::Threaded,
        Some("manual") => SimMode::Manual,
        Some(v) => {
            return Err(invalid(format!(
                "NPUALLOC_SIM_MODE='{v}' is not 'threaded' or 'manual'"
            )))
        }
    };
    Ok(SimDevice::new(SimConfig {
        devices,
        capacity,
        backed: false,
        mode,
        ..SimConfig::default()
    }))
}

impl Runtime {
    fn create() -> Result<Runtime, Failure> {
        crate::record::init()?;
        let pre = std::mem::take(&mut *PRE.lock());
        let mut memory_fraction = None;
        let config = match (
            pre.config,
            env("NPUALLOC_CONF"),
            env("PYTORCH_NPU_ALLOC_CONF"),
        ) {
            (Some(c), _, _) => c,
            (None, Some(s), _) => Config::parse(&s).map_err(Failure::from)?,
            (None, None, Some(s)) => {
                let t = Config::parse_torch_npu(&s).map_err(|e| {
                    let f = Failure::from(e);
                    Failure::new(f.code, format!("PYTORCH_NPU_ALLOC_CONF: {}", f.message))
                })?;
                if !t.ignored.is_empty() {
                    // Once: the runtime is created once per process.
                    eprintln!(
                        "npualloc: PYTORCH_NPU_ALLOC_CONF: ignoring {} (torch_npu settings \
                         without meaning for npualloc)",
                        t.ignored.join(", ")
                    );
                }
                memory_fraction = t.memory_fraction;
                t.config
            }
            (None, None, None) => Config::default(),
        };
        let backend_name = env("NPUALLOC_BACKEND").unwrap_or_else(|| "acl".into());
        let (backend, sim): (Arc<dyn Device>, _) = match backend_name.as_str() {
            "sim" => {
                let sim = sim_from_env()?;
                (sim.clone(), Some(sim))
            }
            "acl" => (Arc::new(AclDevice::load().map_err(unavailable)?), None),
            "cuda" => (Arc::new(CudaDevice::load().map_err(unavailable)?), None),
            other => {
                return Err(invalid(format!(
                    "NPUALLOC_BACKEND='{other}' is not one of acl, cuda, sim"
                )))
            }
        };
        let backend: Arc<dyn Device> = match pre.hooks {
            Some(h) => Arc::new(HookedDevice::new(backend, h)),
            None => backend,
        };
        let count = backend.device_count();
        Ok(Runtime {
            recorder: crate::record::recorder(),
            backend,
            sim,
            config: Mutex::new(config),
            memory_fraction,
            allocators: (0..count).map(|_| OnceLock::new()).collect(),
            tags: TagRegistry::default(),
        })
    }

    /// The device count.
    pub fn device_count(&self) -> usize {
        self.allocators.len()
    }

    /// Checks a C device index.
    pub fn check_device(&self, device: c_int) -> Result<usize, Failure> {
        if device < 0 || device as usize >= self.allocators.len() {
            return Err(Error::InvalidDevice {
                device: device.into(),
                count: self.allocators.len(),
            }
            .into());
        }
        Ok(device as usize)
    }

    /// The allocator of `device`, created on first use. Inlined into the entry points:
    /// once created, it is one bounds check and one load (no `check_device`, no
    /// `Result` built out of line).
    #[inline]
    pub fn allocator(&self, device: c_int) -> Result<&CachingAllocator, Failure> {
        // A negative `device` becomes a huge index: not found, reported by the slow path.
        match self.allocators.get(device as usize).and_then(OnceLock::get) {
            Some(a) => Ok(a),
            None => self.create_allocator(device),
        }
    }

    /// Checks `device` and creates its allocator (or returns the one another thread
    /// created meanwhile).
    #[cold]
    #[inline(never)]
    fn create_allocator(&self, device: c_int) -> Result<&CachingAllocator, Failure> {
        let d = self.check_device(device)?;
        if let Some(a) = self.allocators[d].get() {
            return Ok(a);
        }
        // Creation can fail (settings the backend cannot honour, such as expandable
        // segments without virtual memory): report it, and try again on the next call.
        let config = self.config.lock().clone();
        let a = CachingAllocator::new(self.backend.clone(), d as i64, config)?;
        if let Some(f) = self.memory_fraction {
            a.set_memory_fraction(f)?;
        }
        a.attach_oom_observer(call_oom_observer);
        // Another thread may have won the race; its allocator (as yet unused) is kept.
        let _ = self.allocators[d].set(a);
        let a = self.allocators[d]
            .get()
            .expect("set by this thread or another");
        // After it is published: a tracer set meanwhile reaches it either way.
        if let Some(t) = crate::history::current() {
            a.set_tracer(Some(t));
        }
        Ok(a)
    }

    /// The allocator of `device` if it exists (no creation).
    #[inline]
    pub fn existing_allocator(&self, device: c_int) -> Option<&CachingAllocator> {
        // A negative `device` becomes a huge index: none.
        self.allocators.get(device as usize).and_then(OnceLock::get)
    }

    /// Allocators created so far.
    pub fn existing(&self) -> impl Iterator<Item = &CachingAllocator> {
        self.allocators.iter().filter_map(|a| a.get())
    }

    /// Replaces the settings; only before any allocator exists.
    pub fn configure(&self, config: Config) -> Result<(), Failure> {
        let mut c = self.config.lock();
        if self.existing().next().is_some() {
            return Err(Failure::new(
                NPUALLOC_ERR_INVALID_STATE,
                "settings cannot change after the first allocation",
            ));
        }
        *c = config;
        Ok(())
    }

    /// The allocator holding `ptr` as a live allocation, trying `hint` first.
    pub fn owner_of(&self, ptr: usize, hint: Option<c_int>) -> Option<&CachingAllocator> {
        let hinted = hint
            .and_then(|d| self.check_device(d).ok())
            .and_then(|d| self.allocators[d].get());
        hinted
            .into_iter()
            .chain(self.existing())
            .find(|a| a.owns(ptr))
    }
}

/// The runtime, created on first call.
pub(crate) fn runtime() -> Result<&'static Runtime, Failure> {
    RUNTIME
        .get_or_init(Runtime::create)
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether the runtime already exists (settings and hooks are then fixed).
pub(crate) fn started() -> bool {
    RUNTIME.get().is_some()
}

/// Stores settings for the runtime, or applies them if no allocator exists yet.
pub(crate) fn configure(config: Config) -> Result<(), Failure> {
    if let Some(rt) = RUNTIME.get() {
        return rt.as_ref().map_err(Clone::clone)?.configure(config);
    }
    PRE.lock().config = Some(config);
    Ok(())
}

/// Stores runtime hooks; only before the runtime exists.
pub(crate) fn set_hooks(hooks: Option<npualloc_runtime_hooks>) -> Result<(), Failure> {
    if started() {
        return Err(Failure::new(
            NPUALLOC_ERR_INVALID_STATE,
            "runtime hooks must be set before the first allocation or init",
        ));
    }
    PRE.lock().hooks = hooks;
    Ok(())
}

/// The C out-of-memory observer (`npualloc_set_oom_observer`) as an address; 0 = none.
static OOM_OBSERVER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Calls the C out-of-memory observer, if one is set.
fn call_oom_observer(info: npualloc_core::OomInfo) {
    let f = OOM_OBSERVER.load(std::sync::atomic::Ordering::Acquire);
    if f != 0 {
        // SAFETY: the only non-zero values stored are `extern "C" fn` pointers of exactly
        // this type, set by npualloc_set_oom_observer.
        let f: extern "C" fn(c_int, usize, usize, usize) = unsafe { std::mem::transmute(f) };
        f(
            info.device as c_int,
            info.requested,
            info.capacity,
            info.free,
        );
    }
}

/// Sets (or, with `None`, removes) the C out-of-memory observer.
pub(crate) fn set_oom_observer(observer: Option<extern "C" fn(c_int, usize, usize, usize)>) {
    OOM_OBSERVER.store(
        observer.map_or(0, |f| f as usize),
        std::sync::atomic::Ordering::Release,
    );
}
