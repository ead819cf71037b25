//! Decoders on arbitrary bytes: random inputs and mutated golden fixtures, every dialect. Each
//! input must decode or fail with `ERR_DECODE` (never panic), and whatever decodes must re-encode
//! to vLLM's format and decode again to the same bytes. The relay's decoder into columns must
//! agree with the whole-event one on every msgpack input. `KVPLANE_FUZZ_INPUTS` sets the total (default 2,000,000
//! in release builds, 50,000 in debug ones).

use kvplane_core::codec::{self, Dialect, Format};
use kvplane_core::event::{EventRef, KvEvent};
use kvplane_core::ErrorCode;

struct Rng(u64);

impl Rng {
  fn next(&mut self) -> u64 {
    // xorshift64*
    self.0 ^= self.0 >> 12;
    self.0 ^= self.0 << 25;
    self.0 ^= self.0 >> 27;
    self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
  }

  fn below(&mut self, n: usize) -> usize {
    (self.next() % n.max(1) as u64) as usize
  }
}

const DIALECTS: [Dialect; 5] = [
  Dialect::Vllm,
  Dialect::Sglang,
  Dialect::Trtllm,
  Dialect::TrtllmJson,
  Dialect::SmgProto,
];

fn seeds() -> Vec<(Dialect, Vec<u8>)> {
  let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/codec.json");
  let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
  f["cases"]
    .as_array()
    .unwrap()
    .iter()
    .filter(|c| c["payload"].as_str().unwrap().len() < 20_000)
    .map(|c| {
      let h = c["payload"].as_str().unwrap();
      let bytes = (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect();
      (
        Dialect::parse(c["dialect"].as_str().unwrap()).unwrap(),
        bytes,
      )
    })
    .collect()
}

/// Interesting bytes: msgpack markers, varint edges, JSON punctuation.
const MAGIC: &[u8] = &[
  0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc4, 0xcb, 0xcc, 0xcf, 0xd3, 0xd9,
  0xdc, 0xdd, 0xde, 0xdf, 0xff, b'[', b']', b'{', b'}', b'"', b',', b':', b'-', b'0',
];

fn mutate(r: &mut Rng, input: &[u8]) -> Vec<u8> {
  let mut b = input.to_vec();
  for _ in 0..1 + r.below(4) {
    match r.below(6) {
      0 if !b.is_empty() => {
        let i = r.below(b.len());
        b[i] ^= 1 << r.below(8);
      }
      1 if !b.is_empty() => {
        let i = r.below(b.len());
        b[i] = MAGIC[r.below(MAGIC.len())];
      }
      2 => {
        let cut = r.below(b.len() + 1);
        b.truncate(cut);
      }
      3 => {
        let i = r.below(b.len() + 1);
        b.insert(i, MAGIC[r.below(MAGIC.len())]);
      }
      4 if b.len() > 2 => {
        let i = r.below(b.len());
        let n = r.below(b.len() - i).min(16);
        b.drain(i..i + n);
      }
      _ if !b.is_empty() => {
        // Duplicate a slice (repeats headers and nested values).
        let i = r.below(b.len());
        let n = r.below(b.len() - i).min(32);
        let s: Vec<u8> = b[i..i + n].to_vec();
        let at = r.below(b.len() + 1);
        b.splice(at..at, s);
      }
      _ => b.push(r.next() as u8),
    }
  }
  b
}

/// The relay's decoder (a chunk of columns where events allow) against the whole-event one: it
/// decodes what they decode, to the same events, and each format writes them to the same bytes.
/// The events read into columns.
fn check_chunks(dialect: Dialect, bytes: &[u8]) -> u64 {
  let whole = codec::decode(bytes, dialect);
  let chunks = codec::decode_all_chunks(&[bytes], dialect);
  let (whole, chunks) = match (whole, chunks) {
    (Ok(w), Ok(c)) => (w, c),
    (Err(w), Err(c)) => {
      assert_eq!((w.code, w.message), (c.code, c.message));
      return 0;
    }
    (w, c) => panic!("whole {w:?} against chunks {c:?}"),
  };
  assert_eq!(whole.batches.len(), chunks.len());
  let mut columns = 0;
  for (b, c) in whole.batches.iter().zip(&chunks) {
    assert_eq!((b.ts.to_bits(), b.dp_rank), (c.ts.to_bits(), c.dp_rank));
    let views: Vec<EventRef<'_>> = c.chunk.iter().collect();
    assert_eq!(views.len(), b.events.len());
    columns += views
      .iter()
      .filter(|v| match v {
        EventRef::Stored(s) => s.chunk_attrs().is_some(),
        EventRef::Removed(r) => r.chunk_attrs().is_some(),
        _ => false,
      })
      .count() as u64;
    for fmt in [
      Format::Vllm,
      Format::VllmLegacy,
      Format::Sglang,
      Format::SmgProto,
    ] {
      assert_eq!(
        codec::encode_events(7, b.ts, &views, b.dp_rank, fmt),
        codec::encode_events(
          7,
          b.ts,
          &b.events.iter().map(EventRef::of).collect::<Vec<_>>(),
          b.dp_rank,
          fmt
        ),
        "{fmt:?}"
      );
    }
  }
  columns
}

fn check(dialect: Dialect, bytes: &[u8], stats: &mut [u64; 4]) {
  if matches!(dialect, Dialect::Vllm | Dialect::Sglang | Dialect::Trtllm) {
    stats[3] += check_chunks(dialect, bytes);
  }
  match codec::decode(bytes, dialect) {
    Err(e) => {
      assert_eq!(e.code, ErrorCode::Decode, "{e}");
      stats[1] += 1;
    }
    Ok(d) => {
      stats[0] += 1;
      let _ = codec::check_layout(&d.batches);
      for b in &d.batches {
        for fmt in [
          Format::Vllm,
          Format::VllmLegacy,
          Format::Sglang,
          Format::SmgProto,
        ] {
          let _ = codec::encode(b, fmt);
        }
        // vLLM's map encoding keeps everything the model holds: it must decode back the same.
        // (Compared as bytes: a NaN inside an opaque value is not equal to itself.)
        let once = codec::encode(b, Format::Vllm);
        let again = codec::decode(&once, Dialect::Vllm).unwrap();
        assert_eq!(
          again.batches[0].events.len(),
          b.events
            .iter()
            .filter(|e| !matches!(e, KvEvent::Updated(_) | KvEvent::Created(_)))
            .count()
        );
        assert_eq!(codec::encode(&again.batches[0], Format::Vllm), once);
        stats[2] += 1;
      }
    }
  }
}

#[test]
fn decoders_never_panic_on_random_or_mutated_bytes() {
  let total: u64 = std::env::var("KVPLANE_FUZZ_INPUTS")
    .ok()
    .and_then(|v| v.parse().ok())
    .unwrap_or(if cfg!(debug_assertions) {
      50_000
    } else {
      2_000_000
    });
  let seeds = seeds();
  let mut r = Rng(0x9e37_79b9_7f4a_7c15);
  let mut stats = [0u64; 4];
  for i in 0..total {
    if i % 8 == 0 {
      // Pure noise, any dialect.
      let n = r.below(64);
      let bytes: Vec<u8> = (0..n).map(|_| r.next() as u8).collect();
      check(DIALECTS[r.below(DIALECTS.len())], &bytes, &mut stats);
    } else {
      let (dialect, seed) = &seeds[r.below(seeds.len())];
      let bytes = mutate(&mut r, seed);
      check(*dialect, &bytes, &mut stats);
    }
  }
  eprintln!(
    "{total} inputs: {} decoded, {} refused with ERR_DECODE, {} vLLM round trips, {} events read into columns",
    stats[0], stats[1], stats[2], stats[3]
  );
  assert!(stats[0] > total / 50 && stats[1] > total / 50, "{stats:?}");
  assert!(stats[3] > total / 500, "{stats:?}");
}
