//! Bad input: every misuse is a typed error and the allocator stays consistent.

use std::sync::Arc;

use npualloc::device::sim::{SimConfig, SimDevice};
use npualloc::{CachingAllocator, Config, Error, StreamHandle};

use crate::common::*;

const S0: StreamHandle = StreamHandle::DEFAULT;

#[test]
fn unknown_and_double_freed_pointers() {
    let (sim, a) = manual(1 << 30);
    let p = a.malloc(4096, S0).unwrap();
    assert_eq!(
        a.free(0xdead_beef),
        Err(Error::UnknownPointer { ptr: 0xdead_beef })
    );
    assert_eq!(a.free(p + 512), Err(Error::UnknownPointer { ptr: p + 512 }));
    a.free(p).unwrap();
    assert_eq!(a.free(p), Err(Error::UnknownPointer { ptr: p }));
    assert_eq!(
        a.record_stream(p, S0),
        Err(Error::UnknownPointer { ptr: p })
    );
    assert_eq!(a.erase_stream(p, S0), Err(Error::UnknownPointer { ptr: p }));
    check(&a);
    assert_eq!(a.stats().allocation[0].freed, 1);
    assert_drained(&sim, &a);
}

#[test]
fn zero_and_huge_sizes() {
    let (sim, a) = manual(1 << 30);
    assert_eq!(a.malloc(0, S0), Err(Error::ZeroSize));
    for n in [usize::MAX, usize::MAX - 511, usize::MAX / 2, (1 << 60) + 1] {
        assert_eq!(
            a.malloc(n, S0),
            Err(Error::SizeTooLarge { requested: n }),
            "{n}"
        );
    }
    // Representable but larger than the device: a reported OOM after a retry.
    let err = a.malloc(1 << 40, S0).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == 1 << 40));
    check(&a);
    assert_eq!(a.stats().num_ooms, 1);
    assert_drained(&sim, &a);
}

#[test]
fn unknown_streams_are_rejected() {
    let (sim, a) = manual(1 << 30);
    let bogus = StreamHandle(0x7777);
    assert!(matches!(
        a.malloc(4096, bogus),
        Err(Error::UnknownStream { .. })
    ));
    let p = a.malloc(4096, S0).unwrap();
    assert!(matches!(
        a.record_stream(p, bogus),
        Err(Error::UnknownStream { .. })
    ));
    a.free(p).unwrap();
    assert_eq!(sim.counters(0).event_records, 0);
    assert_drained(&sim, &a);
}

#[test]
fn invalid_devices_and_arguments() {
    let sim: Arc<SimDevice> = SimDevice::new(SimConfig {
        devices: 2,
        ..SimConfig::default()
    });
    for bad in [-1i64, 2, i64::MAX] {
        let err = CachingAllocator::new(sim.clone(), bad, Config::default()).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidDevice {
                device: bad,
                count: 2
            }
        );
    }
    let a = CachingAllocator::new(sim.clone(), 1, Config::default()).unwrap();
    for f in [-0.1, 1.5, f64::NAN] {
        assert!(
            matches!(a.set_memory_fraction(f), Err(Error::InvalidArgument(_))),
            "{f}"
        );
    }
    // Device 1's memory is separate from device 0's.
    let p = a.malloc(4096, S0).unwrap();
    assert_eq!(sim.counters(1).live_bytes, 2 * MIB);
    assert_eq!(sim.counters(0).live_bytes, 0);
    a.free(p).unwrap();
    check(&a);
}

#[test]
fn malformed_config_names_the_key() {
    let err = Config::parse("max_split_size_mb:abc").unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("max_split_size_mb")),
        "{err}"
    );
    let err = Config::parse("no_such_key:1").unwrap_err();
    assert!(err.to_string().contains("no_such_key"), "{err}");
}
