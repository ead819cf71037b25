import { invalidArg } from './errors.js';

/**
 * Token ids as the native side takes them: a `Uint32Array` as is, an array of numbers as one
 * `Float64Array` (the core checks each is an integer in 0..=2^32-1). Reading a JS array element by
 * element through Node-API costs about 35 ns a token (0.3 ms for an 8k-token request); copying it
 * here into a typed array costs about one. Only the elements' JS type is checked here: a
 * `Float64Array` would turn `"7"`, `true` or `null` into numbers.
 */
export function nativeTokens(tokens: unknown, what = 'tokens'): Uint32Array | Float64Array {
  if (tokens instanceof Uint32Array) return tokens;
  if (!Array.isArray(tokens)) invalidArg(`${what} must be a Uint32Array or an array of token ids`);
  for (let i = 0; i < tokens.length; i++) {
    const t: unknown = tokens[i];
    if (typeof t !== 'number') invalidArg(`${what}: token at index ${i} is ${kindOf(t)}, not a number`);
  }
  return Float64Array.from(tokens as number[]);
}

function kindOf(v: unknown): string {
  if (v === undefined) return 'missing';
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}
