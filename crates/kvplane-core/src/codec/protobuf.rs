//! Protobuf wire format, by hand and message-agnostic: varints, field keys and wire types,
//! length-delimited and packed fields on the writing side; a bounds-checked reader that skips
//! unknown fields on the reading side. Messages (SMG's in `codec::smg`) are built on these.

use super::msgpack::decode_error;
use crate::error::KvResult;

pub const VARINT: u8 = 0;
pub const I64: u8 = 1;
pub const LEN: u8 = 2;
pub const I32: u8 = 5;
/// A group's start and end (proto2's groups; editions' delimited messages use them too).
pub const SGROUP: u8 = 3;
pub const EGROUP: u8 = 4;
/// Groups nested deeper than this in an unknown field are refused (they would be skipped in a loop
/// bounded by the input anyway; the bound keeps a hostile input's cost plain).
const MAX_GROUP_DEPTH: usize = 64;

#[inline]
fn key(field: u32, wire: u8) -> u64 {
  ((field as u64) << 3) | wire as u64
}

#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
  while v >= 0x80 {
    out.push((v as u8) | 0x80);
    v >>= 7;
  }
  out.push(v as u8);
}

/// Appends `vals` as varints (a packed repeated field's body) into room made once; each u32
/// is written branch-free as one 8-byte store of its five 7-bit groups, then the length kept.
pub fn put_packed_u32s(out: &mut Vec<u8>, vals: &[u32]) {
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
pub fn varint_len(v: u64) -> usize {
  (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A field key: its number and wire type.
pub fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
  put_varint(out, key(field, wire));
}

/// Writes a length-delimited field: one byte is reserved for the length prefix, `body` writes,
/// and the prefix is filled in place; a body of 128 bytes or more (rare: a block is ~70) moves
/// right by the extra prefix bytes.
pub fn put_len_delimited(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
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

/// A bytes field (key, length, bytes).
pub fn put_bytes(out: &mut Vec<u8>, field: u32, v: &[u8]) {
  put_key(out, field, LEN);
  put_varint(out, v.len() as u64);
  out.extend_from_slice(v);
}

/// A string field, when present.
pub fn put_str(out: &mut Vec<u8>, field: u32, v: Option<&str>) {
  if let Some(v) = v {
    put_bytes(out, field, v.as_bytes());
  }
}

/// A varint field, when present.
pub fn put_opt_varint(out: &mut Vec<u8>, field: u32, v: Option<u64>) {
  if let Some(v) = v {
    put_key(out, field, VARINT);
    put_varint(out, v);
  }
}

/// A packed repeated varint field of u64s, when not empty.
pub fn put_packed_u64s(out: &mut Vec<u8>, field: u32, vals: &[u64]) {
  if vals.is_empty() {
    return;
  }
  let len: usize = vals.iter().map(|&h| varint_len(h)).sum();
  put_key(out, field, LEN);
  put_varint(out, len as u64);
  for &h in vals {
    put_varint(out, h);
  }
}

/// A bounds-checked protobuf reader.
pub struct Reader<'a> {
  buf: &'a [u8],
  pos: usize,
}

impl<'a> Reader<'a> {
  pub fn new(buf: &'a [u8]) -> Reader<'a> {
    Reader { buf, pos: 0 }
  }

  pub fn err<T>(&self, what: &str) -> KvResult<T> {
    Err(decode_error(format!(
      "protobuf: {what} at byte {}",
      self.pos
    )))
  }

  pub fn done(&self) -> bool {
    self.pos >= self.buf.len()
  }

  pub fn varint(&mut self) -> KvResult<u64> {
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

  pub fn bytes(&mut self) -> KvResult<&'a [u8]> {
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

  pub fn fixed<const N: usize>(&mut self) -> KvResult<[u8; N]> {
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
  pub fn key(&mut self) -> KvResult<(u32, u8)> {
    let k = self.varint()?;
    let field = k >> 3;
    if field == 0 || field > u32::MAX as u64 >> 3 {
      return self.err("invalid field number");
    }
    Ok((field as u32, (k & 7) as u8))
  }

  /// Skips the field whose key `(field, wire)` was just read; a group with all it holds, to the
  /// end that carries its field number (an end of another field is refused, as protobuf's
  /// parsers do).
  pub fn skip(&mut self, field: u32, wire: u8) -> KvResult<()> {
    if wire != SGROUP {
      return self.skip_one(wire);
    }
    let mut open = [0u32; MAX_GROUP_DEPTH];
    open[0] = field;
    let mut depth = 1;
    while depth > 0 {
      if self.done() {
        return self.err("a group never ended");
      }
      match self.key()? {
        (_, SGROUP) if depth == MAX_GROUP_DEPTH => return self.err("groups nested too deep"),
        (field, SGROUP) => {
          open[depth] = field;
          depth += 1;
        }
        (field, EGROUP) if field == open[depth - 1] => depth -= 1,
        (_, EGROUP) => return self.err("a group ended by another field's end"),
        (_, w) => self.skip_one(w)?,
      }
    }
    Ok(())
  }

  fn skip_one(&mut self, wire: u8) -> KvResult<()> {
    match wire {
      VARINT => self.varint().map(|_| ()),
      I64 => self.fixed::<8>().map(|_| ()),
      LEN => self.bytes().map(|_| ()),
      I32 => self.fixed::<4>().map(|_| ()),
      _ => self.err("unsupported wire type"),
    }
  }

  pub fn string(&mut self) -> KvResult<String> {
    match std::str::from_utf8(self.bytes()?) {
      Ok(v) => Ok(v.to_owned()),
      Err(_) => self.err("invalid UTF-8 in a string"),
    }
  }

  /// `Err` unless a known field came with the wire type its declaration says.
  pub fn expect(&self, wire: u8, want: u8) -> KvResult<()> {
    if wire == want {
      Ok(())
    } else {
      self.err("wrong wire type for a known field")
    }
  }

  pub fn varint_field(&mut self, wire: u8) -> KvResult<u64> {
    self.expect(wire, VARINT)?;
    self.varint()
  }

  pub fn string_field(&mut self, wire: u8) -> KvResult<String> {
    self.expect(wire, LEN)?;
    self.string()
  }

  pub fn bytes_field(&mut self, wire: u8) -> KvResult<&'a [u8]> {
    self.expect(wire, LEN)?;
    self.bytes()
  }

  /// Packed or unpacked repeated varints into `out`.
  pub fn repeated_varint(&mut self, wire: u8, out: &mut Vec<u64>) -> KvResult<()> {
    match wire {
      VARINT => out.push(self.varint()?),
      LEN => {
        let mut p = Reader::new(self.bytes()?);
        while !p.done() {
          out.push(p.varint()?);
        }
      }
      _ => return self.err("wrong wire type for a repeated integer"),
    }
    Ok(())
  }
}

#[cfg(test)]
mod tests {
  use super::*;

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
  fn unknown_groups_are_skipped_whole_and_a_stray_end_is_refused() {
    // field 5 as a group holding a varint, a nested group and a string; then field 1 = 7.
    let mut b = Vec::new();
    put_key(&mut b, 5, SGROUP);
    put_key(&mut b, 1, VARINT);
    put_varint(&mut b, 300);
    put_key(&mut b, 2, SGROUP);
    put_key(&mut b, 3, I32);
    b.extend([1, 2, 3, 4]);
    put_key(&mut b, 2, EGROUP);
    put_key(&mut b, 4, LEN);
    put_varint(&mut b, 2);
    b.extend(b"hi");
    put_key(&mut b, 5, EGROUP);
    put_key(&mut b, 1, VARINT);
    put_varint(&mut b, 7);
    let mut r = Reader::new(&b);
    let (field, wire) = r.key().unwrap();
    assert_eq!((field, wire), (5, SGROUP));
    r.skip(field, wire).unwrap();
    assert_eq!(r.key().unwrap(), (1, VARINT));
    assert_eq!(r.varint().unwrap(), 7);
    // An end with no start, a group never ended, and groups nested past the bound.
    let mut stray = Vec::new();
    put_key(&mut stray, 5, EGROUP);
    assert!(skip_err(&stray).contains("unsupported wire type"));
    let mut open = Vec::new();
    put_key(&mut open, 5, SGROUP);
    put_key(&mut open, 1, VARINT);
    put_varint(&mut open, 1);
    assert!(skip_err(&open).contains("never ended"));
    // A group ended by another field's end (field 5 opened, 6 closed), nested or not.
    for nested in [false, true] {
      let mut crossed = Vec::new();
      put_key(&mut crossed, 5, SGROUP);
      if nested {
        put_key(&mut crossed, 2, SGROUP);
        put_key(&mut crossed, 2, EGROUP);
      }
      put_key(&mut crossed, 6, EGROUP);
      put_key(&mut crossed, 5, EGROUP);
      assert!(skip_err(&crossed).contains("another field"));
    }
    let mut deep = Vec::new();
    for _ in 0..100 {
      put_key(&mut deep, 5, SGROUP);
    }
    assert!(skip_err(&deep).contains("too deep"));
  }

  /// Reads the first key of `b` and skips its field: the error's text.
  fn skip_err(b: &[u8]) -> String {
    let mut r = Reader::new(b);
    let (field, wire) = r.key().unwrap();
    r.skip(field, wire).unwrap_err().to_string()
  }

  #[test]
  fn varint_lengths_match_the_encoding() {
    for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
      let mut b = Vec::new();
      put_varint(&mut b, v);
      assert_eq!(b.len(), varint_len(v), "{v}");
      assert_eq!(Reader::new(&b).varint().unwrap(), v);
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
}
