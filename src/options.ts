/** `defaults` overridden by the options that are set (`undefined` keeps the default). */
export function withDefaults<T extends object>(defaults: Required<T>, options: T): Required<T> {
  const out = { ...defaults } as Record<string, unknown>;
  for (const [k, v] of Object.entries(options)) if (v !== undefined) out[k] = v;
  return out as Required<T>;
}

/**
 * The camelCase option a JSON config key names: its snake_case form via `names`, or the camelCase
 * name itself; `undefined` for an unknown key.
 */
export function camelKey<K extends string>(names: Record<string, K>, key: string): K | undefined {
  return names[key] ?? (Object.values(names).includes(key as K) ? (key as K) : undefined);
}
