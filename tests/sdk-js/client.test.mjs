// Client-side JS SDK over the WebSocket: connectUser, watch, live events, disconnectUser.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverClient, connectUser, withUser, makeConversation, nextEvent, isValidDate, BASE_URL } from './helpers.mjs';

test('connectUser opens the WebSocket and disconnectUser closes it cleanly', async () => {
  const server = serverClient();
  const { alice } = await makeConversation(server);
  const logs = [];
  const logger = (level, message) => logs.push(`${level} ${message}`);
  const { client, me } = await connectUser(server, alice, { logger });
  let disconnected = false;
  try {
    assert.equal(client.wsBaseURL, BASE_URL.replace(/^http/, 'ws'));
    assert.ok(me, 'connectUser resolves with the first event');
    assert.ok(['connection.ok', 'health.check'].includes(me.type), `the first frame is connection.ok or health.check, not ${me.type}`);
    assert.equal(me.me?.id, alice, 'the event carries the connected user as `me`');
    assert.equal(typeof me.connection_id, 'string');
    assert.ok(me.connection_id.length > 0);
    assert.equal(client.userID, alice);
    assert.equal(client._getConnectionID(), me.connection_id);
    assert.equal(client.user?.name, 'Alice', 'the server sends the stored user back as `me`');
    const conn = client.wsConnection;
    assert.equal(conn?.isHealthy, true);
    const ws = conn.ws;
    assert.equal(ws.readyState, ws.OPEN);

    await client.disconnectUser();
    disconnected = true;
    assert.equal(client.userID, undefined);
    assert.equal(conn.isHealthy, false);
    assert.equal(conn.isDisconnected, true);
    assert.equal(ws.readyState, ws.CLOSED, 'the socket is closed');
    // The SDK waits up to 1 s for the server's close frame and logs which way it ended.
    assert.ok(
      logs.some((l) => l.includes('resolving isClosedPromise with close frame')),
      `the server answered the close handshake (logs: ${logs.filter((l) => l.includes('isClosedPromise')).join(' | ') || 'none'})`,
    );
  } finally {
    if (!disconnected) await client.disconnectUser();
  }
});

test('a bad token makes connectUser reject with the auth error, and the client does not reconnect', async () => {
  const server = serverClient();
  const { alice } = await makeConversation(server);
  const { StreamChat } = await import('stream-chat');
  // The SDK's own log tells connection attempts and reconnects apart.
  const log = [];
  const logger = (level, message) => log.push(message);
  const client = new StreamChat(server.key, { baseURL: BASE_URL, allowServerSideConnect: true, timeout: 10_000, logger });
  // A token for alice signed with another secret: the SDK cannot tell (it refuses a token for
  // another user itself, before connecting), the server must refuse it.
  const wrong = new StreamChat(server.key, `not-the-secret-${'x'.repeat(32)}`).createToken(alice);
  try {
    await assert.rejects(client.connectUser({ id: alice }, wrong), (err) => {
      // The server's connection.error, not a timeout or a dropped socket: the SDK rethrows it as
      // JSON with isWSFailure false, which is what stops it from reconnecting.
      const e = JSON.parse(err.message);
      assert.equal(e.StatusCode, 401, err.message);
      assert.equal(e.code, 43, `a bad signature is code 43: ${err.message}`);
      assert.equal(e.isWSFailure, false, err.message);
      return true;
    });
    // On that error the SDK gives up at once: it disconnects itself, so nothing reconnects later.
    assert.ok(log.some((m) => m.startsWith('client:disconnect()')), `the SDK disconnected: ${JSON.stringify(log)}`);
    const attempts = log.filter((m) => m.startsWith('connection:_connect() - Connecting to'));
    assert.equal(attempts.length, 1, `one connection attempt: ${JSON.stringify(log)}`);
    assert.ok(!log.some((m) => m.startsWith('connection:_reconnect()')), `no reconnect: ${JSON.stringify(log)}`);
  } finally {
    await client.disconnectUser();
  }
});

test('a watching client receives message.new with parseable dates', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server);
  await channel.sendMessage({ text: 'before the watch', user_id: agent });

  await withUser(server, alice, async (client) => {
    const watched = client.channel('agent', channel.id);
    const state = await watched.watch();
    assert.equal(state.channel.cid, channel.cid);
    assert.deepEqual(state.messages.map((m) => m.text), ['before the watch']);
    assert.deepEqual(Object.keys(watched.state.members).sort(), [alice, agent].sort());
    assert.ok(watched.initialized);
    // The loaded history went through formatMessage: created_at is a valid Date.
    const loaded = watched.state.messages[0];
    assert.ok(loaded.created_at instanceof Date, 'created_at is a Date');
    assert.ok(isValidDate(loaded.created_at), `created_at is not Invalid Date: ${loaded.created_at}`);

    // The server client sends; the watcher hears it.
    const got = nextEvent(watched, 'message.new', (e) => e.message?.text === 'live from the server');
    const sent = await channel.sendMessage({ text: 'live from the server', user_id: agent, ai_generated: true });
    const ev = await got;
    assert.equal(ev.type, 'message.new');
    assert.equal(ev.cid, channel.cid);
    assert.equal(ev.channel_id, channel.id);
    assert.equal(ev.channel_type, 'agent');
    assert.equal(ev.message.id, sent.message.id);
    assert.equal(ev.message.ai_generated, true, 'custom fields are flat in events');
    assert.equal(ev.user?.id, agent);
    assert.equal(typeof ev.created_at, 'string', 'event created_at is an RFC 3339 string');
    assert.ok(isValidDate(ev.created_at), `event created_at parses: ${ev.created_at}`);

    // The SDK added the message to the channel state, with Date objects.
    const local = watched.state.messages.find((m) => m.id === sent.message.id);
    assert.ok(local, 'the live message is in the local channel state');
    assert.ok(local.created_at instanceof Date, 'message.created_at is a Date');
    assert.ok(isValidDate(local.created_at), `message.created_at is not Invalid Date: ${local.created_at}`);
    assert.equal(local.created_at.toISOString(), new Date(sent.message.created_at).toISOString());
    assert.ok(isValidDate(local.updated_at));
    assert.deepEqual(watched.state.messages.map((m) => m.text), ['before the watch', 'live from the server']);
  });
});

test('a connected user sends a message over REST; every watcher hears it', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server);
  await withUser(server, alice, async (aliceClient) => {
    await withUser(server, agent, async (agentClient) => {
      const a = aliceClient.channel('agent', channel.id);
      const b = agentClient.channel('agent', channel.id);
      await a.watch();
      await b.watch();
      const heardByAgent = nextEvent(b, 'message.new', (e) => e.message?.text === 'hi agent');
      const heardByAlice = nextEvent(a, 'message.new', (e) => e.message?.text === 'hi agent');
      const r = await a.sendMessage({ text: 'hi agent', note: 'client-side custom' });
      assert.equal(r.message.user.id, alice);
      assert.equal(r.message.note, 'client-side custom');
      const [evB, evA] = await Promise.all([heardByAgent, heardByAlice]);
      assert.equal(evB.message.id, r.message.id);
      assert.equal(evA.message.id, r.message.id);
      assert.equal(evB.user.id, alice);

      // Updates and deletes reach watchers as well.
      const updated = nextEvent(b, 'message.updated', (e) => e.message?.id === r.message.id);
      await server.partialUpdateMessage(r.message.id, { set: { text: 'hi agent (edited)' } }, alice);
      assert.equal((await updated).message.text, 'hi agent (edited)');
      const deleted = nextEvent(b, 'message.deleted', (e) => e.message?.id === r.message.id);
      await server.deleteMessage(r.message.id);
      const del = await deleted;
      assert.equal(del.message.type, 'deleted');
      assert.ok(isValidDate(del.message.deleted_at));
    });
  });
});

test('a user who is not a member cannot watch the channel', async () => {
  const server = serverClient();
  const { channel } = await makeConversation(server);
  const outsider = `outsider-${channel.id}`;
  await server.upsertUsers([{ id: outsider }]);
  await withUser(server, outsider, async (client) => {
    await assert.rejects(client.channel('agent', channel.id).watch(), (err) => err.status === 403 || err.status === 404);
  });
});
