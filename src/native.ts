// The generated napi loader (index.js at the package root) picks the binary for this platform.
import * as native from '../index.js';

export default native;
