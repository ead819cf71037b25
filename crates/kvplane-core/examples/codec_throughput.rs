//! Core codec throughput on a file of vLLM payloads (each prefixed by its u32 LE length), for
//! bench/codec.mjs: decodes every payload, then encodes the decoded batches back, best of N
//! rounds; checks the re-encoding is byte-identical. Prints JSON.
//!
//!   cargo run --release -p kvplane-core --example codec_throughput -- payloads.bin [rounds]

use kvplane_core::codec::{self, Dialect, Format};
use std::time::Instant;

fn main() {
  let mut args = std::env::args().skip(1);
  let path = args.next().expect("payload file");
  let rounds: usize = args.next().map_or(5, |r| r.parse().expect("rounds"));
  let data = std::fs::read(&path).expect("read payloads");
  let mut payloads = Vec::new();
  let mut at = 0;
  while at < data.len() {
    let n = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
    payloads.push(&data[at + 4..at + 4 + n]);
    at += 4 + n;
  }
  let events: usize = payloads
    .iter()
    .map(|p| {
      codec::decode(p, Dialect::Vllm).unwrap().batches[0]
        .events
        .len()
    })
    .sum();
  let (mut best_dec, mut best_enc) = (f64::MAX, f64::MAX);
  for _ in 0..rounds {
    let t = Instant::now();
    let batches: Vec<_> = payloads
      .iter()
      .map(|p| codec::decode(p, Dialect::Vllm).unwrap().batches.remove(0))
      .collect();
    best_dec = best_dec.min(t.elapsed().as_secs_f64());
    let t = Instant::now();
    let encoded: Vec<Vec<u8>> = batches
      .iter()
      .map(|b| codec::encode(b, Format::Vllm))
      .collect();
    best_enc = best_enc.min(t.elapsed().as_secs_f64());
    for (e, p) in encoded.iter().zip(&payloads) {
      assert_eq!(&e[..], *p, "re-encoding differs");
    }
  }
  println!("{{\"events\":{events},\"decode_s\":{best_dec},\"encode_s\":{best_enc}}}");
}
