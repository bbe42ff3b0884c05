//! The ACL backend against the fake ACL runtime: symbol probing, error mapping, the
//! device-per-call rule, and the allocator's full cycle over real loading code.

use std::sync::Arc;

use npualloc::device::acl::AclDevice;
use npualloc::device::DeviceError;
use npualloc::{CachingAllocator, Config, Device, Error, StreamHandle};

use crate::common::MIB;
use crate::fake_acl::{fresh, Fake};

fn allocator(path: &str) -> (Arc<AclDevice>, CachingAllocator) {
    let dev = Arc::new(AclDevice::load_from(path).unwrap());
    let a = CachingAllocator::new(dev.clone(), 0, Config::default()).unwrap();
    (dev, a)
}

#[test]
fn full_library_has_every_feature() {
    let path = fresh(&[]);
    let dev = AclDevice::load_from(&path).unwrap();
    let f = dev.features();
    assert!(f.malloc_align32 && f.query_event_status && f.event_ex && f.virtual_memory);
    assert!(dev.notes().is_empty(), "{:?}", dev.notes());
    assert_eq!(dev.vm_granularity(0).unwrap(), 2 * MIB);
    assert_eq!(dev.device_count(), 2);
    assert_eq!(dev.request_padding(), 32);
}

#[test]
fn missing_optional_symbol_turns_the_feature_off() {
    let path = fresh(&["-DFAKE_NO_QUERY_EVENT_STATUS", "-DFAKE_NO_ALIGN32"]);
    let fake = Fake::open(&path);
    let (dev, a) = allocator(&path);
    assert!(!dev.features().query_event_status);
    assert!(!dev.features().malloc_align32);
    assert!(dev.notes().iter().any(|n| n.contains("aclrtQueryEvent")));
    // The fallbacks work: aclrtQueryEvent's inverted status and aclrtMalloc's padding.
    let side = fake.create_stream(0);
    let p = a.malloc(4096, StreamHandle::DEFAULT).unwrap();
    a.record_stream(p, StreamHandle(side)).unwrap();
    fake.launch(0, side, 1);
    a.free(p).unwrap();
    assert_ne!(a.malloc(4096, StreamHandle::DEFAULT).unwrap(), p);
    fake.complete(0, side);
    assert_eq!(a.malloc(4096, StreamHandle::DEFAULT).unwrap(), p);
    assert_eq!(
        fake.counters().live_bytes,
        2 * MIB as u64 + 32,
        "aclrtMalloc pads by 32"
    );
    assert_eq!(fake.counters().violations, 0);
}

#[test]
fn missing_required_symbol_names_it() {
    let path = fresh(&["-DFAKE_NO_FREE"]);
    let err = AclDevice::load_from(&path).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Unavailable(m) if m.contains("aclrtFree") && m.contains(&path)),
        "{err}"
    );
}

#[test]
fn nonexistent_path_names_path_and_variable() {
    let bogus = "/nonexistent/libascendcl.so";
    std::env::set_var("NPUALLOC_ACL_LIB", bogus);
    let err = AclDevice::load().unwrap_err().to_string();
    std::env::remove_var("NPUALLOC_ACL_LIB");
    assert!(
        err.contains(bogus) && err.contains("NPUALLOC_ACL_LIB"),
        "{err}"
    );
}

#[test]
fn acl_init_only_when_the_runtime_asks() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let _ = AclDevice::load_from(&path).unwrap();
    assert_eq!(fake.counters().init_calls, 0);
    let path2 = fresh(&[]);
    let fake2 = Fake::open(&path2);
    fake2.set_require_init(true);
    let dev = AclDevice::load_from(&path2).unwrap();
    assert_eq!(fake2.counters().init_calls, 1);
    assert_eq!(dev.device_count(), 2);
}

#[test]
fn full_cycle_on_the_fake_with_zero_violations() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let (_dev, a) = allocator(&path);
    let side = StreamHandle(fake.create_stream(0));
    let ps: Vec<_> = [100, 3 * MIB, 30 * MIB]
        .iter()
        .map(|&n| a.malloc(n, StreamHandle::DEFAULT).unwrap())
        .collect();
    // 100 + 32 bytes of padding rounds to 512.
    assert_eq!(a.stats().allocated_bytes[1].current, 512);
    a.record_stream(ps[1], side).unwrap();
    fake.launch(0, side.0, 5);
    for &p in &ps {
        a.free(p).unwrap();
    }
    a.check_invariants().unwrap();
    let again = a.malloc(3 * MIB, StreamHandle::DEFAULT).unwrap();
    assert_ne!(again, ps[1], "reused before the side stream completed");
    fake.complete(0, side.0);
    let reused = a.malloc(3 * MIB, StreamHandle::DEFAULT).unwrap();
    assert_eq!(reused, ps[1]);
    a.free(again).unwrap();
    a.free(reused).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    let c = fake.counters();
    assert_eq!(
        c.live_bytes, 0,
        "empty_cache must aclrtFree every segment: {c:?}"
    );
    assert_eq!(c.mallocs, c.frees);
    assert_eq!(c.events_created, c.events_destroyed);
    assert_eq!(c.event_records, 1);
    assert_eq!(c.violations, 0, "{c:?}");
}

#[test]
fn oom_code_triggers_release_and_retry() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let (_dev, a) = allocator(&path);
    let p = a.malloc(30 * MIB, StreamHandle::DEFAULT).unwrap();
    a.free(p).unwrap();
    fake.fail_next_malloc(207001);
    let q = a.malloc(40 * MIB, StreamHandle::DEFAULT).unwrap();
    let s = a.stats();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(
        s.num_device_free, 1,
        "the cached segment was released before the retry"
    );
    for code in [207018, 200000] {
        fake.fail_next_malloc(code);
        let r = a.malloc(50 * MIB, StreamHandle::DEFAULT).unwrap();
        a.free(r).unwrap();
        a.empty_cache().unwrap(); // the next request must reach the device again
    }
    assert_eq!(a.stats().num_alloc_retries, 3);
    // Capacity exhausted: a real OOM with the device's own numbers.
    fake.set_capacity(64 * MIB as u64);
    let err = a.malloc(60 * MIB, StreamHandle::DEFAULT).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(
        err.to_string().contains("total capacity of 64.00 MiB"),
        "{err}"
    );
    a.free(q).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(fake.counters().violations, 0);
}

#[test]
fn other_error_codes_carry_code_and_message() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let (_dev, a) = allocator(&path);
    fake.fail_next_malloc(507899);
    let err = a
        .malloc(4096, StreamHandle::DEFAULT)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("aclrtMallocAlign32") && err.contains("507899"),
        "{err}"
    );
    assert!(
        err.contains("injected failure 507899"),
        "aclGetRecentErrMsg text missing: {err}"
    );
    a.check_invariants().unwrap();
    assert_eq!(a.stats().num_device_alloc, 0);
}

#[test]
fn callers_current_device_is_restored() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let dev = Arc::new(AclDevice::load_from(&path).unwrap());
    let a1 = CachingAllocator::new(dev.clone(), 1, Config::default()).unwrap();
    fake.force_device(0);
    let p = a1.malloc(4096, StreamHandle::DEFAULT).unwrap();
    assert_eq!(
        fake.current_device(),
        0,
        "the allocator left device 1 current"
    );
    let side = StreamHandle(fake.create_stream(1));
    a1.record_stream(p, side).unwrap();
    a1.free(p).unwrap(); // the event is created and recorded on device 1
    a1.empty_cache().unwrap();
    assert_eq!(fake.current_device(), 0);
    assert_eq!(fake.counters().violations, 0, "{:?}", fake.counters());
    assert_eq!(fake.counters().live_bytes, 0);
}

fn expandable(path: &str) -> (Arc<AclDevice>, CachingAllocator) {
    let dev = Arc::new(AclDevice::load_from(path).unwrap());
    // Fixed 20 MiB pages (the assertions count them), as PyTorch's.
    let conf = Config::parse("expandable_segments:True,adaptive_pages:False").unwrap();
    let a = CachingAllocator::new(dev.clone(), 0, conf).unwrap();
    (dev, a)
}

#[test]
fn expandable_segments_map_and_unmap_through_the_runtime() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let (_dev, a) = expandable(&path);
    let x = a.malloc(30 * MIB, StreamHandle::DEFAULT).unwrap();
    let y = a.malloc(15 * MIB, StreamHandle::DEFAULT).unwrap();
    assert_eq!(y, x + 30 * MIB + 512, "pages did not extend the run");
    let c = fake.counters();
    assert_eq!((c.maps, c.live_physical, c.live_reservations), (3, 3, 1));
    assert_eq!(c.live_bytes, 60 * MIB as u64);
    // The memory is usable from the host in the fake (mapped read-write).
    // SAFETY: `x` is a live 30 MiB mapping in this process (the fake backs it).
    unsafe { std::ptr::write_bytes(x as *mut u8, 7, 30 * MIB) };
    // Work still queued on the stream when the cache is emptied: the unmap must wait.
    fake.launch(0, 0, 3);
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    let c = fake.counters();
    assert_eq!(c.violations, 0, "unmapped under queued work, or misuse");
    assert_eq!((c.unmaps, c.live_physical, c.live_reservations), (3, 0, 0));
    assert_eq!(c.live_bytes, 0);
    a.check_invariants().unwrap();
}

#[test]
fn expandable_out_of_memory_is_recovered_then_reported() {
    let path = fresh(&[]);
    let fake = Fake::open(&path);
    let (_dev, a) = expandable(&path);
    fake.set_capacity(100 * MIB as u64);
    let side = fake.create_stream(0);
    let x = a.malloc(60 * MIB, StreamHandle(side)).unwrap();
    a.free(x).unwrap();
    // Stream 0 needs the pages stream `side` caches: they are unmapped and mapped again.
    let y = a.malloc(80 * MIB, StreamHandle::DEFAULT).unwrap();
    let err = a.malloc(40 * MIB, StreamHandle::DEFAULT).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    a.check_invariants().unwrap();
    a.free(y).unwrap();
    a.empty_cache().unwrap();
    let c = fake.counters();
    assert_eq!(c.violations, 0);
    assert_eq!(
        (c.live_physical, c.live_reservations, c.live_bytes),
        (0, 0, 0)
    );
}

#[test]
fn expandable_is_refused_without_the_virtual_memory_functions() {
    let path = fresh(&["-DFAKE_NO_VMM"]);
    let dev = Arc::new(AclDevice::load_from(&path).unwrap());
    assert!(!dev.features().virtual_memory);
    assert!(dev
        .notes()
        .iter()
        .any(|n| n.contains("aclrtMallocPhysical")));
    let conf = Config::parse("expandable_segments:True").unwrap();
    let err = CachingAllocator::new(dev.clone(), 0, conf)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("aclrtMallocPhysical") && err.contains("expandable_segments"),
        "{err}"
    );
    // Ordinary segments still work on that library.
    let a = CachingAllocator::new(dev, 0, Config::default()).unwrap();
    let p = a.malloc(MIB, StreamHandle::DEFAULT).unwrap();
    a.free(p).unwrap();
}
