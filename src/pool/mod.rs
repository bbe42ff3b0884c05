//! Blocks, their arena, size rounding, and the per-stream free lists.

pub mod block;
pub mod free_list;
pub mod ptr_table;
pub mod rounding;
pub mod vm;

pub use block::{Block, BlockId, Phase, PoolKind, Stamp};
pub use free_list::{PoolTag, PrivateTag, StreamMap};
pub use ptr_table::PtrTable;
pub use vm::{VmId, VmSegment};
