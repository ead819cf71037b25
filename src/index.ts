export { KvPlaneError, type KvPlaneErrorCode } from './errors.js';
export {
  digestsHex,
  type ExtraKey,
  type HashAlgo,
  type HashBlocksOptions,
  type HashDigests,
  hashBlocks,
  hashBlocksAsync,
  signedView,
  type Tokens,
  toInt64,
  toUint64,
  trtllmCacheSaltId,
} from './hash.js';
