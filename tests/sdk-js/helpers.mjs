// Shared helpers of the JS SDK compatibility tests (stream-chat 9.53.0 against offshoot).
// tests/sdk-js/run.sh starts the server and sets OFFSHOOT_SDK_BASE_URL, OFFSHOOT_SDK_API_KEY
// and OFFSHOOT_SDK_API_SECRET; the tests build nothing. The server runs without the worker role:
// a test that needs backfills starts a worker process on the server's database (startWorker).
import http from 'node:http';
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { StreamChat } from 'stream-chat';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through tests/sdk-js/run.sh`);
  return v;
};

export const BASE_URL = env('OFFSHOOT_SDK_BASE_URL');
export const API_KEY = env('OFFSHOOT_SDK_API_KEY');
export const API_SECRET = env('OFFSHOOT_SDK_API_SECRET');
export const BACKEND = process.env.OFFSHOOT_SDK_BACKEND ?? 'unknown';

/**
 * Starts `offshoot serve` with only the worker role on the test server's database (the binary
 * and database run.sh gives), so backfills begin exactly when a test is ready for them. Its log
 * is appended to the file run.sh names (printed when the suite fails). `stop()` sends SIGTERM
 * and waits for the process to end (SIGKILL after 15 s).
 */
export function startWorker() {
  const log = fs.openSync(env('OFFSHOOT_SDK_WORKER_LOG'), 'a');
  const child = spawn(env('OFFSHOOT_SDK_BIN'), ['serve'], {
    env: {
      ...process.env,
      DATABASE_URL: env('OFFSHOOT_SDK_DATABASE_URL'),
      OFFSHOOT_LISTEN: '127.0.0.1:0',
      OFFSHOOT_API_KEY: API_KEY,
      OFFSHOOT_API_SECRET: API_SECRET,
      OFFSHOOT_ROLES: 'worker',
      OFFSHOOT_BACKFILL_PAGE_SIZE: process.env.OFFSHOOT_SDK_BACKFILL_PAGE_SIZE ?? '25',
      RUST_LOG: process.env.RUST_LOG ?? 'warn',
    },
    stdio: ['ignore', log, log],
  });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  return {
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
        await exited;
        clearTimeout(timer);
      }
      fs.closeSync(log);
    },
  };
}

/** Upper bound for any single awaited event. */
export const EVENT_TIMEOUT_MS = 20_000;
/** The JS SDK's REST timeout (its default, 3 s, is too tight for a debug build under load). */
export const REST_TIMEOUT_MS = 10_000;

// No keep-alive: every request closes its socket, so nothing keeps the test process alive.
const httpAgent = new http.Agent({ keepAlive: false });

/** A unique id with a readable prefix; every test makes its own users and channels. */
export const uid = (prefix) => `${prefix}-${randomUUID().slice(0, 12)}`;

/** A server-side client: `new StreamChat(key, secret, {baseURL})`, REST only. */
export function serverClient() {
  return new StreamChat(API_KEY, API_SECRET, { baseURL: BASE_URL, timeout: REST_TIMEOUT_MS, httpAgent });
}

/**
 * A client-side client connected over the WebSocket as `userId` with a token the server client
 * signs. The caller must `await client.disconnectUser()` (use `withUser`).
 */
export async function connectUser(server, userId, { logger } = {}) {
  const client = new StreamChat(API_KEY, { baseURL: BASE_URL, allowServerSideConnect: true, timeout: REST_TIMEOUT_MS, httpAgent, logger });
  // `wsBaseURL` is derived from baseURL (http → ws); the tests rely on that derivation.
  if (client.wsBaseURL !== BASE_URL.replace(/^http/, 'ws')) {
    throw new Error(`unexpected wsBaseURL ${client.wsBaseURL} for baseURL ${BASE_URL}`);
  }
  const me = await client.connectUser({ id: userId }, server.createToken(userId));
  return { client, me };
}

/** Runs `fn(client, me)` with a connected user and always disconnects it afterwards. */
export async function withUser(server, userId, fn) {
  const { client, me } = await connectUser(server, userId);
  try {
    return await fn(client, me);
  } finally {
    await client.disconnectUser();
  }
}

/**
 * Resolves with the first event of `type` on `target` (a client or a channel object) that
 * satisfies `predicate`; rejects after `timeoutMs`. Subscribe BEFORE triggering the event.
 */
export function nextEvent(target, type, predicate = () => true, timeoutMs = EVENT_TIMEOUT_MS) {
  let sub;
  let timer;
  const promise = new Promise((resolve, reject) => {
    timer = setTimeout(() => {
      sub?.unsubscribe();
      reject(new Error(`no ${type} event${target.cid ? ` on ${target.cid}` : ''} within ${timeoutMs} ms`));
    }, timeoutMs);
    sub = target.on(type, (event) => {
      let ok;
      try {
        ok = predicate(event);
      } catch (e) {
        ok = false;
      }
      if (!ok) return;
      clearTimeout(timer);
      sub.unsubscribe();
      resolve(event);
    });
  });
  promise.cancel = () => {
    clearTimeout(timer);
    sub?.unsubscribe();
  };
  return promise;
}

/** Collects every event of `type` on `target` until `stop()` is called. */
export function collectEvents(target, type) {
  const events = [];
  const sub = target.on(type, (e) => events.push(e));
  return { events, stop: () => sub.unsubscribe() };
}

/** A date that parses: a Date (or a string that `new Date` reads) that is not Invalid Date. */
export function isValidDate(v) {
  const d = v instanceof Date ? v : new Date(v);
  return !Number.isNaN(d.getTime());
}

/** Two users and an `agent` channel they are members of, created server-side. */
export async function makeConversation(server, { title = 'a conversation' } = {}) {
  const alice = uid('alice');
  const agent = uid('agent');
  await server.upsertUsers([
    { id: alice, name: 'Alice' },
    { id: agent, name: 'Agent', role: 'user' },
  ]);
  const channel = server.channel('agent', uid('conv'), { members: [alice, agent], created_by_id: alice, title });
  await channel.create();
  return { channel, alice, agent };
}

/**
 * Sends `n` top-level messages server-side with explicit, strictly increasing `created_at`
 * (one second apart, ending a minute ago), `concurrency` at a time. Returns their ids, oldest
 * first.
 */
export async function seedMessages(channel, users, n, { concurrency = 8, textPrefix = 'message' } = {}) {
  const start = Date.now() - 60_000 - n * 1000;
  const ids = new Array(n);
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      const id = uid(`m${i}`);
      const r = await channel.sendMessage({
        id,
        text: `${textPrefix} ${i}`,
        user_id: users[i % users.length],
        created_at: new Date(start + i * 1000).toISOString(),
        seq: i,
      });
      if (r.message.id !== id) throw new Error(`sendMessage returned id ${r.message.id}, sent ${id}`);
      ids[i] = id;
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, n) }, worker));
  return ids;
}

/** `POST /channels/agent/{id}/fork` through the SDK's signed request helper. */
export function fork(server, sourceId, body) {
  return server.post(`${server.baseURL}/channels/agent/${encodeURIComponent(sourceId)}/fork`, body);
}
