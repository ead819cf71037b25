//! Native reference for the hashing bench: the same chained XXH3 block hashes, computed directly
//! with xxhash-rust (not through kvplane) over a file of u32 LE tokens.
//!
//! usage: xxh3_native_ref <tokens.u32le> <block_size>
//! Then, for each line `<runs>` on stdin, prints `{"seconds": best, "checksum": "..."}`: the
//! bench drives it between its own measurements so both see the same machine conditions.

use std::io::{BufRead, Write};
use std::time::Instant;
use xxhash_rust::xxh3::xxh3_64_with_seed;

fn chain(bytes: &[u8], block_bytes: usize, out: &mut Vec<u64>) {
  out.clear();
  let mut prev: Option<u64> = None;
  for block in bytes.chunks_exact(block_bytes) {
    let content = xxh3_64_with_seed(block, 1337);
    let h = match prev {
      None => content,
      Some(p) => {
        let mut pair = [0u8; 16];
        pair[..8].copy_from_slice(&p.to_le_bytes());
        pair[8..].copy_from_slice(&content.to_le_bytes());
        xxh3_64_with_seed(&pair, 1337)
      }
    };
    out.push(h);
    prev = Some(h);
  }
}

fn main() {
  let args: Vec<String> = std::env::args().collect();
  let bytes = std::fs::read(&args[1]).expect("token file");
  let block_size: usize = args[2].parse().unwrap();
  let mut out = Vec::with_capacity(bytes.len() / 4 / block_size);
  let stdout = std::io::stdout();
  for line in std::io::stdin().lock().lines() {
    let runs: usize = line.unwrap().trim().parse().unwrap_or(1);
    let mut best = f64::MAX;
    for _ in 0..runs.max(1) {
      let t = Instant::now();
      chain(&bytes, block_size * 4, &mut out);
      best = best.min(t.elapsed().as_secs_f64());
    }
    let checksum = out.iter().fold(0u64, |a, h| a ^ h);
    let mut w = stdout.lock();
    writeln!(w, "{{\"seconds\": {best}, \"checksum\": \"{checksum}\"}}").unwrap();
    w.flush().unwrap();
  }
}
