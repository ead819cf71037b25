//! N-API bindings for kvplane: JS values <-> core types, core errors -> JS errors. No domain logic
//! lives here; every decision is the core's.

mod convert;
mod error;
mod extra_key;
mod hash;
mod indexer;

pub use error::panic_probe;
pub use hash::*;
pub use indexer::*;
