import type { RouterIndexOptions, WorkerSource } from '../router_index.js';
import { RouterIndex } from '../router_index.js';
import type { Subscription } from '../subscriptions/subscription.js';
import { badInputAs, HttpError } from './json.js';

/** One registered `(instance, rank)`: where its events come from. */
export interface Registration {
  instanceId: bigint;
  dpRank: number;
  modelName: string;
  routingGroup: string;
  blockSize: number;
  /** ZMQ publisher (`tcp://`, `ipc://`, `inproc://`) or an SMG-proto gRPC server (`grpc://HOST:PORT`). */
  endpoint: string;
  replayEndpoint: string | null;
  /** A kvplane node registered by its HTTP URL (its endpoint was found from its `/healthz`). */
  url: string | null;
  /** The ZMQ payloads' dialect: `vllm` (default; kvplane nodes publish it too), `sglang` or `trtllm`. */
  engine?: 'vllm' | 'sglang' | 'trtllm';
}

interface Instance {
  modelName: string;
  routingGroup: string;
  ranks: Map<number, Registration>;
}

const ENDPOINT = /^(tcp|ipc|inproc|grpc):\/\/(.*)$/;

/** Checks a ZMQ (or `grpc://`) endpoint as Dynamo's indexer does: a 400 says what is wrong. */
export function checkEndpoint(endpoint: string, what = 'ZMQ endpoint'): void {
  const m = ENDPOINT.exec(endpoint);
  const bad = (why: string): never => {
    throw new HttpError(400, `invalid ${what} \`${endpoint}\`: ${why}`);
  };
  if (!endpoint.includes('://')) bad('missing scheme');
  if (!m) bad(`unsupported scheme \`${endpoint.split('://')[0]}\``);
  const [, scheme, address] = m as RegExpExecArray;
  if (address === '') bad('missing address');
  if (scheme === 'tcp' || scheme === 'grpc') {
    const at = (address as string).lastIndexOf(':');
    if (at < 0) bad('missing TCP port');
    const host = (address as string).slice(0, at);
    const port = (address as string).slice(at + 1);
    if (host === '') bad('missing TCP host');
    if (host.startsWith('[') && !host.endsWith(']')) bad('missing closing `]`');
    if (!/^\d+$/.test(port) || Number(port) > 65535) bad(`invalid TCP port: ${port}`);
  }
}

/**
 * The indexer's registrations and its indexes: one `RouterIndex` per (model, routing group),
 * created with its first worker's block size and dropped with its last worker, as Dynamo's
 * standalone indexer keeps them.
 */
export class Registry {
  /**
   * By name, `model:routing_group` (as `/dump` and the metrics name an index), with the pair it
   * is for: two pairs of one name (`a:b` + `c`, `a` + `b:c`) are not both kept.
   */
  readonly #indexes = new Map<string, { modelName: string; routingGroup: string; ix: RouterIndex }>();
  readonly #instances = new Map<bigint, Instance>();
  readonly #onWarning: ((msg: string, detail: Record<string, unknown>) => void) | undefined;
  /** Called after every change (the state file is written from it). */
  onChange: (() => void) | null = null;
  /** Called for each index when it is made, before it follows anything (the server's events). */
  onIndex: ((ix: RouterIndex, modelName: string, routingGroup: string) => void) | null = null;

  readonly #zmqReceive: 'native' | 'js' | undefined;
  /** Indexes keep their blocks' content hashes (`RouterIndexOptions.contentHashes`). */
  readonly #contentHashes: boolean;
  /**
   * While a start from a peer is under way (`holdForPeer`): the subscriptions made meanwhile that
   * hold what arrives until `endPeerHold`, with their index's name.
   */
  #held: Array<{ name: string; sub: Subscription }> | null = null;

  constructor(
    onWarning?: (msg: string, detail: Record<string, unknown>) => void,
    zmqReceive?: RouterIndexOptions['zmqReceive'],
    contentHashes = false,
  ) {
    this.#onWarning = onWarning;
    this.#zmqReceive = zmqReceive;
    this.#contentHashes = contentHashes;
  }

  #newIndex(blockSize: number): RouterIndex {
    return new RouterIndex({
      blockSize,
      onWarning: this.#onWarning,
      zmqReceive: this.#zmqReceive,
      contentHashes: this.#contentHashes,
    });
  }

  static #name(model: string, group: string): string {
    return `${model}:${group}`;
  }

  index(model: string, group: string): RouterIndex {
    const e = this.#indexes.get(Registry.#name(model, group));
    if (!e || e.modelName !== model || e.routingGroup !== group)
      throw new HttpError(404, `no indexer for model=${model} routing_group=${group}`);
    return e.ix;
  }

  /**
   * The index a peer's dump names `name` (`model:routing_group`), made with `blockSize` when the
   * registry has none (it lives on until its model's last worker is unregistered, as a
   * registered one does); a string saying why not when its block size is another.
   */
  indexForRestore(name: string, blockSize: number): RouterIndex | string {
    const e = this.#indexes.get(name);
    if (e) {
      if (e.ix.blockSize !== blockSize) return `block_size mismatch: existing=${e.ix.blockSize}, dumped=${blockSize}`;
      return e.ix;
    }
    // Split where Dynamo joined them: the routing group is after the last colon.
    const at = name.lastIndexOf(':');
    if (at < 0) return 'not named model:routing_group';
    const modelName = name.slice(0, at);
    const routingGroup = name.slice(at + 1);
    let ix: RouterIndex;
    try {
      ix = this.#newIndex(blockSize);
    } catch (err) {
      return (err as Error).message;
    }
    this.onIndex?.(ix, modelName, routingGroup);
    this.#indexes.set(name, { modelName, routingGroup, ix });
    return ix;
  }

  /** From now until `endPeerHold`, new subscriptions hold what arrives (a peer's dump is loaded). */
  holdForPeer(): void {
    this.#held ??= [];
  }

  /**
   * Ends `holdForPeer`: each held subscription applies what it held, over the state loaded for
   * its index when its name is in `loaded`, else as it would have joined.
   */
  endPeerHold(loaded: ReadonlySet<string>): void {
    const held = this.#held ?? [];
    this.#held = null;
    for (const { name, sub } of held) sub.releaseHold?.(loaded.has(name));
  }

  /**
   * The workers of index `name` that load their state from their own source (a kvplane node by
   * URL, an SMG-proto gRPC server's snapshots): a peer's dump is not applied to them.
   */
  selfRecovering(name: string): bigint[] {
    return this.registrations()
      .filter(
        (r) => `${r.modelName}:${r.routingGroup}` === name && (r.url !== null || r.endpoint.startsWith('grpc://')),
      )
      .map((r) => r.instanceId);
  }

  /** Each index, with its name (`model:routing_group`, unique). */
  indexes(): Array<[name: string, ix: RouterIndex]> {
    return [...this.#indexes].map(([name, e]) => [name, e.ix]);
  }

  /** Every registration, in order. */
  registrations(): Registration[] {
    return [...this.#instances.values()].flatMap((i) => [...i.ranks.values()]);
  }

  instances(): ReadonlyMap<
    bigint,
    { modelName: string; routingGroup: string; ranks: ReadonlyMap<number, Registration> }
  > {
    return this.#instances;
  }

  register(r: Registration, source: WorkerSource): void {
    const inst = this.#instances.get(r.instanceId);
    if (inst && (inst.modelName !== r.modelName || inst.routingGroup !== r.routingGroup)) {
      throw new HttpError(
        409,
        `instance ${r.instanceId} is already registered for model=${inst.modelName} routing_group=${inst.routingGroup}`,
      );
    }
    if (inst?.ranks.has(r.dpRank))
      throw new HttpError(409, `instance ${r.instanceId} dp_rank ${r.dpRank} already registered`);
    const name = Registry.#name(r.modelName, r.routingGroup);
    const e = this.#indexes.get(name);
    if (e && (e.modelName !== r.modelName || e.routingGroup !== r.routingGroup)) {
      throw new HttpError(
        409,
        `model=${r.modelName} routing_group=${r.routingGroup} would be named ${JSON.stringify(name)} in /dump and metrics, as model=${e.modelName} routing_group=${e.routingGroup} already is`,
      );
    }
    let ix = e?.ix;
    if (ix && ix.blockSize !== r.blockSize) {
      throw new HttpError(
        409,
        `block_size mismatch for model=${r.modelName} routing_group=${r.routingGroup}: existing=${ix.blockSize}, requested=${r.blockSize}`,
      );
    }
    const made = !ix;
    if (!ix) {
      if (r.blockSize < 1) throw new HttpError(400, 'block_size must be at least 1');
      // A block size the index does not take (over 1,048,576) is the request's error.
      ix = badInputAs(400, () => this.#newIndex(r.blockSize));
      this.onIndex?.(ix, r.modelName, r.routingGroup);
      this.#indexes.set(name, { modelName: r.modelName, routingGroup: r.routingGroup, ix });
    }
    try {
      ix.subscribe(r.instanceId, { ...source, dpRank: r.dpRank });
      const sub = ix.subscription(r.instanceId, r.dpRank);
      if (this.#held && sub?.holdForPeer?.()) this.#held.push({ name, sub });
    } catch (err) {
      // An index made for this registration goes with it (one a peer's dump filled stays).
      if (made && ix.stats().subscriptions.length === 0) {
        this.#indexes.delete(name);
        void ix.close();
      }
      throw new HttpError(400, (err as Error).message);
    }
    const entry = inst ?? { modelName: r.modelName, routingGroup: r.routingGroup, ranks: new Map() };
    entry.ranks.set(r.dpRank, r);
    this.#instances.set(r.instanceId, entry);
    this.onChange?.();
  }

  /** Removes an instance (or one rank of it: `dpRank` counts only with `routingGroup`, as Dynamo's). */
  async unregister(id: bigint, modelName: string, routingGroup: string | null, dpRank: number | null): Promise<void> {
    const inst = this.#instances.get(id);
    if (!inst) throw new HttpError(404, `instance ${id} not found`);
    if (inst.modelName !== modelName || (routingGroup !== null && inst.routingGroup !== routingGroup)) {
      throw new HttpError(
        404,
        `instance ${id} is registered for model=${inst.modelName} routing_group=${inst.routingGroup}`,
      );
    }
    const name = Registry.#name(inst.modelName, inst.routingGroup);
    const ix = this.#indexes.get(name)?.ix as RouterIndex;
    const one = routingGroup !== null && dpRank !== null;
    if (one && !inst.ranks.has(dpRank)) throw new HttpError(404, `instance ${id} dp_rank ${dpRank} not found`);
    if (one && inst.ranks.size > 1) {
      inst.ranks.delete(dpRank);
      await ix.unsubscribe(id, dpRank);
    } else {
      this.#instances.delete(id);
      await ix.unsubscribe(id);
    }
    if (![...this.#instances.values()].some((i) => Registry.#name(i.modelName, i.routingGroup) === name)) {
      this.#indexes.delete(name);
      await ix.close();
    }
    this.onChange?.();
  }

  async close(): Promise<void> {
    const all = [...this.#indexes.values()];
    this.#indexes.clear();
    await Promise.all(all.map((e) => e.ix.close()));
  }
}
