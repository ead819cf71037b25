//! Python pickle protocol 5 (what `pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)` writes on
//! CPython 3.8+) of the tuple vLLM hashes by default: `(parent, (tokens...), extra_keys or None)`.
//!
//! Only the value kinds that tuple holds are written, with CPython's opcode choices: ints take
//! BININT1/BININT2/BININT/LONG1, tuples of 1-3 items TUPLE1-3, bytes and str the short forms
//! below 256 bytes, every bytes/str/tuple is memoized, and the body is split into frames of at
//! least 64 KiB at object boundaries.

use super::options::ExtraKey;

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE_N: [u8; 3] = [0x85, 0x86, 0x87];
const MEMOIZE: u8 = 0x94;
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';

const FRAME_HEADER: usize = 9;
const FRAME_SIZE_MIN: usize = 4;
const FRAME_SIZE_TARGET: usize = 64 * 1024;

/// A pickler writing into a reusable buffer.
pub(super) struct Pickler<'a> {
  out: &'a mut Vec<u8>,
  frame_start: usize,
}

impl<'a> Pickler<'a> {
  /// Starts a protocol 5 pickle in `out` (which is cleared).
  pub(super) fn new(out: &'a mut Vec<u8>) -> Self {
    out.clear();
    out.extend_from_slice(&[PROTO, 5]);
    let mut p = Pickler {
      out,
      frame_start: 0,
    };
    p.open_frame();
    p
  }

  fn open_frame(&mut self) {
    self.frame_start = self.out.len();
    self.out.extend_from_slice(&[0; FRAME_HEADER]);
  }

  fn commit_frame(&mut self) {
    let len = self.out.len() - self.frame_start - FRAME_HEADER;
    if len >= FRAME_SIZE_MIN {
      self.out[self.frame_start] = FRAME;
      self.out[self.frame_start + 1..self.frame_start + FRAME_HEADER]
        .copy_from_slice(&(len as u64).to_le_bytes());
    } else {
      self
        .out
        .drain(self.frame_start..self.frame_start + FRAME_HEADER);
    }
  }

  /// Called before each object is saved, as the pickler does: a full frame is closed there.
  #[inline]
  fn boundary(&mut self) {
    if self.out.len() - self.frame_start - FRAME_HEADER >= FRAME_SIZE_TARGET {
      self.commit_frame();
      self.open_frame();
    }
  }

  /// Writes STOP and closes the last frame.
  pub(super) fn finish(mut self) {
    self.out.push(STOP);
    self.commit_frame();
  }

  pub(super) fn none(&mut self) {
    self.boundary();
    self.out.push(NONE);
  }

  pub(super) fn uint(&mut self, v: u32) {
    self.boundary();
    self.uint_unframed(v);
  }

  #[inline(always)]
  fn uint_unframed(&mut self, v: u32) {
    if v <= 0xff {
      self.out.extend_from_slice(&[BININT1, v as u8]);
    } else if v <= 0xffff {
      self.out.push(BININT2);
      self.out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if v <= i32::MAX as u32 {
      self.out.push(BININT);
      self.out.extend_from_slice(&v.to_le_bytes());
    } else {
      // 2^31 ..= 2^32-1: LONG1 with 5 bytes (4 bytes LE plus a zero sign byte).
      self.out.extend_from_slice(&[LONG1, 5]);
      self.out.extend_from_slice(&v.to_le_bytes());
      self.out.push(0);
    }
  }

  fn int(&mut self, v: i128) {
    if (0..=u32::MAX as i128).contains(&v) {
      return self.uint(v as u32);
    }
    self.boundary();
    if (i32::MIN as i128..0).contains(&v) {
      self.out.push(BININT);
      self.out.extend_from_slice(&(v as i32).to_le_bytes());
    } else {
      let enc = encode_long(v);
      self.out.extend_from_slice(&[LONG1, enc.len() as u8]);
      self.out.extend_from_slice(&enc);
    }
  }

  /// Writes ints, checking for a frame boundary only when the run could cross one.
  fn uints(&mut self, tokens: &[u32]) {
    const MAX_INT_BYTES: usize = 7; // LONG1, length, 5 bytes
    let frame_len = self.out.len() - self.frame_start - FRAME_HEADER;
    if frame_len + tokens.len() * MAX_INT_BYTES < FRAME_SIZE_TARGET {
      self.out.reserve(tokens.len() * MAX_INT_BYTES);
      tokens.iter().for_each(|&t| self.uint_unframed(t));
    } else {
      tokens.iter().for_each(|&t| self.uint(t));
    }
  }

  pub(super) fn bytes(&mut self, b: &[u8]) {
    self.boundary();
    if b.len() <= 0xff {
      self.out.extend_from_slice(&[SHORT_BINBYTES, b.len() as u8]);
    } else {
      self.out.push(BINBYTES);
      self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    }
    self.out.extend_from_slice(b);
    self.out.push(MEMOIZE);
  }

  pub(super) fn str(&mut self, s: &str) {
    self.boundary();
    if s.len() <= 0xff {
      self
        .out
        .extend_from_slice(&[SHORT_BINUNICODE, s.len() as u8]);
    } else {
      self.out.push(BINUNICODE);
      self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    }
    self.out.extend_from_slice(s.as_bytes());
    self.out.push(MEMOIZE);
  }

  /// Writes a tuple whose items are written by `items`, which must write exactly `len` objects.
  pub(super) fn tuple(&mut self, len: usize, items: impl FnOnce(&mut Self)) {
    self.boundary();
    if len == 0 {
      self.out.push(EMPTY_TUPLE);
      return;
    }
    if len <= 3 {
      items(self);
      self.out.push(TUPLE_N[len - 1]);
    } else {
      self.out.push(MARK);
      items(self);
      self.out.push(TUPLE);
    }
    self.out.push(MEMOIZE);
  }

  fn extra_key(&mut self, key: &ExtraKey) {
    match key {
      ExtraKey::Str(s) => self.str(s),
      ExtraKey::Bytes(b) => self.bytes(b),
      ExtraKey::Int(v) => self.int(*v),
      ExtraKey::Tuple(items) => {
        self.tuple(items.len(), |p| items.iter().for_each(|k| p.extra_key(k)))
      }
    }
  }
}

/// Python's `pickle.encode_long`: minimal two's-complement little-endian bytes.
fn encode_long(v: i128) -> Vec<u8> {
  if v == 0 {
    return Vec::new();
  }
  // Python sizes by the magnitude's bit length, then trims a redundant 0xff sign byte.
  let bit_length = 128 - v.unsigned_abs().leading_zeros() as usize;
  let nbytes = (bit_length >> 3) + 1;
  let mut out = v.to_le_bytes()[..nbytes].to_vec();
  if v < 0 && nbytes > 1 && out[nbytes - 1] == 0xff && out[nbytes - 2] & 0x80 != 0 {
    out.pop();
  }
  out
}

/// Writes `(parent, (tokens...), extra)` where `extra` is `None` for Python's `None`.
pub(super) fn block_tuple(
  out: &mut Vec<u8>,
  parent: &[u8],
  tokens: &[u32],
  extra: Option<&[ExtraKey]>,
) {
  let mut p = Pickler::new(out);
  p.tuple(3, |p| {
    p.bytes(parent);
    p.tuple(tokens.len(), |p| p.uints(tokens));
    match extra {
      None => p.none(),
      Some(keys) => p.tuple(keys.len(), |p| keys.iter().for_each(|k| p.extra_key(k))),
    }
  });
  p.finish();
}

/// Writes a pickled `str` (vLLM's `NONE_HASH` input).
pub(super) fn text(out: &mut Vec<u8>, s: &str) {
  let mut p = Pickler::new(out);
  p.str(s);
  p.finish();
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn encode_long_matches_python_for_edge_values() {
    // Values from Python's pickle.encode_long.
    assert_eq!(encode_long(255), [0xff, 0x00]);
    assert_eq!(encode_long(-256), [0x00, 0xff]);
    assert_eq!(encode_long(-128), [0x80]);
    assert_eq!(encode_long(-129), [0x7f, 0xff]);
    assert_eq!(encode_long(1 << 32), [0, 0, 0, 0, 1]);
    assert_eq!(
      encode_long(-(1i128 << 31) - 1),
      [0xff, 0xff, 0xff, 0x7f, 0xff]
    );
    assert_eq!(
      encode_long((1i128 << 64) - 1),
      [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]
    );
  }

  #[test]
  fn pickles_a_short_str_like_cpython() {
    let mut out = Vec::new();
    text(&mut out, "abc");
    // pickle.dumps("abc", protocol=5)
    assert_eq!(
      out,
      b"\x80\x05\x95\x07\x00\x00\x00\x00\x00\x00\x00\x8c\x03abc\x94."
    );
  }
}
