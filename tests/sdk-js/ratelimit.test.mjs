// Rate limits as the JS SDK meets them (README, "Rate limits"): a server of this test's own
// with low limits (the suite's server has limits far above what the suite sends). A user over
// its per-user limit gets the SDK's error with status 429, Stream's code 9 and the headers;
// getRateLimits reads the server-side budget.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { StreamChat } from 'stream-chat';
import { API_KEY, API_SECRET, BACKEND, REST_TIMEOUT_MS, uid } from './helpers.mjs';

const httpAgent = new http.Agent({ keepAlive: false });

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A PostgreSQL database of the limited server's own, dropped after the test: the app's limits
 * are counted in the database for every process that shares it (README, "Rate limits"), so on
 * the suite's database the suite server's own sends would spend the limited server's budget.
 */
function ownPostgresDatabase() {
  const url = new URL(process.env.OFFSHOOT_SDK_DATABASE_URL);
  const name = `offshoot_sdk_rl_${randomUUID().replaceAll('-', '')}`;
  const admin = new URL(url);
  admin.pathname = '/postgres';
  const psql = (sql) => {
    const r = spawnSync('psql', ['-v', 'ON_ERROR_STOP=1', '-q', admin.toString(), '-c', sql], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`psql ${sql}: ${r.stderr || r.error}`);
  };
  psql(`CREATE DATABASE ${name}`);
  url.pathname = `/${name}`;
  return { url: url.toString(), drop: () => psql(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}

/** `offshoot serve` (api, ws) with `limits`, on a database of its own. */
async function startLimitedServer(limits) {
  const port = await freePort();
  const file = path.join(os.tmpdir(), `offshoot-sdk-rl-${randomUUID()}.db`);
  const pg = BACKEND === 'postgres' ? ownPostgresDatabase() : null;
  const database = pg ? pg.url : `sqlite://${file}?mode=rwc`;
  const child = spawn(process.env.OFFSHOOT_SDK_BIN, ['serve'], {
    env: {
      ...process.env,
      DATABASE_URL: database,
      OFFSHOOT_LISTEN: `127.0.0.1:${port}`,
      OFFSHOOT_API_KEY: API_KEY,
      OFFSHOOT_API_SECRET: API_SECRET,
      OFFSHOOT_ROLES: 'api,ws',
      OFFSHOOT_RATE_LIMITS: limits,
      RUST_LOG: 'warn',
    },
    stdio: 'ignore',
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    const ok = await fetch(`${base}/healthz`).then((r) => r.status === 200).catch(() => false);
    if (ok) break;
    if (child.exitCode !== null) throw new Error(`the limited server exited with ${child.exitCode}`);
    if (Date.now() > deadline) throw new Error('the limited server was not healthy within 60 s');
    await new Promise((r) => setTimeout(r, 100));
  }
  after(async () => {
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGTERM');
    await exited;
    for (const suffix of ['', '-wal', '-shm']) fs.rmSync(`${file}${suffix}`, { force: true });
    pg?.drop();
  });
  return base;
}

test('a user over its limit gets a 429 with code 9 and the rate-limit headers; getRateLimits reads the budget', async () => {
  const base = await startLimitedServer('*=100000,SendMessage=10,user=3');
  const server = new StreamChat(API_KEY, API_SECRET, { baseURL: base, timeout: REST_TIMEOUT_MS, httpAgent });
  const alice = uid('alice');
  await server.upsertUsers([{ id: alice }]);
  const channelId = uid('rl');
  await server.channel('messaging', channelId, { created_by_id: alice, members: [alice] }).create();

  const client = new StreamChat(API_KEY, { baseURL: base, timeout: REST_TIMEOUT_MS, httpAgent, allowServerSideConnect: true });
  await client.connectUser({ id: alice }, server.createToken(alice));
  try {
    const channel = client.channel('messaging', channelId);
    await channel.watch();
    for (let i = 0; i < 3; i++) await channel.sendMessage({ text: `m${i}` });
    const err = await channel.sendMessage({ text: 'one too many' }).then(
      () => assert.fail('the fourth send is refused'),
      (e) => e,
    );
    assert.equal(err.status, 429, `the SDK error carries the status: ${err.message}`);
    assert.equal(err.code, 9, "Stream's code for too many requests");
    const headers = err.response?.headers ?? {};
    assert.equal(headers['x-ratelimit-limit'], '3');
    assert.equal(headers['x-ratelimit-remaining'], '0');
    assert.ok(Number(headers['x-ratelimit-reset']) >= Math.floor(Date.now() / 1000) - 1, 'reset is a Unix second');
    assert.ok(Number(headers['retry-after']) >= 1, 'Retry-After in seconds');
  } finally {
    await client.disconnectUser();
  }

  // Server-side: the app's web budget shows the three sends (the bucket of 10 refills one
  // every 6 s, so at most one has come back); the refused one spent nothing.
  const limits = await server.getRateLimits({ web: true, endpoints: ['SendMessage'] });
  assert.equal(limits.web.SendMessage.limit, 10);
  const left = limits.web.SendMessage.remaining;
  assert.ok(left >= 7 && left <= 8, `three of ten spent: ${left} remain`);
  assert.equal(limits.server_side, undefined, 'only the platform asked for');
});
