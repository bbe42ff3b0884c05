//! The invariant checker: recounts everything from the blocks and compares.

use std::collections::HashMap;

use super::graph_pools::GraphPools;
use super::shard::ShardState;
use super::shards::Shard;
use crate::handle::MempoolId;
use crate::pool::{Block, BlockId, Phase, PoolKind};
use crate::stats::{PrivatePoolStats, StatArray, StatType};
use crate::stream::UNFENCED;

#[derive(Default)]
struct Recount {
    allocation: [i64; 3],
    allocated_bytes: [i64; 3],
    active: [i64; 3],
    active_bytes: [i64; 3],
    requested_bytes: [i64; 3],
    segment: [i64; 3],
    reserved_bytes: [i64; 3],
    inactive_split: [i64; 3],
    inactive_split_bytes: [i64; 3],
}

fn add(a: &mut [i64; 3], kind: PoolKind, v: usize) {
    a[0] += v as i64;
    a[kind.stat_type() as usize] += v as i64;
}

fn compare(name: &str, stat: &StatArray, counted: &[i64; 3]) -> Result<(), String> {
    for t in [
        StatType::Aggregate,
        StatType::SmallPool,
        StatType::LargePool,
    ] {
        let (have, want) = (stat[t as usize].current, counted[t as usize]);
        if have != want {
            return Err(format!(
                "stat {name}[{t:?}] is {have}, recount gives {want}"
            ));
        }
    }
    Ok(())
}

/// Checks the device-wide reserved bytes per private pool against the bytes of each
/// pool's blocks over every shard (a pool's blocks tile its segments or mapped pages).
pub(super) fn check_private_pools(
    shards: &[&Shard],
    pools: &[PrivatePoolStats],
) -> Result<(), String> {
    let mut counted: HashMap<MempoolId, [i64; 3]> = HashMap::new();
    for s in shards {
        let st = s.lock();
        for (_, b) in st.blocks.iter() {
            if let Some(t) = b.pool {
                let id = st.capture.id_of(t);
                add(counted.entry(id).or_default(), b.kind, b.size);
            }
        }
    }
    for p in pools {
        let want = counted.remove(&p.id).unwrap_or_default();
        compare(
            &format!("reserved_bytes_by_private_pools[{:?}]", p.id),
            &p.reserved_bytes,
            &want,
        )?;
    }
    match counted.keys().next() {
        Some(id) => Err(format!(
            "private pool {id:?} holds memory but has no statistics"
        )),
        None => Ok(()),
    }
}

/// Checks the device-wide pool registry against the shards: every live pool has a
/// use; each shard's pool tags name distinct pools; a route names a known tag; an
/// HCCL work is remembered only for blocks allocated or awaiting.
pub(super) fn check_graph_pools(shards: &[&Shard], pools: &GraphPools) -> Result<(), String> {
    for (id, n) in pools.live() {
        if n == 0 || id == crate::allocator::NO_POOL {
            return Err(format!("pool {id:?} is live with {n} uses"));
        }
    }
    for s in shards {
        let st = s.lock();
        let c = &st.capture;
        let ids: Vec<MempoolId> = (0..c.tag_count())
            .map(|i| c.id_of(crate::pool::PrivateTag::new(i)))
            .collect();
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        if distinct.len() != ids.len() {
            return Err(format!("shard {:?}: two tags name one pool", s.stream));
        }
        if c.routed().is_some() && st.pool_id(c.routed()).is_none() {
            return Err(format!("shard {:?}: routes to an unknown tag", s.stream));
        }
        for id in st.hccl.blocks() {
            if st.blocks.get(id).is_none_or(|b| b.is_free()) {
                return Err(format!(
                    "block {id}: an HCCL work is remembered but it is free"
                ));
            }
        }
    }
    Ok(())
}

/// Checks one shard.
pub(super) fn check(st: &ShardState) -> Result<(), String> {
    let ptrs = &st.ptrs;
    let mut seen = vec![false; st.blocks.capacity()];
    let mut rc = Recount::default();
    let mut reserved = 0usize;

    for (head, hb) in st.blocks.iter().filter(|(_, b)| b.prev.is_none()) {
        let mut seg_size = 0;
        let mut cur = Some(head);
        let mut prev: Option<BlockId> = None;
        let mut expected_ptr = hb.ptr;
        while let Some(id) = cur {
            let b = st
                .blocks
                .get(id)
                .ok_or(format!("dangling link to block {id}"))?;
            if seen[id] {
                return Err(format!("block {id} reached twice"));
            }
            seen[id] = true;
            if b.prev != prev {
                return Err(format!("block {id}: prev link {:?} != {prev:?}", b.prev));
            }
            if b.ptr != expected_ptr {
                return Err(format!(
                    "block {id} at {:#x}, expected {expected_ptr:#x}: segment not tiled",
                    b.ptr
                ));
            }
            if b.stream != hb.stream || b.kind != hb.kind {
                return Err(format!(
                    "block {id}: stream or pool differs from its segment"
                ));
            }
            if b.shift != hb.shift {
                return Err(format!(
                    "block {id}: place range differs from its segment's"
                ));
            }
            if b.size == 0 || b.size % 512 != 0 {
                return Err(format!(
                    "block {id}: size {} is not a positive multiple of 512",
                    b.size
                ));
            }
            if b.stream != st.stream {
                return Err(format!(
                    "block {id}: of stream {:?} in the shard of {:?}",
                    b.stream, st.stream
                ));
            }
            if b.stream_uses.contains(&b.stream) {
                return Err(format!("block {id}: records its own stream as a use"));
            }
            if !b.is_allocated() && !b.stream_uses.is_empty() && !st.capture.is_deferred(id) {
                return Err(format!("block {id}: free but still lists stream uses"));
            }
            if b.vm != hb.vm {
                return Err(format!(
                    "block {id}: expandable segment differs from its run's"
                ));
            }
            if b.pool.is_some_and(|t| t.index() >= st.capture.tag_count()) || b.pool != hb.pool {
                return Err(format!(
                    "block {id}: pool tag {:?} is not its segment's or is unknown",
                    b.pool
                ));
            }
            let hot = b.phase == Phase::Hot;
            if b.is_free() {
                let merged_away = |x: &crate::pool::Block| x.phase == Phase::Free;
                if let Some(p) = prev.filter(|&p| merged_away(&st.blocks[p]) && !hot) {
                    return Err(format!("free neighbours {p} and {id} were not merged"));
                }
                let pools = st.pools.get(&b.pool);
                let in_list = pools
                    .is_some_and(|p| p.get(b.kind).iter().any(|e| e == (b.size, b.place(), id)));
                let in_hot =
                    pools.map_or(0, |p| p.hot.iter().filter(|h| **h == (b.size, id)).count());
                match (hot, in_list, in_hot) {
                    (false, true, 0) | (true, false, 1) => {}
                    _ => {
                        return Err(format!(
                            "free block {id} (hot: {hot}) is in its free list: {in_list}, in the hot cache {in_hot} times"
                        ))
                    }
                }
                if b.is_split() {
                    add(&mut rc.inactive_split, b.kind, 1);
                    add(&mut rc.inactive_split_bytes, b.kind, b.size);
                }
            } else {
                add(&mut rc.active, b.kind, 1);
                add(&mut rc.active_bytes, b.kind, b.size);
                add(&mut rc.requested_bytes, b.kind, b.requested);
            }
            if b.is_allocated() {
                add(&mut rc.allocation, b.kind, 1);
                add(&mut rc.allocated_bytes, b.kind, b.size);
                if b.requested == 0 || b.requested > b.size {
                    return Err(format!(
                        "block {id}: requested {} of {}",
                        b.requested, b.size
                    ));
                }
                if ptrs.get(&b.ptr) != Some(&id) {
                    return Err(format!(
                        "allocated block {id} is missing from the pointer map"
                    ));
                }
            }
            seg_size += b.size;
            expected_ptr = b.ptr + b.size;
            prev = Some(id);
            cur = b.next;
        }
        reserved += seg_size;
        add(&mut rc.segment, hb.kind, 1);
        add(&mut rc.reserved_bytes, hb.kind, seg_size);
    }
    if let Some((id, _)) = st.blocks.iter().find(|(id, _)| !seen[*id]) {
        return Err(format!("block {id} is not reachable from a segment head"));
    }

    // Free lists hold only free blocks, each once.
    let mut listed = 0;
    for (tag, pools) in st.pools.iter() {
        for kind in [PoolKind::Small, PoolKind::Large] {
            for (size, place, id) in pools.get(kind).iter() {
                let b = st
                    .blocks
                    .get(id)
                    .ok_or(format!("free list names missing block {id}"))?;
                if !b.is_free()
                    || b.size != size
                    || b.place() != place
                    || b.pool != *tag
                    || b.kind != kind
                {
                    return Err(format!("free list entry for block {id} is stale"));
                }
                listed += 1;
            }
        }
    }
    let free_count = st
        .blocks
        .iter()
        .filter(|(_, b)| b.phase == Phase::Free)
        .count();
    if listed != free_count {
        return Err(format!(
            "{listed} free-list entries for {free_count} free blocks"
        ));
    }
    let allocated_count = st.blocks.iter().filter(|(_, b)| b.is_allocated()).count();
    if ptrs.len() != allocated_count {
        return Err(format!(
            "pointer map has {} entries for {allocated_count} allocated blocks",
            ptrs.len()
        ));
    }
    let hot_count: usize = st.pools.values().map(|p| p.hot.len()).sum();
    let hot_blocks = st
        .blocks
        .iter()
        .filter(|(_, b)| b.phase == Phase::Hot)
        .count();
    if hot_count != hot_blocks {
        return Err(format!(
            "{hot_count} hot-cache entries for {hot_blocks} hot blocks"
        ));
    }

    // Event counts equal queued events plus parked frees.
    let mut tokens: HashMap<BlockId, u32> = HashMap::new();
    for (_, _, id) in st.waits.pending().iter() {
        *tokens.entry(id).or_default() += 1;
    }
    for &id in st.waits.parked().iter().chain(st.capture.deferred()) {
        *tokens.entry(id).or_default() += 1;
    }
    for (id, b) in st.blocks.iter() {
        let want = tokens.get(&id).copied().unwrap_or(0);
        if b.waits() != want {
            return Err(format!(
                "block {id}: awaits {} but {want} outstanding",
                b.waits()
            ));
        }
        check_lending(st, id, b)?;
    }
    st.waits.check()?;

    if let Some((id, _)) = st
        .lending
        .marked()
        .find(|&(id, _)| !st.blocks.get(id).is_some_and(|b| b.dirty))
    {
        return Err(format!(
            "dirty marks for block {id}, which is not marked dirty"
        ));
    }
    check_vm(st)?;
    if reserved != st.acct.reserved() {
        return Err(format!(
            "reserved {} but segments sum to {reserved}",
            st.acct.reserved()
        ));
    }
    let s = st.acct.stats();
    compare("allocation", &s.allocation, &rc.allocation)?;
    compare("allocated_bytes", &s.allocated_bytes, &rc.allocated_bytes)?;
    compare("active", &s.active, &rc.active)?;
    compare("active_bytes", &s.active_bytes, &rc.active_bytes)?;
    compare("requested_bytes", &s.requested_bytes, &rc.requested_bytes)?;
    compare("segment", &s.segment, &rc.segment)?;
    compare("reserved_bytes", &s.reserved_bytes, &rc.reserved_bytes)?;
    compare("inactive_split", &s.inactive_split, &rc.inactive_split)?;
    compare(
        "inactive_split_bytes",
        &s.inactive_split_bytes,
        &rc.inactive_split_bytes,
    )?;
    Ok(())
}

/// Lending marks: a borrower only on an allocated block and not its own stream; dirty
/// flags exactly on blocks with marks, never allocated, never marked with their own
/// stream, with an epoch the shard's fences handed out.
fn check_lending(st: &ShardState, id: BlockId, b: &Block) -> Result<(), String> {
    if b.phase == Phase::Lent && b.stream_uses.first().is_none_or(|&s| s == b.stream) {
        return Err(format!(
            "block {id}: lent but not to another stream's caller"
        ));
    }
    let marks = st.lending.marks(id);
    if b.dirty == marks.is_empty() || (b.dirty && b.is_allocated()) {
        return Err(format!(
            "block {id}: dirty flag {} with {} marks",
            b.dirty,
            marks.len()
        ));
    }
    for &(s, epoch) in marks {
        if s == b.stream || (epoch != UNFENCED && epoch > st.lending.fence_epoch()) {
            return Err(format!("block {id}: bad dirty mark ({s:?}, {epoch})"));
        }
    }
    Ok(())
}

fn check_vm(st: &ShardState) -> Result<(), String> {
    let mut covered: HashMap<usize, usize> = HashMap::new();
    for (id, b) in st.blocks.iter() {
        let Some(vm) = b.vm else { continue };
        let seg = st
            .vm
            .get(vm.index())
            .ok_or(format!("block {id} names a missing expandable segment"))?;
        if (b.stream, b.pool, b.kind) != (seg.stream, seg.pool, seg.kind) {
            return Err(format!(
                "block {id}: stream, pool or kind differs from its segment"
            ));
        }
        if b.ptr < seg.base || b.ptr + b.size > seg.end() {
            return Err(format!("block {id} lies outside its reservation"));
        }
        let (first, last) = (
            (b.ptr - seg.base) / seg.page,
            (b.ptr + b.size - 1 - seg.base) / seg.page,
        );
        if (first..=last).any(|i| seg.pages[i].is_none()) {
            return Err(format!("block {id} covers an unmapped page"));
        }
        // A run starts after an unmapped page and ends before one.
        if b.prev.is_none() && b.ptr % seg.page != seg.base % seg.page {
            return Err(format!("run head {id} is not page-aligned"));
        }
        if b.prev.is_none() && seg.is_mapped_at(b.ptr.wrapping_sub(seg.page)) {
            return Err(format!(
                "run head {id} follows a mapped page: runs not joined"
            ));
        }
        if b.next.is_none() && seg.is_mapped_at(b.ptr + b.size) {
            return Err(format!(
                "run tail {id} precedes a mapped page: runs not joined"
            ));
        }
        if b.next.is_none() && (b.ptr + b.size - seg.base) % seg.page != 0 {
            return Err(format!("run tail {id} does not end on a page boundary"));
        }
        *covered.entry(vm.index()).or_default() += b.size;
    }
    for (i, seg) in st.vm.iter() {
        let mapped = seg.mapped();
        let bytes = covered.get(&i).copied().unwrap_or(0);
        if bytes != mapped * seg.page {
            return Err(format!(
                "expandable segment {i}: blocks cover {bytes} bytes of {} mapped",
                mapped * seg.page
            ));
        }
    }
    Ok(())
}
