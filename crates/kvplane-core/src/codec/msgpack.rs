//! MessagePack primitives: a bounds-checked, zero-copy reader and a writer that follows msgspec's
//! choices byte for byte (docs/protocol.md#msgpack-encoding-rules): ints in their smallest form,
//! floats as float64, strings as fixstr/str8/16/32, bytes as bin8/16/32.

use crate::error::{ErrorCode, KvError, KvResult};

/// Deepest nesting an opaque value may have (deeper input is refused, never a stack overflow).
pub const MAX_DEPTH: usize = 64;

/// A msgpack integer as it was on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int {
  /// A non-negative value (positive fixint or uint8..64, or a non-negative intN).
  U(u64),
  /// A negative value (negative fixint or int8..64).
  I(i64),
}

impl Int {
  /// The 64 bits, two's complement for negatives (how engine hashes map to u64).
  pub fn bits(self) -> u64 {
    match self {
      Int::U(v) => v,
      Int::I(v) => v as u64,
    }
  }

  pub fn as_i64(self) -> Option<i64> {
    match self {
      Int::U(v) => i64::try_from(v).ok(),
      Int::I(v) => Some(v),
    }
  }
}

/// What the next value is, from its marker byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
  Nil,
  Bool,
  Int,
  Float,
  Str,
  Bin,
  Array,
  Map,
  Ext,
  /// 0xc1, never valid.
  Reserved,
}

pub fn decode_error(message: impl Into<String>) -> KvError {
  KvError::new(ErrorCode::Decode, message)
}

/// A cursor over msgpack bytes; every read is bounds-checked and fails with `ERR_DECODE`.
#[derive(Clone)]
pub struct Reader<'a> {
  buf: &'a [u8],
  pos: usize,
}

impl<'a> Reader<'a> {
  pub fn new(buf: &'a [u8]) -> Reader<'a> {
    Reader { buf, pos: 0 }
  }

  pub fn pos(&self) -> usize {
    self.pos
  }

  pub fn is_at_end(&self) -> bool {
    self.pos == self.buf.len()
  }

  fn err<T>(&self, what: &str) -> KvResult<T> {
    Err(decode_error(format!(
      "msgpack: {what} at byte {}",
      self.pos
    )))
  }

  #[inline]
  fn take(&mut self, n: usize) -> KvResult<&'a [u8]> {
    let end = self.pos.saturating_add(n);
    match self.buf.get(self.pos..end) {
      Some(s) => {
        self.pos = end;
        Ok(s)
      }
      None => self.err("truncated input"),
    }
  }

  #[inline]
  fn u8(&mut self) -> KvResult<u8> {
    match self.buf.get(self.pos) {
      Some(&b) => {
        self.pos += 1;
        Ok(b)
      }
      None => self.err("truncated input"),
    }
  }

  #[inline]
  fn be<const N: usize>(&mut self) -> KvResult<[u8; N]> {
    let s = self.take(N)?;
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    Ok(a)
  }

  #[inline]
  pub fn peek_kind(&self) -> KvResult<Kind> {
    let Some(&m) = self.buf.get(self.pos) else {
      return self.err("truncated input");
    };
    Ok(match m {
      0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
      0x80..=0x8f | 0xde | 0xdf => Kind::Map,
      0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
      0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
      0xc0 => Kind::Nil,
      0xc2 | 0xc3 => Kind::Bool,
      0xc4..=0xc6 => Kind::Bin,
      0xca | 0xcb => Kind::Float,
      0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
      0xc1 => Kind::Reserved,
    })
  }

  /// Consumes a nil if one is next.
  #[inline]
  pub fn try_nil(&mut self) -> bool {
    if self.buf.get(self.pos) == Some(&0xc0) {
      self.pos += 1;
      true
    } else {
      false
    }
  }

  pub fn read_bool(&mut self) -> KvResult<bool> {
    match self.u8()? {
      0xc2 => Ok(false),
      0xc3 => Ok(true),
      _ => {
        self.pos -= 1;
        self.err("expected a bool")
      }
    }
  }

  #[inline]
  pub fn read_int(&mut self) -> KvResult<Int> {
    let m = self.u8()?;
    Ok(match m {
      0x00..=0x7f => Int::U(m as u64),
      0xe0..=0xff => Int::I(m as i8 as i64),
      0xcc => Int::U(self.u8()? as u64),
      0xcd => Int::U(u16::from_be_bytes(self.be()?) as u64),
      0xce => Int::U(u32::from_be_bytes(self.be()?) as u64),
      0xcf => Int::U(u64::from_be_bytes(self.be()?)),
      0xd0 => signed(self.u8()? as i8 as i64),
      0xd1 => signed(i16::from_be_bytes(self.be()?) as i64),
      0xd2 => signed(i32::from_be_bytes(self.be()?) as i64),
      0xd3 => signed(i64::from_be_bytes(self.be()?)),
      _ => {
        self.pos -= 1;
        return self.err("expected an integer");
      }
    })
  }

  /// A float64/float32, or an integer read as a float.
  pub fn read_f64(&mut self) -> KvResult<f64> {
    match self.buf.get(self.pos) {
      Some(0xcb) => {
        self.pos += 1;
        Ok(f64::from_be_bytes(self.be()?))
      }
      Some(0xca) => {
        self.pos += 1;
        Ok(f32::from_be_bytes(self.be()?) as f64)
      }
      _ => match self.read_int()? {
        Int::U(v) => Ok(v as f64),
        Int::I(v) => Ok(v as f64),
      },
    }
  }

  #[inline]
  pub fn read_array_len(&mut self) -> KvResult<usize> {
    let m = self.u8()?;
    let n = match m {
      0x90..=0x9f => (m & 0x0f) as usize,
      0xdc => u16::from_be_bytes(self.be()?) as usize,
      0xdd => u32::from_be_bytes(self.be()?) as usize,
      _ => {
        self.pos -= 1;
        return self.err("expected an array");
      }
    };
    self.check_items(n)
  }

  #[inline]
  pub fn read_map_len(&mut self) -> KvResult<usize> {
    let m = self.u8()?;
    let n = match m {
      0x80..=0x8f => (m & 0x0f) as usize,
      0xde => u16::from_be_bytes(self.be()?) as usize,
      0xdf => u32::from_be_bytes(self.be()?) as usize,
      _ => {
        self.pos -= 1;
        return self.err("expected a map");
      }
    };
    self.check_items(n.saturating_mul(2)).map(|_| n)
  }

  /// Reads unsigned ints that fit a u32 (fixint, uint8/16/32: how every engine writes token
  /// ids) into `out` until it holds `n` items or the next value has another form; the caller
  /// reads what is left the general way.
  #[inline]
  pub fn read_u32_run(&mut self, n: usize, out: &mut Vec<u32>) {
    let buf = self.buf;
    let mut pos = self.pos;
    while out.len() < n {
      let Some(&m) = buf.get(pos) else { break };
      let (v, len) = match m {
        0x00..=0x7f => (m as u32, 1),
        0xcc => match buf.get(pos + 1) {
          Some(&b) => (b as u32, 2),
          None => break,
        },
        0xcd => match buf.get(pos + 1..pos + 3) {
          Some(b) => (u16::from_be_bytes([b[0], b[1]]) as u32, 3),
          None => break,
        },
        0xce => match buf.get(pos + 1..pos + 5) {
          Some(b) => (u32::from_be_bytes([b[0], b[1], b[2], b[3]]), 5),
          None => break,
        },
        _ => break,
      };
      out.push(v);
      pos += len;
    }
    self.pos = pos;
  }

  /// Every item takes at least one byte: a count beyond the bytes left is corrupt input (and
  /// must not drive an allocation).
  #[inline]
  fn check_items(&self, n: usize) -> KvResult<usize> {
    if n > self.buf.len() - self.pos {
      return self.err("a length beyond the end of the input");
    }
    Ok(n)
  }

  #[inline]
  pub fn read_str(&mut self) -> KvResult<&'a str> {
    let bytes = self.read_str_bytes()?;
    match std::str::from_utf8(bytes) {
      Ok(s) => Ok(s),
      Err(_) => self.err("invalid UTF-8 in a string"),
    }
  }

  /// A string's bytes, not checked as UTF-8: for keys and tags compared with known ASCII
  /// names, where a string that is not one of them is skipped anyway.
  #[inline]
  pub fn read_str_bytes(&mut self) -> KvResult<&'a [u8]> {
    let m = self.u8()?;
    let n = match m {
      0xa0..=0xbf => (m & 0x1f) as usize,
      0xd9 => self.u8()? as usize,
      0xda => u16::from_be_bytes(self.be()?) as usize,
      0xdb => u32::from_be_bytes(self.be()?) as usize,
      _ => {
        self.pos -= 1;
        return self.err("expected a string");
      }
    };
    self.take(n)
  }

  pub fn read_bin(&mut self) -> KvResult<&'a [u8]> {
    let m = self.u8()?;
    let n = match m {
      0xc4 => self.u8()? as usize,
      0xc5 => u16::from_be_bytes(self.be()?) as usize,
      0xc6 => u32::from_be_bytes(self.be()?) as usize,
      _ => {
        self.pos -= 1;
        return self.err("expected bytes");
      }
    };
    self.take(n)
  }

  /// Reads an optional string (nil → `None`).
  pub fn read_opt_str(&mut self) -> KvResult<Option<&'a str>> {
    if self.try_nil() {
      Ok(None)
    } else {
      self.read_str().map(Some)
    }
  }

  /// Skips one value of any type, nested ones included, without recursion.
  pub fn skip(&mut self) -> KvResult<()> {
    let mut pending: usize = 1;
    while pending > 0 {
      pending -= 1;
      let m = self.u8()?;
      let extra = match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
        0x80..=0x8f => {
          pending = pending.saturating_add(2 * (m & 0x0f) as usize);
          0
        }
        0x90..=0x9f => {
          pending = pending.saturating_add((m & 0x0f) as usize);
          0
        }
        0xa0..=0xbf => (m & 0x1f) as usize,
        0xcc | 0xd0 => 1,
        0xcd | 0xd1 => 2,
        0xce | 0xd2 | 0xca => 4,
        0xcf | 0xd3 | 0xcb => 8,
        0xd4 => 2,
        0xd5 => 3,
        0xd6 => 5,
        0xd7 => 9,
        0xd8 => 17,
        0xc4 | 0xd9 => self.u8()? as usize,
        0xc5 | 0xda => u16::from_be_bytes(self.be()?) as usize,
        0xc6 | 0xdb => u32::from_be_bytes(self.be()?) as usize,
        0xc7 => 1 + self.u8()? as usize,
        0xc8 => 1 + u16::from_be_bytes(self.be()?) as usize,
        0xc9 => 1 + u32::from_be_bytes(self.be()?) as usize,
        0xdc => {
          let n = u16::from_be_bytes(self.be()?) as usize;
          pending = pending.saturating_add(n);
          0
        }
        0xdd => {
          let n = u32::from_be_bytes(self.be()?) as usize;
          pending = pending.saturating_add(n);
          0
        }
        0xde => {
          let n = u16::from_be_bytes(self.be()?) as usize;
          pending = pending.saturating_add(2 * n);
          0
        }
        0xdf => {
          let n = u32::from_be_bytes(self.be()?) as usize;
          pending = pending.saturating_add(2usize.saturating_mul(n));
          0
        }
        0xc1 => {
          self.pos -= 1;
          return self.err("reserved marker 0xc1");
        }
      };
      if pending > self.buf.len() - self.pos {
        return self.err("a length beyond the end of the input");
      }
      self.take(extra)?;
    }
    Ok(())
  }
}

#[inline]
fn signed(v: i64) -> Int {
  if v >= 0 {
    Int::U(v as u64)
  } else {
    Int::I(v)
  }
}

/// Appends msgpack to a `Vec<u8>` the way msgspec writes it.
#[derive(Default)]
pub struct Writer {
  pub buf: Vec<u8>,
}

impl Writer {
  pub fn new() -> Writer {
    Writer { buf: Vec::new() }
  }

  pub fn with_capacity(n: usize) -> Writer {
    Writer {
      buf: Vec::with_capacity(n),
    }
  }

  pub fn into_inner(self) -> Vec<u8> {
    self.buf
  }

  #[inline]
  pub fn nil(&mut self) {
    self.buf.push(0xc0);
  }

  #[inline]
  pub fn bool(&mut self, v: bool) {
    self.buf.push(if v { 0xc3 } else { 0xc2 });
  }

  #[inline]
  pub fn uint(&mut self, v: u64) {
    let b = &mut self.buf;
    if v < 0x80 {
      b.push(v as u8);
    } else if v <= 0xff {
      b.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= 0xffff {
      b.push(0xcd);
      b.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
      b.push(0xce);
      b.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
      b.push(0xcf);
      b.extend_from_slice(&v.to_be_bytes());
    }
  }

  #[inline]
  pub fn int(&mut self, v: i64) {
    if v >= 0 {
      return self.uint(v as u64);
    }
    let b = &mut self.buf;
    if v >= -32 {
      b.push(v as i8 as u8);
    } else if v >= i8::MIN as i64 {
      b.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i16::MIN as i64 {
      b.push(0xd1);
      b.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i32::MIN as i64 {
      b.push(0xd2);
      b.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
      b.push(0xd3);
      b.extend_from_slice(&v.to_be_bytes());
    }
  }

  #[inline]
  pub fn f64(&mut self, v: f64) {
    self.buf.push(0xcb);
    self.buf.extend_from_slice(&v.to_be_bytes());
  }

  #[inline]
  pub fn str(&mut self, s: &str) {
    let n = s.len();
    let b = &mut self.buf;
    if n < 32 {
      b.push(0xa0 | n as u8);
    } else if n <= 0xff {
      b.extend_from_slice(&[0xd9, n as u8]);
    } else if n <= 0xffff {
      b.push(0xda);
      b.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
      b.push(0xdb);
      b.extend_from_slice(&(n as u32).to_be_bytes());
    }
    b.extend_from_slice(s.as_bytes());
  }

  pub fn opt_str(&mut self, s: Option<&str>) {
    match s {
      Some(s) => self.str(s),
      None => self.nil(),
    }
  }

  pub fn bin(&mut self, v: &[u8]) {
    let n = v.len();
    let b = &mut self.buf;
    if n <= 0xff {
      b.extend_from_slice(&[0xc4, n as u8]);
    } else if n <= 0xffff {
      b.push(0xc5);
      b.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
      b.push(0xc6);
      b.extend_from_slice(&(n as u32).to_be_bytes());
    }
    b.extend_from_slice(v);
  }

  /// An array of u32s, each as the smallest uint (as `uint` writes it), into room made once for
  /// the whole array. Branch-free per value: token ids are random enough that a branch per width
  /// mispredicts about every other value.
  #[inline]
  pub fn u32_array(&mut self, v: &[u32]) {
    self.array_len(v.len());
    let start = self.buf.len();
    // 5 bytes at most per value, plus slack for the last 8-byte store.
    self.buf.resize(start + v.len() * 5 + 8, 0);
    let out = &mut self.buf[start..];
    let mut n = 0;
    for &t in v {
      let w = t as u64;
      let (wide8, wide16, wide32) = (t >= 0x80, t > 0xff, t > 0xffff);
      // Each form is selected without a branch (conditional moves).
      let mut form = w;
      form = if wide8 { 0xcc | w << 8 } else { form };
      form = if wide16 {
        0xcd | ((t as u16).swap_bytes() as u64) << 8
      } else {
        form
      };
      form = if wide32 {
        0xce | (t.swap_bytes() as u64) << 8
      } else {
        form
      };
      out[n..n + 8].copy_from_slice(&form.to_le_bytes());
      // 1, 2, 3 or 5 bytes
      n += 1 + wide8 as usize + wide16 as usize + 2 * wide32 as usize;
    }
    self.buf.truncate(start + n);
  }

  pub fn array_len(&mut self, n: usize) {
    let b = &mut self.buf;
    if n < 16 {
      b.push(0x90 | n as u8);
    } else if n <= 0xffff {
      b.push(0xdc);
      b.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
      b.push(0xdd);
      b.extend_from_slice(&(n as u32).to_be_bytes());
    }
  }

  #[inline]
  pub fn map_len(&mut self, n: usize) {
    self.struct_map_len(n, n);
  }

  /// A map header whose width comes from `declared` (msgspec sizes a struct's header by its
  /// declared fields + tag) while the count is the `present` entries.
  #[inline]
  pub fn struct_map_len(&mut self, present: usize, declared: usize) {
    let b = &mut self.buf;
    if declared < 16 {
      b.push(0x80 | present as u8);
    } else if declared <= 0xffff {
      b.push(0xde);
      b.extend_from_slice(&(present as u16).to_be_bytes());
    } else {
      b.push(0xdf);
      b.extend_from_slice(&(present as u32).to_be_bytes());
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  fn ints() -> Vec<i64> {
    vec![
      0,
      1,
      127,
      128,
      255,
      256,
      65535,
      65536,
      -1,
      -32,
      -33,
      -128,
      -129,
      -32768,
      -32769,
      i32::MIN as i64,
      i32::MIN as i64 - 1,
      i64::MIN,
      i64::MAX,
    ]
  }

  #[test]
  fn integers_round_trip_in_their_smallest_form() {
    for v in ints() {
      let mut w = Writer::new();
      w.int(v);
      let mut r = Reader::new(&w.buf);
      assert_eq!(r.read_int().unwrap().as_i64(), Some(v), "{v}");
      assert!(r.is_at_end());
    }
    let mut w = Writer::new();
    w.uint(u64::MAX);
    assert_eq!(w.buf[0], 0xcf);
    assert_eq!(Reader::new(&w.buf).read_int().unwrap(), Int::U(u64::MAX));
  }

  #[test]
  fn writes_u32_arrays_as_uint_would() {
    let edges = [0u32, 127, 128, 255, 256, 65_535, 65_536, u32::MAX];
    // and 1000 values of every width, after other content
    let mut x = 0x9E37_79B9u32;
    let mixed: Vec<u32> = (0..1000)
      .map(|i| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x >> (8 * (i % 4))
      })
      .collect();
    for vals in [&edges[..], &mixed[..], &[][..]] {
      let mut a = Writer::new();
      a.uint(300);
      a.u32_array(vals);
      let mut b = Writer::new();
      b.uint(300);
      b.array_len(vals.len());
      vals.iter().for_each(|&v| b.uint(v as u64));
      assert_eq!(a.buf, b.buf);
    }
  }

  #[test]
  fn reads_a_run_of_u32s_up_to_the_first_other_form() {
    let vals: [u64; 8] = [0, 127, 128, 255, 256, 65_535, 65_536, u32::MAX as u64];
    let mut w = Writer::new();
    vals.iter().for_each(|&v| w.uint(v));
    w.int(-1);
    w.uint(7);
    let mut r = Reader::new(&w.buf);
    let mut out = Vec::new();
    r.read_u32_run(100, &mut out);
    assert_eq!(out.iter().map(|&v| v as u64).collect::<Vec<_>>(), vals);
    assert_eq!(
      r.read_int().unwrap(),
      Int::I(-1),
      "stops before a negative int"
    );
    let mut out = Vec::new();
    let mut r = Reader::new(&w.buf);
    r.read_u32_run(3, &mut out);
    assert_eq!(
      (out.len(), r.read_int().unwrap()),
      (3, Int::U(255)),
      "stops at n"
    );
    // A truncated uint32 is left for the general reader, which reports it.
    let mut r = Reader::new(&w.buf[..w.buf.len() - 10]);
    let mut out = Vec::new();
    r.read_u32_run(100, &mut out);
    assert_eq!(out.len(), 6);
    assert_eq!(r.read_int().unwrap_err().code, crate::ErrorCode::Decode);
    let mut w = Writer::new();
    w.uint(u32::MAX as u64 + 1);
    let mut r = Reader::new(&w.buf);
    r.read_u32_run(1, &mut out);
    assert_eq!((out.len(), r.pos()), (6, 0), "a uint64 is not a u32");
  }

  #[test]
  fn skips_nested_values_and_refuses_truncation() {
    let mut w = Writer::new();
    w.array_len(3);
    w.map_len(1);
    w.str("k");
    w.bin(&[1, 2, 3]);
    w.f64(1.5);
    w.array_len(0);
    let mut r = Reader::new(&w.buf);
    r.skip().unwrap();
    assert!(r.is_at_end());
    for cut in 0..w.buf.len() {
      assert!(Reader::new(&w.buf[..cut]).skip().is_err());
    }
  }

  #[test]
  fn refuses_huge_declared_lengths_without_allocating() {
    let bytes = [0xdd, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(
      Reader::new(&bytes).read_array_len().unwrap_err().code,
      ErrorCode::Decode
    );
    assert!(Reader::new(&bytes).skip().is_err());
  }
}
