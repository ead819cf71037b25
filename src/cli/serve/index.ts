export { type GrpcConfig, SERVE_DEFAULTS, type ServeConfig } from './config.js';
export { parseServeArgs, serveHelp } from './flags.js';
export { type Serving, startServe } from './wiring.js';
