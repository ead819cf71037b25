/** `defaults` overridden by the options that are set (`undefined` keeps the default). */
export function withDefaults<T extends object>(defaults: Required<T>, options: T): Required<T> {
  const out = { ...defaults } as Record<string, unknown>;
  for (const [k, v] of Object.entries(options)) if (v !== undefined) out[k] = v;
  return out as Required<T>;
}
