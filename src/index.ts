export { KvPlaneError, type KvPlaneErrorCode } from './errors.js';
export {
  hashBlocks,
  hashBlocksAsync,
  digestsHex,
  toInt64,
  toUint64,
  signedView,
  trtllmCacheSaltId,
  type HashAlgo,
  type HashBlocksOptions,
  type HashDigests,
  type ExtraKey,
  type Tokens,
} from './hash.js';
