//! SMG's `smg.grpc.common.KvEventBatch` protobuf (SPEC §3.3), written and read by hand: fields in
//! number order, proto3 defaults omitted, `optional` fields written when present, repeated
//! scalars packed. That is what the official runtime emits for the same message.

use super::msgpack::decode_error;
use super::value::Value;
use crate::chunk::EventRef;
use crate::error::KvResult;
use crate::event::{Batch, KvEvent, RemovedEvent, StoredEvent};

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

#[inline]
fn key(field: u32, wire: u8) -> u64 {
  ((field as u64) << 3) | wire as u64
}

#[inline]
fn put_varint(out: &mut Vec<u8>, mut v: u64) {
  while v >= 0x80 {
    out.push((v as u8) | 0x80);
    v >>= 7;
  }
  out.push(v as u8);
}

/// Appends `vals` as varints (a packed repeated field's body) into room made once; each u32
/// is written branch-free as one 8-byte store of its five 7-bit groups, then the length kept.
fn put_packed_u32s(out: &mut Vec<u8>, vals: &[u32]) {
  let start = out.len();
  out.resize(start + vals.len() * 5 + 8, 0);
  let buf = &mut out[start..];
  let mut n = 0;
  // Continuation bits on every byte but the last, by length.
  const MORE: [u64; 6] = [0, 0, 0x80, 0x8080, 0x80_8080, 0x8080_8080];
  for &t in vals {
    let v = t as u64;
    let len = 1
      + (t >= 1 << 7) as usize
      + (t >= 1 << 14) as usize
      + (t >= 1 << 21) as usize
      + (t >= 1 << 28) as usize;
    let groups = (v & 0x7f)
      | (v >> 7 & 0x7f) << 8
      | (v >> 14 & 0x7f) << 16
      | (v >> 21 & 0x7f) << 24
      | (v >> 28) << 32;
    let more = MORE[len];
    buf[n..n + 8].copy_from_slice(&(groups | more).to_le_bytes());
    n += len;
  }
  out.truncate(start + n);
}

#[inline]
fn varint_len(v: u64) -> usize {
  (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
  put_varint(out, key(field, wire));
}

/// Writes a length-delimited field: one byte is reserved for the length prefix, `body` writes,
/// and the prefix is filled in place; a body of 128 bytes or more (rare: a block is ~70) moves
/// right by the extra prefix bytes.
fn put_len_delimited(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
  put_key(out, field, LEN);
  let at = out.len();
  out.push(0);
  body(out);
  let len = out.len() - at - 1;
  if len < 0x80 {
    out[at] = len as u8;
    return;
  }
  let n = varint_len(len as u64);
  out.splice(at + 1..at + 1, std::iter::repeat_n(0u8, n - 1));
  let mut v = len as u64;
  for b in &mut out[at..at + n] {
    *b = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
    v >>= 7;
  }
}

/// The proto `cache_level` of a medium (any case): 0 device, 1 host memory, 2 disk, 3 external
/// pool; other media have no level.
pub fn cache_level_of_medium(medium: Option<&str>) -> Option<i32> {
  const LEVELS: [&[&str]; 4] = [
    &["GPU", "DEVICE"],
    &["CPU", "CPU_PINNED", "CPU_TIER1"],
    &["CPU_TIER2", "DISK", "NVME", "STORAGE", "FS"],
    &["EXTERNAL", "OBJ", "NETWORK", "REMOTE", "SHARED"],
  ];
  let m = medium?;
  LEVELS
    .iter()
    .position(|names| names.iter().any(|n| m.eq_ignore_ascii_case(n)))
    .map(|l| l as i32)
}

/// `KvCacheTier` of a medium: the cache level + 1 (0 is unspecified).
fn tier_of_medium(medium: Option<&str>) -> Option<i32> {
  cache_level_of_medium(medium).map(|l| l + 1)
}

/// `KvCacheLocality` of a locality string.
fn locality_enum(l: Option<&str>) -> Option<i32> {
  let l = l?;
  if l.eq_ignore_ascii_case("LOCAL") {
    Some(1)
  } else if l.eq_ignore_ascii_case("REMOTE") {
    Some(2)
  } else {
    None
  }
}

fn locality_name(v: u64) -> Option<String> {
  match v {
    1 => Some("LOCAL".to_owned()),
    2 => Some("REMOTE".to_owned()),
    _ => None,
  }
}

fn put_str(out: &mut Vec<u8>, field: u32, v: Option<&str>) {
  if let Some(v) = v {
    put_key(out, field, LEN);
    put_varint(out, v.len() as u64);
    out.extend_from_slice(v.as_bytes());
  }
}

fn put_opt_varint(out: &mut Vec<u8>, field: u32, v: Option<u64>) {
  if let Some(v) = v {
    put_key(out, field, VARINT);
    put_varint(out, v);
  }
}

/// One block's `extra_keys` entries as `KvBlockExtraKey` messages: text, blob, number, or a
/// multimodal `(identifier, offset)` pair.
fn put_extra_keys(out: &mut Vec<u8>, entries: &[Value]) {
  for e in entries {
    put_len_delimited(out, 6, |out| match e {
      Value::Str(t) => put_str(out, 1, Some(t)),
      Value::Bin(b) => {
        put_key(out, 2, LEN);
        put_varint(out, b.len() as u64);
        out.extend_from_slice(b);
      }
      Value::Uint(n) => put_opt_varint(out, 3, Some(*n)),
      Value::Int(n) => put_opt_varint(out, 3, Some(*n as u64)),
      Value::Array(pair) => put_len_delimited(out, 4, |out| {
        if let Some(Value::Str(id)) = pair.first() {
          if !id.is_empty() {
            put_str(out, 1, Some(id));
          }
        }
        match pair.get(1) {
          Some(Value::Uint(o)) if *o != 0 => put_opt_varint(out, 2, Some(*o)),
          Some(Value::Int(o)) => put_opt_varint(out, 2, Some(*o as u64)),
          _ => {}
        }
      }),
      _ => {}
    });
  }
}

/// The medium a proto `cache_level` stands for (the inverse of [`cache_level_of_medium`]).
pub fn medium_of_cache_level(level: i32) -> Option<&'static str> {
  match level {
    0 => Some("GPU"),
    1 => Some("CPU"),
    2 => Some("DISK"),
    3 => Some("EXTERNAL"),
    _ => None,
  }
}

/// A stored event's fields as the encoder reads them: from a `StoredEvent`, or from columns
/// (which carry no more than hashes, parent, tokens, block size, medium and LoRA).
#[derive(Default)]
struct StoredFields<'a> {
  block_hashes: &'a [u64],
  parent_block_hash: Option<u64>,
  token_ids: &'a [u32],
  block_size: u32,
  lora_id: Option<i64>,
  lora_name: Option<&'a str>,
  medium: Option<&'a str>,
  group_idx: Option<u32>,
  cache_salt: Option<&'a str>,
  extra_keys: Option<&'a Value>,
  kv_cache_spec_kind: Option<&'a str>,
  kv_cache_spec_sliding_window: Option<i64>,
  locality: Option<&'a str>,
  ownership: Option<&'a str>,
  session_id: Option<&'a str>,
}

impl<'a> StoredFields<'a> {
  fn of(s: &'a StoredEvent) -> StoredFields<'a> {
    StoredFields {
      block_hashes: &s.block_hashes,
      parent_block_hash: s.parent_block_hash,
      token_ids: &s.token_ids,
      block_size: s.block_size,
      lora_id: s.lora_id,
      lora_name: s.lora_name.as_deref(),
      medium: s.medium.as_deref(),
      group_idx: s.group_idx,
      cache_salt: s.cache_salt.as_deref(),
      extra_keys: s.extra_keys.as_ref(),
      kv_cache_spec_kind: s.kv_cache_spec_kind.as_deref(),
      kv_cache_spec_sliding_window: s.kv_cache_spec_sliding_window,
      locality: s.locality.as_deref(),
      ownership: s.ownership.as_deref(),
      session_id: s.session_id.as_deref(),
    }
  }
}

/// A removed event's fields as the encoder reads them.
#[derive(Default)]
struct RemovedFields<'a> {
  block_hashes: &'a [u64],
  medium: Option<&'a str>,
  group_idx: Option<u32>,
  locality: Option<&'a str>,
  ownership: Option<&'a str>,
}

impl<'a> RemovedFields<'a> {
  fn of(r: &'a RemovedEvent) -> RemovedFields<'a> {
    RemovedFields {
      block_hashes: &r.block_hashes,
      medium: r.medium.as_deref(),
      group_idx: r.group_idx,
      locality: r.locality.as_deref(),
      ownership: r.ownership.as_deref(),
    }
  }
}

/// What one event encodes as; `None` has no proto form (`updated`/`created`) and is left out.
enum ProtoEvent<'a> {
  Stored(StoredFields<'a>),
  Removed(RemovedFields<'a>),
  Cleared,
  None,
}

impl<'a> ProtoEvent<'a> {
  fn of(e: &'a KvEvent) -> ProtoEvent<'a> {
    match e {
      KvEvent::Stored(s) => ProtoEvent::Stored(StoredFields::of(s)),
      KvEvent::Removed(r) => ProtoEvent::Removed(RemovedFields::of(r)),
      KvEvent::Cleared => ProtoEvent::Cleared,
      KvEvent::Updated(_) | KvEvent::Created(_) => ProtoEvent::None,
    }
  }

  fn of_ref(e: &EventRef<'a>) -> ProtoEvent<'a> {
    match *e {
      EventRef::Stored {
        hashes,
        parent,
        tokens,
        attrs,
      } => ProtoEvent::Stored(StoredFields {
        block_hashes: hashes,
        parent_block_hash: parent,
        token_ids: tokens,
        block_size: attrs.block_size,
        lora_id: attrs.lora_id,
        lora_name: attrs.lora_name.as_deref(),
        medium: attrs.medium.as_deref(),
        ..Default::default()
      }),
      EventRef::Removed { hashes, attrs } => ProtoEvent::Removed(RemovedFields {
        block_hashes: hashes,
        medium: attrs.medium.as_deref(),
        ..Default::default()
      }),
      EventRef::Cleared => ProtoEvent::Cleared,
      EventRef::Event(e) => ProtoEvent::of(e),
    }
  }
}

/// Encodes a batch. Stored events become one `KvBlock` per hash with its `block_size` tokens
/// (an event whose tokens do not split that way carries its blocks without tokens);
/// `updated`/`created` have no proto form and are left out. An event's `event_id` is
/// `(seq << 32) | index` (vLLM's convention), so a batch re-encodes to the same bytes.
pub fn encode_batch(b: &Batch, out: &mut Vec<u8>) {
  encode_frame(
    b.seq,
    b.ts,
    b.dp_rank,
    b.events.iter().map(ProtoEvent::of),
    out,
  );
}

/// Encodes the batch `seq` of borrowed events (the publish path's columns), to the bytes
/// `encode_batch` writes for the same events.
pub fn encode_event_refs(
  seq: u64,
  ts: f64,
  dp_rank: Option<i32>,
  events: &[EventRef<'_>],
  out: &mut Vec<u8>,
) {
  encode_frame(seq, ts, dp_rank, events.iter().map(ProtoEvent::of_ref), out);
}

fn encode_frame<'a>(
  seq: u64,
  ts: f64,
  dp_rank: Option<i32>,
  events: impl Iterator<Item = ProtoEvent<'a>>,
  out: &mut Vec<u8>,
) {
  if seq != 0 {
    put_key(out, 1, VARINT);
    put_varint(out, seq);
  }
  if ts.to_bits() != 0 {
    put_key(out, 2, I64);
    out.extend_from_slice(&ts.to_le_bytes());
  }
  let mut event_id = (seq & 0xffff_ffff) << 32;
  for e in events {
    if matches!(e, ProtoEvent::None) {
      continue;
    }
    put_len_delimited(out, 3, |out| encode_event(&e, event_id, out));
    event_id += 1;
  }
  if let Some(r) = dp_rank {
    put_key(out, 4, VARINT);
    put_varint(out, r as i64 as u64);
  }
}

fn encode_event(e: &ProtoEvent<'_>, event_id: u64, out: &mut Vec<u8>) {
  if event_id != 0 {
    put_key(out, 1, VARINT);
    put_varint(out, event_id);
  }
  match e {
    ProtoEvent::Stored(s) => put_len_delimited(out, 2, |out| encode_stored(s, out)),
    ProtoEvent::Removed(r) => put_len_delimited(out, 3, |out| encode_removed(r, out)),
    ProtoEvent::Cleared => put_len_delimited(out, 4, |_| {}),
    ProtoEvent::None => {}
  }
}

fn encode_stored(s: &StoredFields<'_>, out: &mut Vec<u8>) {
  let bs = s.block_size as usize;
  let split = bs != 0 && s.token_ids.len() == s.block_hashes.len() * bs;
  let level = cache_level_of_medium(s.medium);
  let extra: &[Value] = match s.extra_keys {
    Some(Value::Array(per_block)) if per_block.len() == s.block_hashes.len() => per_block,
    _ => &[],
  };
  for (i, &h) in s.block_hashes.iter().enumerate() {
    put_len_delimited(out, 1, |out| {
      if h != 0 {
        put_key(out, 1, VARINT);
        put_varint(out, h);
      }
      if split {
        let toks = &s.token_ids[i * bs..(i + 1) * bs];
        put_len_delimited(out, 2, |out| put_packed_u32s(out, toks));
      }
      if s.block_size != 0 {
        put_key(out, 3, VARINT);
        put_varint(out, s.block_size as i32 as i64 as u64);
      }
      put_opt_varint(out, 4, s.lora_id.map(|l| l as u64));
      put_opt_varint(out, 5, level.map(|l| l as i64 as u64));
      if let Some(Value::Array(entries)) = extra.get(i) {
        put_extra_keys(out, entries);
      }
    });
  }
  put_opt_varint(out, 2, s.parent_block_hash);
  put_opt_varint(out, 3, tier_of_medium(s.medium).map(|t| t as u64));
  put_str(out, 4, s.medium);
  put_opt_varint(out, 5, s.group_idx.map(u64::from));
  put_str(out, 6, s.kv_cache_spec_kind);
  put_opt_varint(
    out,
    7,
    s.kv_cache_spec_sliding_window
      .and_then(|w| u32::try_from(w).ok())
      .map(u64::from),
  );
  put_opt_varint(out, 8, locality_enum(s.locality).map(|l| l as u64));
  put_str(out, 9, s.ownership);
  put_str(out, 10, s.session_id);
  put_str(out, 11, s.lora_name);
  put_str(out, 12, s.cache_salt);
}

fn encode_removed(r: &RemovedFields<'_>, out: &mut Vec<u8>) {
  if !r.block_hashes.is_empty() {
    let len: usize = r.block_hashes.iter().map(|&h| varint_len(h)).sum();
    put_key(out, 1, LEN);
    put_varint(out, len as u64);
    for &h in r.block_hashes {
      put_varint(out, h);
    }
  }
  let level = cache_level_of_medium(r.medium);
  put_opt_varint(out, 2, level.map(|l| l as i64 as u64));
  put_opt_varint(out, 3, level.map(|l| (l + 1) as u64));
  put_str(out, 4, r.medium);
  put_opt_varint(out, 5, r.group_idx.map(u64::from));
  put_opt_varint(out, 6, locality_enum(r.locality).map(|l| l as u64));
  put_str(out, 7, r.ownership);
}

/// A bounds-checked protobuf reader.
struct Pb<'a> {
  buf: &'a [u8],
  pos: usize,
}

impl<'a> Pb<'a> {
  fn err<T>(&self, what: &str) -> KvResult<T> {
    Err(decode_error(format!(
      "protobuf: {what} at byte {}",
      self.pos
    )))
  }

  fn done(&self) -> bool {
    self.pos >= self.buf.len()
  }

  fn varint(&mut self) -> KvResult<u64> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
      let Some(&b) = self.buf.get(self.pos) else {
        return self.err("truncated varint");
      };
      self.pos += 1;
      if shift == 63 && b > 1 {
        return self.err("varint overflows 64 bits");
      }
      v |= ((b & 0x7f) as u64) << shift;
      if b < 0x80 {
        return Ok(v);
      }
    }
    self.err("varint longer than 10 bytes")
  }

  fn bytes(&mut self) -> KvResult<&'a [u8]> {
    let n = self.varint()?;
    let end = usize::try_from(n)
      .ok()
      .and_then(|n| self.pos.checked_add(n))
      .filter(|&e| e <= self.buf.len());
    match end {
      Some(end) => {
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
      }
      None => self.err("length beyond the end of the message"),
    }
  }

  fn fixed<const N: usize>(&mut self) -> KvResult<[u8; N]> {
    match self.buf.get(self.pos..self.pos + N) {
      Some(s) => {
        self.pos += N;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
      }
      None => self.err("truncated fixed-width field"),
    }
  }

  /// Reads a field key: (field number, wire type).
  fn key(&mut self) -> KvResult<(u32, u8)> {
    let k = self.varint()?;
    let field = k >> 3;
    if field == 0 || field > u32::MAX as u64 >> 3 {
      return self.err("invalid field number");
    }
    Ok((field as u32, (k & 7) as u8))
  }

  fn skip(&mut self, wire: u8) -> KvResult<()> {
    match wire {
      VARINT => self.varint().map(|_| ()),
      I64 => self.fixed::<8>().map(|_| ()),
      LEN => self.bytes().map(|_| ()),
      I32 => self.fixed::<4>().map(|_| ()),
      _ => self.err("unsupported wire type"),
    }
  }

  fn string(&mut self) -> KvResult<String> {
    match std::str::from_utf8(self.bytes()?) {
      Ok(v) => Ok(v.to_owned()),
      Err(_) => self.err("invalid UTF-8 in a string"),
    }
  }

  fn varint_field(&mut self, wire: u8) -> KvResult<u64> {
    expect(wire, VARINT, self)?;
    self.varint()
  }

  fn string_field(&mut self, wire: u8) -> KvResult<String> {
    expect(wire, LEN, self)?;
    self.string()
  }

  /// Packed or unpacked repeated varints into `out`.
  fn repeated_varint(&mut self, wire: u8, out: &mut Vec<u64>) -> KvResult<()> {
    match wire {
      VARINT => out.push(self.varint()?),
      LEN => {
        let body = self.bytes()?;
        let mut p = Pb { buf: body, pos: 0 };
        while !p.done() {
          out.push(p.varint()?);
        }
      }
      _ => return self.err("wrong wire type for a repeated integer"),
    }
    Ok(())
  }
}

fn expect(wire: u8, want: u8, p: &Pb<'_>) -> KvResult<()> {
  if wire == want {
    Ok(())
  } else {
    p.err("wrong wire type for a known field")
  }
}

fn i32_of(v: u64, what: &str) -> KvResult<i32> {
  let v = v as i64;
  i32::try_from(v).map_err(|_| decode_error(format!("protobuf: {what} {v} overflows int32")))
}

/// What a `KvEventBatch` decoded to.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedProtoBatch {
  pub batch: Batch,
  /// `event_id` of each decoded event, in order.
  pub event_ids: Vec<u64>,
  /// Events with no known `data` (a newer oneof member), skipped.
  pub unknown_events: u32,
}

/// Encodes a `SubscribeKvEventsRequest` (`start_sequence_number`; 0 = live from now).
pub fn encode_subscribe_request(start: u64) -> Vec<u8> {
  let mut out = Vec::with_capacity(11);
  put_opt_varint(&mut out, 1, (start != 0).then_some(start));
  out
}

/// Reads a `SubscribeKvEventsRequest`: its `start_sequence_number` (0 when absent). Other
/// fields (`load_records_before_first_batch`, newer ones) are skipped.
pub fn decode_subscribe_request(bytes: &[u8]) -> KvResult<u64> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut start = 0;
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      1 => start = p.varint_field(wire)?,
      _ => p.skip(wire)?,
    }
  }
  Ok(start)
}

pub fn decode_batch(bytes: &[u8]) -> KvResult<DecodedProtoBatch> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut out = DecodedProtoBatch {
    batch: Batch {
      seq: 0,
      ts: 0.0,
      dp_rank: None,
      events: Vec::new(),
    },
    event_ids: Vec::new(),
    unknown_events: 0,
  };
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      1 => {
        expect(wire, VARINT, &p)?;
        out.batch.seq = p.varint()?;
      }
      2 => {
        expect(wire, I64, &p)?;
        out.batch.ts = f64::from_le_bytes(p.fixed()?);
      }
      3 => {
        expect(wire, LEN, &p)?;
        let body = p.bytes()?;
        let (id, ev) = decode_event(body)?;
        match ev {
          Some(e) => {
            out.batch.events.push(e);
            out.event_ids.push(id);
          }
          None => out.unknown_events += 1,
        }
      }
      4 => {
        expect(wire, VARINT, &p)?;
        out.batch.dp_rank = Some(i32_of(p.varint()?, "dp_rank")?);
      }
      _ => p.skip(wire)?,
    }
  }
  Ok(out)
}

fn decode_event(bytes: &[u8]) -> KvResult<(u64, Option<KvEvent>)> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut id = 0;
  let mut ev = None;
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      1 => {
        expect(wire, VARINT, &p)?;
        id = p.varint()?;
      }
      2 => {
        expect(wire, LEN, &p)?;
        ev = Some(decode_stored(p.bytes()?)?);
      }
      3 => {
        expect(wire, LEN, &p)?;
        ev = Some(decode_removed(p.bytes()?)?);
      }
      4 => {
        expect(wire, LEN, &p)?;
        p.bytes()?;
        ev = Some(KvEvent::Cleared);
      }
      _ => p.skip(wire)?,
    }
  }
  Ok((id, ev))
}

/// A `KvBlockExtraKey` back into the opaque value vLLM published.
fn decode_extra_key(bytes: &[u8]) -> KvResult<Value> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut v = Value::Nil;
  while !p.done() {
    let (field, wire) = p.key()?;
    v = match field {
      1 => Value::Str(p.string_field(wire)?),
      2 => {
        expect(wire, LEN, &p)?;
        Value::Bin(p.bytes()?.to_vec())
      }
      3 => match p.varint_field(wire)? as i64 {
        n if n < 0 => Value::Int(n),
        n => Value::Uint(n as u64),
      },
      4 => {
        expect(wire, LEN, &p)?;
        let mut m = Pb {
          buf: p.bytes()?,
          pos: 0,
        };
        let (mut id, mut offset) = (String::new(), 0i64);
        while !m.done() {
          let (f, w) = m.key()?;
          match f {
            1 => id = m.string_field(w)?,
            2 => offset = m.varint_field(w)? as i64,
            _ => m.skip(w)?,
          }
        }
        let offset = if offset < 0 {
          Value::Int(offset)
        } else {
          Value::Uint(offset as u64)
        };
        Value::Array(vec![Value::Str(id), offset])
      }
      _ => {
        p.skip(wire)?;
        v
      }
    };
  }
  Ok(v)
}

/// Blocks of one stored event; they become one normalized event with the blocks' tokens in a
/// row, `block_size`, `lora_id` and the tier taken from the first block (blocks of different
/// sizes make the event fail the layout check).
fn decode_stored(bytes: &[u8]) -> KvResult<KvEvent> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut s = StoredEvent::default();
  let mut sizes_differ = false;
  let mut level_medium = None;
  let mut tier_medium = None;
  let mut extra: Vec<Value> = Vec::new();
  let mut any_extra = false;
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      1 => {
        expect(wire, LEN, &p)?;
        let mut b = Pb {
          buf: p.bytes()?,
          pos: 0,
        };
        let (mut hash, mut size, mut lora, mut level) = (0u64, 0i32, None, None);
        let mut toks = Vec::new();
        let mut keys = Vec::new();
        while !b.done() {
          let (f, w) = b.key()?;
          match f {
            1 => hash = b.varint_field(w)?,
            2 => b.repeated_varint(w, &mut toks)?,
            3 => size = i32_of(b.varint_field(w)?, "block_size")?,
            4 => lora = Some(b.varint_field(w)? as i64),
            5 => level = Some(i32_of(b.varint_field(w)?, "cache_level")?),
            6 => {
              expect(w, LEN, &b)?;
              keys.push(decode_extra_key(b.bytes()?)?);
            }
            _ => b.skip(w)?,
          }
        }
        if size < 0 {
          return Err(decode_error(format!(
            "protobuf: block_size {size} is negative"
          )));
        }
        for t in toks {
          s.token_ids.push(
            u32::try_from(t)
              .map_err(|_| decode_error(format!("protobuf: token id {t} overflows uint32")))?,
          );
        }
        if s.block_hashes.is_empty() {
          s.block_size = size as u32;
          s.lora_id = lora;
          level_medium = level.and_then(medium_of_cache_level);
        } else if s.block_size != size as u32 {
          sizes_differ = true;
        }
        any_extra |= !keys.is_empty();
        extra.push(if keys.is_empty() {
          Value::Nil
        } else {
          Value::Array(keys)
        });
        s.block_hashes.push(hash);
      }
      2 => s.parent_block_hash = Some(p.varint_field(wire)?),
      3 => tier_medium = medium_of_tier(p.varint_field(wire)?),
      4 => s.medium = Some(p.string_field(wire)?),
      5 => s.group_idx = Some(p.varint_field(wire)? as u32),
      6 => s.kv_cache_spec_kind = Some(p.string_field(wire)?),
      7 => s.kv_cache_spec_sliding_window = Some(p.varint_field(wire)? as u32 as i64),
      8 => s.locality = locality_name(p.varint_field(wire)?),
      9 => s.ownership = Some(p.string_field(wire)?),
      10 => s.session_id = Some(p.string_field(wire)?),
      11 => s.lora_name = Some(p.string_field(wire)?),
      12 => s.cache_salt = Some(p.string_field(wire)?),
      _ => p.skip(wire)?,
    }
  }
  if s.medium.is_none() {
    s.medium = tier_medium.or(level_medium).map(str::to_owned);
  }
  if any_extra {
    s.extra_keys = Some(Value::Array(extra));
  }
  if sizes_differ {
    // Blocks of different sizes cannot form one event: mark the layout as unsplittable.
    s.block_size = 0;
  }
  Ok(KvEvent::Stored(s))
}

fn medium_of_tier(t: u64) -> Option<&'static str> {
  match t {
    1..=4 => medium_of_cache_level(t as i32 - 1),
    _ => None,
  }
}

fn decode_removed(bytes: &[u8]) -> KvResult<KvEvent> {
  let mut p = Pb { buf: bytes, pos: 0 };
  let mut r = RemovedEvent::default();
  let (mut level_medium, mut tier_medium) = (None, None);
  while !p.done() {
    let (field, wire) = p.key()?;
    match field {
      1 => p.repeated_varint(wire, &mut r.block_hashes)?,
      2 => level_medium = medium_of_cache_level(i32_of(p.varint_field(wire)?, "cache_level")?),
      3 => tier_medium = medium_of_tier(p.varint_field(wire)?),
      4 => r.medium = Some(p.string_field(wire)?),
      5 => r.group_idx = Some(p.varint_field(wire)? as u32),
      6 => r.locality = locality_name(p.varint_field(wire)?),
      7 => r.ownership = Some(p.string_field(wire)?),
      _ => p.skip(wire)?,
    }
  }
  if r.medium.is_none() {
    r.medium = tier_medium.or(level_medium).map(str::to_owned);
  }
  Ok(KvEvent::Removed(r))
}
#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn subscribe_requests_round_trip_and_skip_unknown_fields() {
    for start in [0, 1, 300, u64::MAX] {
      assert_eq!(
        decode_subscribe_request(&encode_subscribe_request(start)).unwrap(),
        start
      );
    }
    assert!(encode_subscribe_request(0).is_empty());
    // start 5 plus `load_records_before_first_batch = true` (field 2).
    assert_eq!(decode_subscribe_request(&[0x08, 5, 0x10, 1]).unwrap(), 5);
    assert!(decode_subscribe_request(&[0x08]).is_err());
    assert!(
      decode_subscribe_request(&[0x0a, 1, 0]).is_err(),
      "field 1 must be a varint"
    );
  }

  #[test]
  fn long_fields_get_multi_byte_length_prefixes_and_columns_encode_as_events_do() {
    use crate::chunk::EventChunk;
    use crate::columns::Columns;
    // Events of 1, 20 and 300 blocks: bodies under 128 bytes, over 128 and over 16 KiB.
    for blocks in [1usize, 20, 300] {
      let hashes: Vec<u64> = (0..blocks as u64).map(|i| u64::MAX - i).collect();
      let tokens: Vec<u32> = (0..blocks as u32 * 16).map(|t| t * 4099).collect();
      let cols = Columns {
        kinds: &[0, 1],
        hash_counts: &[blocks as u32, blocks as u32],
        hashes: &[hashes.clone(), hashes.clone()].concat(),
        parents: &[42, 0],
        has_parent: &[1, 0],
        tokens: &tokens,
        block_size: 16,
        medium: Some("cpu"),
        lora_id: Some(3),
        lora_name: Some("a"),
      };
      let chunk = EventChunk::from_columns(&cols).unwrap();
      let refs: Vec<EventRef<'_>> = chunk.iter().collect();
      let batch = Batch {
        seq: 9,
        ts: 1.5,
        dp_rank: Some(2),
        events: refs.iter().map(EventRef::to_event).collect(),
      };
      let (mut by_events, mut by_refs) = (Vec::new(), Vec::new());
      encode_batch(&batch, &mut by_events);
      encode_event_refs(9, 1.5, Some(2), &refs, &mut by_refs);
      assert_eq!(by_refs, by_events, "{blocks} blocks");
      let back = decode_batch(&by_refs).unwrap().batch;
      assert_eq!((back.seq, back.dp_rank), (9, Some(2)));
      match (&back.events[0], &batch.events[0]) {
        (KvEvent::Stored(got), KvEvent::Stored(want)) => {
          assert_eq!(got.block_hashes, want.block_hashes);
          assert_eq!(got.token_ids, want.token_ids);
          assert_eq!(got.parent_block_hash, Some(42));
          assert_eq!(got.lora_name.as_deref(), Some("a"));
        }
        other => panic!("{other:?}"),
      }
      match &back.events[1] {
        KvEvent::Removed(r) => assert_eq!(r.block_hashes, hashes),
        other => panic!("{other:?}"),
      }
    }
    assert_eq!(cache_level_of_medium(Some("cpu_Tier2")), Some(2));
    assert_eq!(cache_level_of_medium(Some("tape")), None);
    assert_eq!(locality_enum(Some("Remote")), Some(2));
  }

  #[test]
  fn length_prefixes_are_minimal_varints_at_every_width_boundary() {
    for len in [
      0usize, 1, 127, 128, 129, 16383, 16384, 16385, 2_097_151, 2_097_152,
    ] {
      let mut got = vec![9u8];
      put_len_delimited(&mut got, 3, |out| out.extend((0..len).map(|i| i as u8)));
      let mut want = vec![9u8];
      put_key(&mut want, 3, LEN);
      put_varint(&mut want, len as u64);
      want.extend((0..len).map(|i| i as u8));
      assert!(got == want, "body of {len} bytes");
    }
  }

  #[test]
  fn varint_lengths_match_the_encoding() {
    for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
      let mut b = Vec::new();
      put_varint(&mut b, v);
      assert_eq!(b.len(), varint_len(v), "{v}");
      assert_eq!(Pb { buf: &b, pos: 0 }.varint().unwrap(), v);
    }
    let mut x = 0x2545_f491u32;
    let mut vals = vec![
      0,
      1,
      127,
      128,
      16383,
      16384,
      (1 << 21) - 1,
      1 << 21,
      (1 << 28) - 1,
      1 << 28,
      u32::MAX,
    ];
    vals.extend((0..1000).map(|i| {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      x >> (i % 32)
    }));
    let (mut packed, mut one_by_one) = (vec![7u8], vec![7u8]);
    put_packed_u32s(&mut packed, &vals);
    vals
      .iter()
      .for_each(|&v| put_varint(&mut one_by_one, v as u64));
    assert_eq!(packed, one_by_one);
  }

  #[test]
  fn refuses_truncated_and_overlong_input() {
    assert!(decode_batch(&[0x1a, 0x05, 0x08]).is_err());
    assert!(decode_batch(&[0x08; 11]).is_err());
    assert!(
      decode_batch(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).is_err()
    );
  }
}
