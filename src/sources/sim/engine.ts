import type { KvEvent } from '../../events.js';
import { type HashAlgo, hashBlocks } from '../../hash.js';
import { withDefaults } from '../../options.js';
import type { EventSink } from '../source.js';
import { Rng, Zipf } from './random.js';

export interface SimEngineOptions {
  /** Workload seed: the same seed gives the same events. Default 1. */
  seed?: number;
  /** Tokens per KV block. Default 16. */
  blockSize?: number;
  /** KV blocks in the pool. Default 16,384. */
  numBlocks?: number;
  /** New conversations per second. Default 20. */
  requestsPerSecond?: number;
  /** Engine step in ms (one event batch per step). Default 20. */
  stepMs?: number;
  /** Shared system prompts and their length in tokens. Defaults 8 and 512. */
  systemPrompts?: number;
  systemPromptTokens?: number;
  /** Documents quoted by requests (Zipf-popular), their length, the Zipf exponent and how often a request quotes one. */
  documents?: number;
  documentTokens?: number;
  zipfExponent?: number;
  documentProbability?: number;
  /** Turns per conversation (uniform in 1..maxTurns). Default 4. */
  maxTurns?: number;
  /** User message and answer lengths in tokens (uniform in 1..max). Defaults 128 and 256. */
  maxUserTokens?: number;
  maxOutputTokens?: number;
  /** Steps a request holds its blocks (uniform in 1..max). Default 50. */
  maxRequestSteps?: number;
  vocabSize?: number;
  /** The engine's block hash. Default `'vllm_sha256_cbor'` (vLLM's `sha256_cbor`; vLLM's own default is `sha256`). */
  hashAlgo?: HashAlgo;
  medium?: string;
}

interface Block {
  hash: bigint;
  refs: number;
}

interface Request {
  conversation: Conversation;
  /** Block hashes the request holds, in chain order. */
  held: bigint[];
  finishStep: number;
}

interface Conversation {
  tokens: Uint32Array;
  turnsLeft: number;
}

export interface SimStats {
  steps: number;
  requests: number;
  /** Requests turned away because every block was in use. */
  rejected: number;
  running: number;
  /** Blocks found cached / computed for prompts. */
  hitBlocks: number;
  missBlocks: number;
  evictions: number;
  cachedBlocks: number;
}

const DEFAULTS = {
  seed: 1,
  blockSize: 16,
  numBlocks: 16_384,
  requestsPerSecond: 20,
  stepMs: 20,
  systemPrompts: 8,
  systemPromptTokens: 512,
  documents: 200,
  documentTokens: 1024,
  zipfExponent: 1.1,
  documentProbability: 0.5,
  maxTurns: 4,
  maxUserTokens: 128,
  maxOutputTokens: 256,
  maxRequestSteps: 50,
  vocabSize: 32_000,
  hashAlgo: 'vllm_sha256_cbor' as HashAlgo,
  medium: 'GPU',
} satisfies Required<SimEngineOptions>;

function concat(parts: readonly Uint32Array[]): Uint32Array {
  const out = new Uint32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * The embedded default engine: a prefix-caching KV block pool with LRU eviction of unreferenced
 * cached blocks, driven by a seeded workload (shared system prompts, Zipf-popular documents,
 * multi-turn conversations). It emits the stored / removed events a real engine would: one
 * stored event per prefill with the new blocks, one per answer, a removed event per eviction.
 */
export class SimEngine {
  readonly #sink: EventSink;
  readonly #o: Required<SimEngineOptions>;
  readonly #rng: Rng;
  readonly #zipf: Zipf;
  readonly #prompts: Uint32Array[];
  readonly #docs: Uint32Array[];
  /** Cached blocks by hash. */
  readonly #cached = new Map<bigint, Block>();
  /** Unreferenced cached blocks, least recently used first (Map keeps insertion order). */
  readonly #lru = new Map<bigint, Block>();
  #running: Request[] = [];
  /** Conversations waiting for their next turn, with the step it arrives. */
  #followUps: Array<{ conversation: Conversation; atStep: number }> = [];
  #pending: KvEvent[] = [];
  #arrivals = 0;
  #timer: NodeJS.Timeout | undefined;
  readonly stats: SimStats = {
    steps: 0,
    requests: 0,
    rejected: 0,
    running: 0,
    hitBlocks: 0,
    missBlocks: 0,
    evictions: 0,
    cachedBlocks: 0,
  };

  constructor(sink: EventSink, options: SimEngineOptions = {}) {
    this.#sink = sink;
    this.#o = withDefaults<SimEngineOptions>(DEFAULTS, options);
    const o = this.#o;
    this.#rng = new Rng(o.seed);
    this.#zipf = new Zipf(o.documents, o.zipfExponent);
    this.#prompts = Array.from({ length: o.systemPrompts }, () => this.#rng.tokens(o.systemPromptTokens, o.vocabSize));
    this.#docs = Array.from({ length: o.documents }, () => this.#rng.tokens(o.documentTokens, o.vocabSize));
  }

  get options(): Readonly<Required<SimEngineOptions>> {
    return this.#o;
  }

  /** Runs a step every `stepMs` until `stop()`. */
  start(): void {
    if (this.#timer) return;
    this.#timer = setInterval(() => this.step(), this.#o.stepMs);
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** One engine step: finish due requests, admit new ones, publish the step's events. */
  step(): void {
    const o = this.#o;
    const now = ++this.stats.steps;
    const still: Request[] = [];
    for (const r of this.#running) {
      if (r.finishStep <= now) this.#finish(r, now);
      else still.push(r);
    }
    this.#running = still;
    this.#arrivals += (o.requestsPerSecond * o.stepMs) / 1000;
    const followUps = this.#followUps.filter((f) => f.atStep <= now);
    this.#followUps = this.#followUps.filter((f) => f.atStep > now);
    for (const f of followUps) this.#admit(f.conversation, now);
    for (; this.#arrivals >= 1; this.#arrivals--) this.#admit(this.#newConversation(), now);
    this.stats.running = this.#running.length;
    this.stats.cachedBlocks = this.#cached.size;
    this.#flush();
  }

  /** Drops every cached block (a prefix-cache reset): one `cleared` event. */
  reset(): void {
    for (const r of this.#running) for (const h of r.held) this.#release(h);
    this.#running = [];
    this.#cached.clear();
    this.#lru.clear();
    this.#pending.push({ type: 'cleared' });
    this.stats.cachedBlocks = 0;
    this.#flush();
  }

  #flush(): void {
    if (this.#pending.length === 0) return;
    this.#sink.publish(this.#pending);
    this.#pending = [];
  }

  #newConversation(): Conversation {
    const o = this.#o;
    const parts = [this.#prompts[this.#rng.int(0, o.systemPrompts - 1)] as Uint32Array];
    if (this.#rng.next() < o.documentProbability) parts.push(this.#docs[this.#zipf.sample(this.#rng)] as Uint32Array);
    return { tokens: concat(parts), turnsLeft: this.#rng.int(1, o.maxTurns) };
  }

  #hashes(tokens: Uint32Array): BigUint64Array {
    return hashBlocks(tokens, { algo: this.#o.hashAlgo, blockSize: this.#o.blockSize });
  }

  /** A turn arrives: the conversation so far plus a user message; prefill caches its full blocks. */
  #admit(c: Conversation, now: number): void {
    const o = this.#o;
    const prompt = concat([c.tokens, this.#rng.tokens(this.#rng.int(1, o.maxUserTokens), o.vocabSize)]);
    const hashes = this.#hashes(prompt);
    let hit = 0;
    while (hit < hashes.length && this.#cached.has(hashes[hit] as bigint)) hit++;
    const fresh = hashes.length - hit;
    const held: bigint[] = [];
    for (let i = 0; i < hit; i++) held.push(this.#acquire(hashes[i] as bigint));
    if (!this.#canAllocate(fresh)) {
      for (let i = held.length - 1; i >= 0; i--) this.#release(held[i] as bigint);
      this.stats.rejected++;
      return;
    }
    this.stats.requests++;
    this.stats.hitBlocks += hit;
    this.stats.missBlocks += fresh;
    this.#store(hashes, hit, prompt, held);
    c.tokens = prompt;
    this.#running.push({ conversation: c, held, finishStep: now + this.#rng.int(1, o.maxRequestSteps) });
  }

  /** The answer is generated: its full blocks are cached, then the request lets go of its blocks. */
  #finish(r: Request, now: number): void {
    const o = this.#o;
    const c = r.conversation;
    const done = concat([c.tokens, this.#rng.tokens(this.#rng.int(1, o.maxOutputTokens), o.vocabSize)]);
    const hashes = this.#hashes(done);
    const from = r.held.length;
    if (hashes.length > from && this.#canAllocate(hashes.length - from)) this.#store(hashes, from, done, r.held);
    // Tail first, so eviction takes the ends of chains before their prefixes (as vLLM frees).
    for (let i = r.held.length - 1; i >= 0; i--) this.#release(r.held[i] as bigint);
    c.tokens = done;
    if (--c.turnsLeft > 0) this.#followUps.push({ conversation: c, atStep: now + this.#rng.int(1, o.maxRequestSteps) });
  }

  /** Caches blocks `from..` of a chain: evicts what it must, emits one stored event. */
  #store(hashes: BigUint64Array, from: number, tokens: Uint32Array, held: bigint[]): void {
    const bs = this.#o.blockSize;
    const added: bigint[] = [];
    for (let i = from; i < hashes.length; i++) {
      const h = hashes[i] as bigint;
      if (this.#cached.has(h)) {
        // Another request cached it meanwhile: a later block of a chain this one shares.
        held.push(this.#acquire(h));
        if (added.length > 0) this.#emitStored(hashes, i - added.length, added, tokens, bs);
        added.length = 0;
        continue;
      }
      this.#evictIfFull();
      this.#cached.set(h, { hash: h, refs: 1 });
      held.push(h);
      added.push(h);
    }
    if (added.length > 0) this.#emitStored(hashes, hashes.length - added.length, added, tokens, bs);
  }

  #emitStored(hashes: BigUint64Array, first: number, added: bigint[], tokens: Uint32Array, bs: number): void {
    this.#pending.push({
      type: 'stored',
      blockHashes: BigUint64Array.from(added),
      parentBlockHash: first === 0 ? null : (hashes[first - 1] as bigint),
      tokenIds: tokens.slice(first * bs, (first + added.length) * bs),
      blockSize: bs,
      medium: this.#o.medium,
    });
  }

  #canAllocate(n: number): boolean {
    return this.#o.numBlocks - this.#cached.size + this.#lru.size >= n;
  }

  #evictIfFull(): void {
    if (this.#cached.size < this.#o.numBlocks) return;
    const victim = this.#lru.keys().next();
    if (victim.done) return;
    this.#lru.delete(victim.value);
    this.#cached.delete(victim.value);
    this.stats.evictions++;
    this.#pending.push({ type: 'removed', blockHashes: [victim.value], medium: this.#o.medium });
  }

  #acquire(h: bigint): bigint {
    const b = this.#cached.get(h) as Block;
    if (b.refs++ === 0) this.#lru.delete(h);
    return h;
  }

  #release(h: bigint): void {
    const b = this.#cached.get(h);
    if (!b) return;
    if (--b.refs === 0) this.#lru.set(h, b);
  }
}
