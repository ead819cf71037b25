//! kvplane core: pure Rust, no N-API. Block hashing for every engine, the index, the replay log
//! and the wire codecs live here; the Node binding only converts values and maps errors.

pub mod chunk;
pub mod codec;
pub mod columns;
pub mod diagnostics;
pub mod error;
pub mod event;
pub mod hash;
pub mod index;
pub mod int64;
pub mod local_indexer;
pub mod router;
pub mod shared;
pub mod stream;

pub use error::{ErrorCode, KvError, KvResult};
