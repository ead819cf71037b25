//! Load records (`KvEventBatch.load`, an `EngineLoad`; docs/protocol.md#load-records): the
//! engine's `GetLoads` answer (vLLM's, SGLang's and TokenSpeed's `GetLoadsResponse`, one
//! `SchedulerLoad` per DP rank, each engine's with its own field numbers: `LoadLayout`) turned
//! into the records a `SubscribeKvEvents` stream carries: appended to each batch for its rank,
//! and sent alone in `load_only` batches between them.

use super::encode::{put_batch_head, put_dp_rank};
use super::BATCH_DP_RANK;
use crate::codec::protobuf::{put_key, put_len_delimited, put_varint, Reader, I64, LEN, VARINT};
use crate::error::{ErrorCode, KvError, KvResult};

// `GetLoadsRequest` / `GetLoadsResponse` (the same in all three)
const REQUEST_INCLUDE: u32 = 2;
const RESPONSE_LOADS: u32 = 4;

// `KvEventBatch.load` and `EngineLoad`
const BATCH_LOAD: u32 = 8;
const LOAD_RUNNING: u32 = 1;
const LOAD_WAITING: u32 = 2;
const LOAD_WAITING_UNCACHED: u32 = 3;
const LOAD_TOKEN_USAGE: u32 = 4;
const LOAD_GEN_THROUGHPUT: u32 = 5;
const LOAD_MAX_RUNNING: u32 = 6;
const LOAD_AGE_MS: u32 = 7;
const LOAD_SAMPLE: u32 = 8;
const LOAD_ONLY: u32 = 9;
const LOAD_CACHE_HIT_RATE: u32 = 10;
const LOAD_USED_TOKENS: u32 = 11;
const LOAD_MAX_TOTAL_TOKENS: u32 = 12;
const LOAD_MEMORY: u32 = 13;
const LOAD_QUEUES: u32 = 14;
const LOAD_SPECULATIVE: u32 = 15;
const LOAD_LORA: u32 = 16;
const LOAD_DISAGGREGATION: u32 = 17;
const LOAD_ACTIVE_TOKEN_USAGE: u32 = 18;

/// Where one engine's `SchedulerLoad` (smg-grpc-proto 0.4.28) keeps what a record carries. All
/// three put `dp_rank`, the request counts and the token totals at 1-6; they part from 7 on.
#[derive(Debug, PartialEq, Eq)]
pub struct LoadLayout {
  dp_rank: u32,
  running: u32,
  waiting: u32,
  used_tokens: u32,
  max_total_tokens: u32,
  token_usage: u32,
  gen_throughput: u32,
  cache_hit_rate: u32,
  max_running: u32,
  waiting_uncached: u32,
  /// The engine's own share of tokens in use by requests in flight, where it reports one.
  active_token_usage: Option<u32>,
  /// The sections `EngineLoad` mirrors field for field, copied through as they came:
  /// (`SchedulerLoad` field, `EngineLoad` field).
  sections: &'static [(u32, u32)],
}

/// `vllm.grpc.engine.VllmEngine`: no sections; the uncached count at 12.
pub const VLLM_LOADS: LoadLayout = LoadLayout {
  dp_rank: 1,
  running: 2,
  waiting: 3,
  used_tokens: 5,
  max_total_tokens: 6,
  token_usage: 7,
  gen_throughput: 8,
  cache_hit_rate: 9,
  max_running: 11,
  waiting_uncached: 12,
  active_token_usage: None,
  sections: &[],
};

/// `sglang.grpc.scheduler.SglangScheduler`: vLLM's numbers to 11, its sections at 12-16, the
/// uncached count at 17.
pub const SGLANG_LOADS: LoadLayout = LoadLayout {
  waiting_uncached: 17,
  sections: &[
    (12, LOAD_MEMORY),
    (13, LOAD_SPECULATIVE),
    (14, LOAD_LORA),
    (15, LOAD_DISAGGREGATION),
    (16, LOAD_QUEUES),
  ],
  ..VLLM_LOADS
};

/// `tokenspeed.grpc.scheduler.TokenSpeedScheduler`: its own order from 7 on, memory and queues
/// as SGLang's messages, and the active token usage.
pub const TOKENSPEED_LOADS: LoadLayout = LoadLayout {
  max_running: 7,
  token_usage: 8,
  gen_throughput: 9,
  cache_hit_rate: 10,
  waiting_uncached: 14,
  active_token_usage: Some(15),
  sections: &[(12, LOAD_MEMORY), (13, LOAD_QUEUES)],
  ..VLLM_LOADS
};

impl LoadLayout {
  /// The `SchedulerLoad` layout of `service` (a full service name): the services that declare
  /// `GetLoads`.
  pub fn of_service(service: &str) -> KvResult<&'static LoadLayout> {
    match service {
      "vllm.grpc.engine.VllmEngine" => Ok(&VLLM_LOADS),
      "sglang.grpc.scheduler.SglangScheduler" => Ok(&SGLANG_LOADS),
      "tokenspeed.grpc.scheduler.TokenSpeedScheduler" => Ok(&TOKENSPEED_LOADS),
      _ => Err(KvError::new(
        ErrorCode::InvalidArg,
        format!("no GetLoads answer known for service {service:?}"),
      )),
    }
  }
}

/// The `GetLoadsRequest` a relay polls with: every section (`include: ["all"]`), all ranks.
pub fn get_loads_request() -> Vec<u8> {
  let mut out = Vec::with_capacity(5);
  put_len_delimited(&mut out, REQUEST_INCLUDE, |o| o.extend_from_slice(b"all"));
  out
}

/// One rank's `SchedulerLoad`: the fields a record carries, as they were on the wire.
#[derive(Debug, Clone, Default, PartialEq)]
struct RankLoad {
  dp_rank: i32,
  running: u64,
  waiting: u64,
  waiting_uncached: Option<u64>,
  token_usage: f64,
  gen_throughput: f64,
  max_running: u64,
  cache_hit_rate: Option<f64>,
  active_token_usage: Option<f64>,
  used_tokens: Option<u64>,
  max_total_tokens: Option<u64>,
  /// (EngineLoad field, the section's bytes).
  sections: Vec<(u32, Vec<u8>)>,
}

/// What a record carries besides the engine's numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordOpts {
  /// Monotonic per stream.
  pub sample: u64,
  /// Age of the `GetLoads` answer behind the record.
  pub age_ms: u32,
  pub load_only: bool,
  /// The engine's telemetry beyond the routing core (heartbeats and a stream's first record).
  pub telemetry: bool,
}

/// An engine's `GetLoads` answer, per DP rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineLoads {
  ranks: Vec<RankLoad>,
}

/// An int32 field's value as a uint32 one (negative values, which no count has, as 0).
fn u32_of(v: u64) -> u64 {
  if v > u32::MAX as u64 {
    0
  } else {
    v
  }
}

fn f64_field(p: &mut Reader<'_>, wire: u8) -> KvResult<f64> {
  p.expect(wire, I64)?;
  Ok(f64::from_le_bytes(p.fixed::<8>()?))
}

fn put_f64(out: &mut Vec<u8>, field: u32, v: f64) {
  put_key(out, field, I64);
  out.extend_from_slice(&v.to_le_bytes());
}

fn put_uint(out: &mut Vec<u8>, field: u32, v: u64) {
  put_key(out, field, VARINT);
  put_varint(out, v);
}

impl RankLoad {
  fn decode(bytes: &[u8], l: &LoadLayout) -> KvResult<RankLoad> {
    let mut p = Reader::new(bytes);
    let mut r = RankLoad::default();
    while !p.done() {
      let (field, wire) = p.key()?;
      if field == l.dp_rank {
        r.dp_rank = p.varint_field(wire)? as i64 as i32;
      } else if field == l.running {
        r.running = u32_of(p.varint_field(wire)?);
      } else if field == l.waiting {
        r.waiting = u32_of(p.varint_field(wire)?);
      } else if field == l.waiting_uncached {
        r.waiting_uncached = Some(u32_of(p.varint_field(wire)?));
      } else if field == l.token_usage {
        r.token_usage = f64_field(&mut p, wire)?;
      } else if field == l.gen_throughput {
        r.gen_throughput = f64_field(&mut p, wire)?;
      } else if field == l.max_running {
        r.max_running = u32_of(p.varint_field(wire)?);
      } else if field == l.cache_hit_rate {
        r.cache_hit_rate = Some(f64_field(&mut p, wire)?);
      } else if field == l.used_tokens {
        r.used_tokens = Some(p.varint_field(wire)?);
      } else if field == l.max_total_tokens {
        r.max_total_tokens = Some(p.varint_field(wire)?);
      } else if Some(field) == l.active_token_usage {
        r.active_token_usage = Some(f64_field(&mut p, wire)?);
      } else if let Some(&(_, to)) = l.sections.iter().find(|(from, _)| *from == field) {
        r.sections.push((to, p.bytes_field(wire)?.to_vec()));
      } else {
        p.skip(field, wire)?;
      }
    }
    Ok(r)
  }

  /// The `EngineLoad` message body.
  fn encode(&self, o: RecordOpts, out: &mut Vec<u8>) {
    let nonzero = |out: &mut Vec<u8>, field, v: u64| {
      if v != 0 {
        put_uint(out, field, v);
      }
    };
    nonzero(out, LOAD_RUNNING, self.running);
    nonzero(out, LOAD_WAITING, self.waiting);
    if let Some(v) = self.waiting_uncached {
      put_uint(out, LOAD_WAITING_UNCACHED, v);
    }
    if self.token_usage.to_bits() != 0 {
      put_f64(out, LOAD_TOKEN_USAGE, self.token_usage);
    }
    if self.gen_throughput.to_bits() != 0 {
      put_f64(out, LOAD_GEN_THROUGHPUT, self.gen_throughput);
    }
    if let Some(v) = self.active_token_usage {
      put_f64(out, LOAD_ACTIVE_TOKEN_USAGE, v);
    }
    nonzero(out, LOAD_MAX_RUNNING, self.max_running);
    nonzero(out, LOAD_AGE_MS, o.age_ms as u64);
    nonzero(out, LOAD_SAMPLE, o.sample);
    nonzero(out, LOAD_ONLY, o.load_only as u64);
    if !o.telemetry {
      return;
    }
    if let Some(v) = self.cache_hit_rate {
      put_f64(out, LOAD_CACHE_HIT_RATE, v);
    }
    if let Some(v) = self.used_tokens {
      put_uint(out, LOAD_USED_TOKENS, v);
    }
    if let Some(v) = self.max_total_tokens {
      put_uint(out, LOAD_MAX_TOTAL_TOKENS, v);
    }
    let mut sections: Vec<&(u32, Vec<u8>)> = self.sections.iter().collect();
    sections.sort_by_key(|(f, _)| *f);
    for (field, bytes) in sections {
      put_len_delimited(out, *field, |o| o.extend_from_slice(bytes));
    }
  }
}

impl EngineLoads {
  /// Reads a `GetLoadsResponse` of the engine whose `SchedulerLoad` is laid out as `layout`.
  pub fn decode(bytes: &[u8], layout: &LoadLayout) -> KvResult<EngineLoads> {
    let mut p = Reader::new(bytes);
    let mut ranks = Vec::new();
    while !p.done() {
      let (field, wire) = p.key()?;
      match field {
        RESPONSE_LOADS => ranks.push(RankLoad::decode(p.bytes_field(wire)?, layout)?),
        _ => p.skip(field, wire)?,
      }
    }
    Ok(EngineLoads { ranks })
  }

  /// The DP ranks the answer covers.
  pub fn ranks(&self) -> Vec<i32> {
    self.ranks.iter().map(|r| r.dp_rank).collect()
  }

  /// The load of `dp_rank` (a batch without one is rank 0's).
  fn of(&self, dp_rank: Option<i32>) -> Option<&RankLoad> {
    let rank = dp_rank.unwrap_or(0);
    self.ranks.iter().find(|r| r.dp_rank == rank)
  }

  /// `KvEventBatch` bytes with the record of its rank appended as `load` (a protobuf message
  /// takes a field appended to its bytes); as they were when the answer has no such rank.
  pub fn attach(&self, batch: &[u8], o: RecordOpts) -> KvResult<Vec<u8>> {
    let mut out = Vec::with_capacity(batch.len() + 64);
    out.extend_from_slice(batch);
    if let Some(load) = self.of(batch_dp_rank(batch)?) {
      put_len_delimited(&mut out, BATCH_LOAD, |o2| load.encode(o, o2));
    }
    Ok(out)
  }

  /// One `load_only` batch per rank, repeating seq `seq` (the last one sent on the stream, 0
  /// before any): no events, the rank's record with the telemetry when `o.telemetry`.
  pub fn load_only(&self, seq: u64, ts: f64, o: RecordOpts) -> Vec<Vec<u8>> {
    let o = RecordOpts {
      load_only: true,
      ..o
    };
    self
      .ranks
      .iter()
      .map(|load| {
        let mut out = Vec::with_capacity(96);
        put_batch_head(seq, ts, &mut out);
        put_dp_rank(Some(load.dp_rank), &mut out);
        put_len_delimited(&mut out, BATCH_LOAD, |o2| load.encode(o, o2));
        out
      })
      .collect()
  }
}

/// A `KvEventBatch`'s `dp_rank`, read past its other top-level fields.
fn batch_dp_rank(batch: &[u8]) -> KvResult<Option<i32>> {
  let mut p = Reader::new(batch);
  let mut rank = None;
  while !p.done() {
    let (field, wire) = p.key()?;
    if field == BATCH_DP_RANK && wire == VARINT {
      rank = Some(p.varint()? as i64 as i32);
    } else if wire == LEN {
      p.bytes()?;
    } else {
      p.skip(field, wire)?;
    }
  }
  Ok(rank)
}
