//! The one thread every link runs on: a single-threaded tokio runtime, started on first use. One
//! thread for all links keeps a router's ingest on one core and its index's lock uncontended.

use std::sync::OnceLock;
use tokio::runtime::{Builder, Handle};

pub fn handle() -> &'static Handle {
  static HANDLE: OnceLock<Handle> = OnceLock::new();
  HANDLE.get_or_init(|| {
    let rt = Builder::new_current_thread()
      .enable_io()
      .enable_time()
      .build()
      .expect("a tokio runtime for kvplane's ZMQ links");
    let handle = rt.handle().clone();
    std::thread::Builder::new()
      .name("kvplane-zmq".into())
      .spawn(move || rt.block_on(std::future::pending::<()>()))
      .expect("the kvplane-zmq thread");
    handle
  })
}
