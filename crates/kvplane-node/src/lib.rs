//! N-API bindings for kvplane: JS values <-> core types, core errors -> JS errors. No domain logic
//! lives here; every decision is the core's.

mod codec;
mod convert;
mod engine_link;
mod error;
mod events;
mod extra_key;
mod hash;
mod layout;
mod loads;
mod local_indexer;
mod memory;
mod options;
mod outputs;
mod queue;
mod router_dump;
mod router_index;
mod tasks;
mod value;
mod zmq_link;

pub use codec::*;
pub use engine_link::*;
// Test hooks: attached at load only under KVPLANE_TEST_HOOKS=1 (error.rs).
pub use error::{attach_test_hooks, panic_probe};
pub use events::*;
pub use hash::*;
pub use layout::*;
pub use loads::*;
pub use local_indexer::*;
pub use memory::*;
pub use options::*;
pub use outputs::*;
pub use queue::*;
pub use router_dump::*;
pub use router_index::*;
pub use zmq_link::*;
