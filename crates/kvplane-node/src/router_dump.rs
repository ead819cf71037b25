//! Dynamo's indexer `/dump`: written by the core from a router's index (`dumpJson`), and a peer
//! indexer's read for a router to start from (`kvplane indexer --peers`), its segments kept
//! native until `NativeRouterIndex.restore` stores them.

use crate::error::{guard_js, Code};
use crate::router_index::NativeRouterIndex;
use kvplane_core::codec::dynamo_dump::{parse_dynamo_dump as parse, write_events, DumpedIndex};
use napi::bindgen_prelude::*;
use napi_derive::napi;
use std::cell::RefCell;

/// One index of a dump. `restore` takes its blocks (they are freed then, not when the object is
/// collected): restored once.
#[napi]
pub struct NativeDumpedIndex {
  inner: RefCell<DumpedIndex>,
}

#[napi]
impl NativeDumpedIndex {
  /// `model_name:routing_group`, as the dump names it.
  #[napi(getter)]
  pub fn name(&self) -> String {
    self.inner.borrow().name.clone()
  }

  #[napi(getter)]
  pub fn block_size(&self) -> u32 {
    self.inner.borrow().block_size
  }

  /// Its stored events (0 once restored).
  #[napi(getter)]
  pub fn segments(&self) -> u32 {
    self.inner.borrow().segments.len() as u32
  }

  /// Events left out: not stored ones, or of a tier not indexed.
  #[napi(getter)]
  pub fn skipped(&self) -> f64 {
    self.inner.borrow().skipped as f64
  }
}

/// Reads the body of Dynamo's indexer `GET /dump` (kvplane's or Dynamo's); `ERR_DECODE` when
/// it is not one.
#[napi]
pub fn parse_dynamo_dump(body: Buffer) -> Result<Vec<NativeDumpedIndex>, Code> {
  guard_js(|| {
    Ok(
      parse(&body)?
        .into_iter()
        .map(|inner| NativeDumpedIndex {
          inner: RefCell::new(inner),
        })
        .collect(),
    )
  })
}

#[napi]
impl NativeRouterIndex {
  /// Every worker's blocks as the `events` of Dynamo's `/dump` entry (JSON), in pieces of about
  /// `piece_blocks` blocks, each piece events joined by commas (`codec::dynamo_dump::write_events`).
  #[napi]
  pub fn dump_json(&self, piece_blocks: u32) -> Result<Vec<Buffer>, Code> {
    guard_js(|| {
      let segments = self.shared().read().dump(None);
      Ok(
        write_events(&segments, piece_blocks as usize)
          .into_iter()
          .map(Buffer::from)
          .collect(),
      )
    })
  }
}

#[napi(object)]
pub struct RestoredOut {
  pub segments: u32,
  pub blocks: f64,
}

#[napi]
impl NativeRouterIndex {
  /// Stores a dumped index's segments over what the index holds (one writer's turn, a few
  /// blocks per write lock), but those of the workers in `skip`; the dump's blocks are taken (a
  /// second restore of it stores nothing). A segment whose parent is
  /// unknown is counted as a drop.
  #[napi]
  pub fn restore(
    &self,
    dump: &NativeDumpedIndex,
    skip: Option<BigUint64Array>,
  ) -> Result<RestoredOut, Code> {
    guard_js(|| {
      let skip = skip.as_deref().unwrap_or(&[]);
      let segments = std::mem::take(&mut dump.inner.borrow_mut().segments);
      let r = self.shared().restore(&segments, skip);
      Ok(RestoredOut {
        segments: r.segments,
        blocks: r.blocks as f64,
      })
    })
  }
}
