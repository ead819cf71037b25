import { readFileSync } from 'node:fs';
import { KvPlaneError } from '../errors.js';

/**
 * A bearer token: the first line of `file` (given with `flag`), else the environment variable
 * `env`; none when neither is set. A file with no token in it is an error.
 */
export function readToken(file: string | null, env: string, flag: string): string | undefined {
  let token = process.env[env];
  if (file !== null) {
    try {
      token = (readFileSync(file, 'utf8').split(/\r?\n/)[0] ?? '').trim();
    } catch (err) {
      throw new KvPlaneError('ERR_INVALID_ARG', `${flag} ${file}: ${(err as Error).message}`);
    }
  }
  if (token === undefined || (file === null && token === '')) return undefined;
  if (token === '') throw new KvPlaneError('ERR_INVALID_ARG', `${flag} ${file}: the file holds no token`);
  return token;
}
