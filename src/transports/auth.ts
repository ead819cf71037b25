import { createHash, timingSafeEqual } from 'node:crypto';

/**
 * Checks an `authorization` value against the expected bearer token in constant time (both are
 * hashed first, so neither length nor content leaks through timing).
 */
export function bearerMatches(header: string | undefined, token: string): boolean {
  if (header === undefined) return false;
  const m = /^Bearer[ \t]+(.+)$/i.exec(header.trim());
  if (!m) return false;
  const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();
  return timingSafeEqual(digest(m[1] as string), digest(token));
}
