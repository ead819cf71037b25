import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as esm from '../dist/index.mjs';

const repo = join(__dirname, '..');

describe('one package for both module systems', () => {
  // In plain Node, as an application loads the package (the test runner has a module graph of its
  // own): an ES module importing the package and a CommonJS require of it in the same process.
  it('CJS and ESM share one copy of every export, so errors pass instanceof across them', () => {
    const script = `
      import { createRequire } from 'node:module';
      import * as esm from ${JSON.stringify(join(repo, 'dist/index.mjs'))};
      const cjs = createRequire(import.meta.url)(${JSON.stringify(join(repo, 'dist/index.js'))});
      let thrown;
      try { esm.hashBlocks([1, 2, 3], { blockSize: 0 }); } catch (e) { thrown = e; }
      console.log(JSON.stringify({
        esmKeys: Object.keys(esm).filter((k) => k !== 'default').sort(),
        cjsKeys: Object.keys(cjs).sort(),
        sameError: esm.KvPlaneError === cjs.KvPlaneError,
        sameIndex: esm.RouterIndex === cjs.RouterIndex,
        instanceofCjs: thrown instanceof cjs.KvPlaneError,
        instanceofEsm: thrown instanceof esm.KvPlaneError,
        code: thrown?.code,
      }));`;
    const out = JSON.parse(
      execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' }).trim(),
    );
    expect(out.esmKeys).toEqual(out.cjsKeys);
    expect(out.esmKeys).toContain('KvPlaneError');
    expect(out).toMatchObject({
      sameError: true,
      sameIndex: true,
      instanceofCjs: true,
      instanceofEsm: true,
      code: 'ERR_INVALID_ARG',
    });
  });
});

describe('ERR_NATIVE_LOAD', () => {
  it('names the platform when no binary loads', () => {
    // The package without its binary: the loader finds neither a .node file beside it nor an
    // @kvplane/binding-* package. Its JS dependencies resolve from the repo's node_modules.
    const dir = mkdtempSync(join(tmpdir(), 'kvplane-nobinary-'));
    try {
      cpSync(join(repo, 'dist'), join(dir, 'dist'), { recursive: true });
      cpSync(join(repo, 'index.js'), join(dir, 'index.js'));
      cpSync(join(repo, 'package.json'), join(dir, 'package.json'));
      const out = execFileSync(
        process.execPath,
        [
          '-e',
          `try { require(${JSON.stringify(join(dir, 'dist/index.js'))}); console.log('loaded') }
           catch (e) { console.log(JSON.stringify({ name: e.name, code: e.code, message: e.message })) }`,
        ],
        { env: { ...process.env, NODE_PATH: join(repo, 'node_modules') }, encoding: 'utf8' },
      );
      const err = JSON.parse(out.trim());
      expect(err.name).toBe('KvPlaneError');
      expect(err.code).toBe('ERR_NATIVE_LOAD');
      expect(err.message).toContain(`${process.platform}-${process.arch}`);
      expect(err.message).toContain('@kvplane/binding-');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('ERR_BIND', () => {
  let taken: Server;
  let port: number;
  beforeAll(async () => {
    taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
    port = (taken.address() as { port: number }).port;
  });
  afterAll(() => new Promise<void>((resolve) => taken.close(() => resolve())));

  async function bindError(open: () => Promise<unknown>): Promise<{ code: string; message: string }> {
    const err = await open().then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(esm.KvPlaneError);
    return err as { code: string; message: string };
  }

  it('the node HTTP server', async () => {
    const pub = await esm.KvEventPublisher.create({ endpoint: 'tcp://127.0.0.1:*', replayEndpoint: null });
    try {
      const err = await bindError(() => esm.KvHttpServer.create({ publisher: pub, host: '127.0.0.1', port }));
      expect(err.code).toBe('ERR_BIND');
      expect(err.message).toContain(`127.0.0.1:${port}`);
    } finally {
      await pub.close();
    }
  });

  it('the gRPC server', async () => {
    const err = await bindError(() => esm.KvGrpcServer.create({ stream: null, host: '127.0.0.1', port }));
    expect(err.code).toBe('ERR_BIND');
    expect(err.message).toContain(`127.0.0.1:${port}`);
  });

  it("the router's indexer service", async () => {
    const err = await bindError(() => esm.IndexerServer.create({ host: '127.0.0.1', port }));
    expect(err.code).toBe('ERR_BIND');
  });

  it('the ZMQ publisher and its replay socket', async () => {
    const err = await bindError(() =>
      esm.KvEventPublisher.create({ endpoint: `bind:tcp://127.0.0.1:${port}`, replayEndpoint: null }),
    );
    expect(err.code).toBe('ERR_BIND');
    const replay = await bindError(() =>
      esm.KvEventPublisher.create({
        endpoint: 'bind:tcp://127.0.0.1:*',
        replayEndpoint: `bind:tcp://127.0.0.1:${port}`,
      }),
    );
    expect(replay.code).toBe('ERR_BIND');
  });
});
