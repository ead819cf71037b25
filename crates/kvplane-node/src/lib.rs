//! N-API bindings for kvplane: JS values <-> core types, core errors -> JS errors. No domain logic
//! lives here; every decision is the core's.

mod codec;
mod convert;
mod error;
mod events;
mod extra_key;
mod hash;
mod indexer;
mod queue;
mod value;

pub use codec::*;
pub use error::panic_probe;
pub use events::*;
pub use hash::*;
pub use indexer::*;
pub use queue::*;
