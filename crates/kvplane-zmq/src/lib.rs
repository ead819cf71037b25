//! kvplane's ZMQ subscriber in Rust. A router follows many engines' and nodes' ZMQ streams; read
//! through a JS ZMQ binding, each message costs more than applying it. A [`link::Link`] reads a
//! publisher's stream here (ZMTP 3.0 over TCP or IPC, reconnecting by itself) and applies each
//! batch in order as it is read, through the caller's [`link::Apply`]. Everything else (joining,
//! gaps, restarts, reconnects, batches that do not apply) is handed to the stream's follower,
//! which decides, through the [`gate::Gate`]. No N-API here.

pub mod endpoint;
pub mod gate;
pub mod link;
pub mod publisher;
mod runtime;
pub mod zmtp;

pub use endpoint::Endpoint;
pub use gate::Stint;
pub use link::{Apply, Deliver, Delivery, HandOff, Link, LinkOptions, LinkStats, Reader};
pub use publisher::{Message, PubOptions, PubStats, Publisher};
pub use runtime::set_on_pause;
