//! Canonical CBOR (RFC 8949 §4.2, what `cbor2.dumps(canonical=True)` writes) of the tuple vLLM
//! hashes: `[parent digest, [tokens...], extra_keys or null]`. Only the value kinds that tuple can
//! hold are written; every integer takes its shortest head.

use super::options::ExtraKey;

const UINT: u8 = 0;
const NEGINT: u8 = 1;
const BYTES: u8 = 2;
const TEXT: u8 = 3;
const ARRAY: u8 = 4;
const NULL: u8 = 0xf6;

#[inline]
fn head(out: &mut Vec<u8>, major: u8, v: u64) {
  let m = major << 5;
  if v < 24 {
    out.push(m | v as u8);
  } else if v <= u8::MAX as u64 {
    out.extend_from_slice(&[m | 24, v as u8]);
  } else if v <= u16::MAX as u64 {
    out.push(m | 25);
    out.extend_from_slice(&(v as u16).to_be_bytes());
  } else if v <= u32::MAX as u64 {
    out.push(m | 26);
    out.extend_from_slice(&(v as u32).to_be_bytes());
  } else {
    out.push(m | 27);
    out.extend_from_slice(&v.to_be_bytes());
  }
}

/// Writes a text string.
pub(super) fn text(out: &mut Vec<u8>, s: &str) {
  head(out, TEXT, s.len() as u64);
  out.extend_from_slice(s.as_bytes());
}

fn extra_key(out: &mut Vec<u8>, key: &ExtraKey) {
  match key {
    ExtraKey::Str(s) => text(out, s),
    ExtraKey::Bytes(b) => {
      head(out, BYTES, b.len() as u64);
      out.extend_from_slice(b);
    }
    // Validated range: -2^64 ..= 2^64 - 1, so both arms fit a u64 head.
    ExtraKey::Int(v) if *v >= 0 => head(out, UINT, *v as u64),
    ExtraKey::Int(v) => head(out, NEGINT, (-1 - *v) as u64),
    ExtraKey::Tuple(items) => {
      head(out, ARRAY, items.len() as u64);
      items.iter().for_each(|k| extra_key(out, k));
    }
  }
}

/// Appends the unsigned ints `tokens` (the hot loop: written into a pre-sized slice, not pushed).
#[inline]
fn uints(out: &mut Vec<u8>, tokens: &[u32]) {
  let start = out.len();
  out.resize(start + tokens.len() * 5, 0);
  let buf = &mut out[start..];
  let mut n = 0;
  for &t in tokens {
    let be = t.to_be_bytes();
    if t < 24 {
      buf[n] = t as u8;
      n += 1;
    } else if t <= 0xff {
      buf[n..n + 2].copy_from_slice(&[24, t as u8]);
      n += 2;
    } else if t <= 0xffff {
      buf[n..n + 3].copy_from_slice(&[25, be[2], be[3]]);
      n += 3;
    } else {
      buf[n..n + 5].copy_from_slice(&[26, be[0], be[1], be[2], be[3]]);
      n += 5;
    }
  }
  out.truncate(start + n);
}

/// Writes `[parent, [tokens...], extra]` where `extra` is `None` for CBOR null.
pub(super) fn block_tuple(
  out: &mut Vec<u8>,
  parent: &[u8],
  tokens: &[u32],
  extra: Option<&[ExtraKey]>,
) {
  out.push((ARRAY << 5) | 3);
  head(out, BYTES, parent.len() as u64);
  out.extend_from_slice(parent);
  head(out, ARRAY, tokens.len() as u64);
  uints(out, tokens);
  match extra {
    None => out.push(NULL),
    Some(keys) => {
      head(out, ARRAY, keys.len() as u64);
      keys.iter().for_each(|k| extra_key(out, k));
    }
  }
}

#[cfg(test)]
mod tests {
  use super::*;

  #[test]
  fn integer_heads_take_the_shortest_form() {
    let cases: [(u64, &[u8]); 6] = [
      (23, &[0x17]),
      (24, &[0x18, 24]),
      (255, &[0x18, 0xff]),
      (256, &[0x19, 1, 0]),
      (65536, &[0x1a, 0, 1, 0, 0]),
      (1 << 32, &[0x1b, 0, 0, 0, 1, 0, 0, 0, 0]),
    ];
    for (v, want) in cases {
      let mut out = Vec::new();
      head(&mut out, UINT, v);
      assert_eq!(out, want, "{v}");
    }
  }

  #[test]
  fn negative_integers_use_major_type_one() {
    let mut out = Vec::new();
    extra_key(&mut out, &ExtraKey::Int(-1));
    extra_key(&mut out, &ExtraKey::Int(-(1i128 << 64)));
    assert_eq!(
      out,
      [0x20, 0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]
    );
  }
}
