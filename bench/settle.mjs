// Collects and lets V8 finish sweeping before a timed loop, so the loop does not pay for the
// setup's garbage. Needs --expose-gc (bench/pin.mjs re-runs each bench with it).
export async function settle() {
  global.gc();
  global.gc();
  await new Promise((r) => setTimeout(r, 1000));
}
