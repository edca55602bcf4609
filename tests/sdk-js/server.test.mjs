// Server-side REST with the official JS SDK: `new StreamChat(key, secret, {baseURL})`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverClient, makeConversation, seedMessages, uid, isValidDate } from './helpers.mjs';

test('upsertUsers stores users with their custom fields (flat, legacy dialect)', async () => {
  const server = serverClient();
  const id = uid('user');
  const r = await server.upsertUsers([{ id, name: 'Upserted', color: 'teal', tier: 3 }]);
  const u = r.users[id];
  assert.ok(u, `the response has users[${id}]`);
  assert.equal(u.id, id);
  assert.equal(u.name, 'Upserted');
  assert.equal(u.color, 'teal', 'custom fields are flat in the legacy dialect');
  assert.equal(u.tier, 3);
  assert.equal(u.custom, undefined, 'no nested custom object on legacy paths');
  assert.ok(isValidDate(u.created_at), `user created_at parses: ${u.created_at}`);
  assert.equal(typeof r.duration, 'string');

  // Upsert again: the user is replaced, not duplicated.
  const again = await server.upsertUsers([{ id, name: 'Renamed' }]);
  assert.equal(again.users[id].name, 'Renamed');
  const found = await server.queryUsers({ id: { $in: [id] } });
  assert.deepEqual(found.users.map((x) => x.id), [id]);
  assert.equal(found.users[0].name, 'Renamed');
});

test('a channel created with members, data and custom fields reads back', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server, { title: 'created' });
  assert.equal(channel.cid, `agent:${channel.id}`);
  const state = await channel.query({ state: true });
  assert.equal(state.channel.cid, channel.cid);
  assert.equal(state.channel.type, 'agent');
  assert.equal(state.channel.title, 'created', 'custom channel data is flat');
  assert.equal(state.channel.created_by?.id, alice);
  assert.ok(isValidDate(state.channel.created_at), `channel created_at parses: ${state.channel.created_at}`);
  assert.deepEqual(state.members.map((m) => m.user_id).sort(), [alice, agent].sort());
  assert.deepEqual(state.messages, []);
  // The SDK keeps the members in the channel's local state as well.
  assert.deepEqual(Object.keys(channel.state.members).sort(), [alice, agent].sort());
});

test('sendMessage keeps custom fields; getMessage returns the message with its channel', async () => {
  const server = serverClient();
  const { channel, agent } = await makeConversation(server);
  const sent = await channel.sendMessage({
    text: 'the answer is 42',
    user_id: agent,
    ai_generated: true,
    generating: false,
    meta: { model: 'm-1', tokens: [1, 2, 3] },
  });
  const m = sent.message;
  assert.equal(typeof m.id, 'string');
  assert.ok(m.id.length > 0);
  assert.equal(m.text, 'the answer is 42');
  assert.equal(m.user.id, agent);
  assert.equal(m.type, 'regular');
  assert.equal(m.cid, channel.cid);
  assert.equal(m.ai_generated, true, 'custom fields come back flat');
  assert.equal(m.generating, false);
  assert.deepEqual(m.meta, { model: 'm-1', tokens: [1, 2, 3] });
  assert.equal(typeof m.created_at, 'string', 'legacy timestamps are RFC 3339 strings');
  assert.ok(isValidDate(m.created_at), `created_at parses: ${m.created_at}`);
  assert.ok(Math.abs(new Date(m.created_at).getTime() - Date.now()) < 5 * 60_000, 'created_at is about now');

  const got = await server.getMessage(m.id);
  assert.equal(got.message.id, m.id);
  assert.equal(got.message.text, 'the answer is 42');
  assert.equal(got.message.ai_generated, true);
  assert.deepEqual(got.message.meta, { model: 'm-1', tokens: [1, 2, 3] });
  assert.equal(got.message.channel?.cid, channel.cid, 'getMessage includes the channel');
  assert.equal(got.message.created_at, m.created_at);
});

test('sendMessage honours a server-side created_at', async () => {
  const server = serverClient();
  const { channel, alice } = await makeConversation(server);
  const at = '2024-03-01T12:34:56.789Z';
  const r = await channel.sendMessage({ text: 'from the past', user_id: alice, created_at: at });
  assert.equal(new Date(r.message.created_at).toISOString(), at);
});

test('query pages messages oldest first, with limit and id_lt', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server);
  const ids = await seedMessages(channel, [alice, agent], 30);

  const newest = await channel.query({ messages: { limit: 10 } });
  assert.deepEqual(newest.messages.map((m) => m.id), ids.slice(20), 'the newest page, oldest first');
  assert.ok(newest.messages.every((m) => isValidDate(m.created_at)));

  const older = await channel.query({ messages: { limit: 10, id_lt: ids[20] } });
  assert.deepEqual(older.messages.map((m) => m.id), ids.slice(10, 20));

  const oldest = await channel.query({ messages: { limit: 25, id_lt: ids[10] } });
  assert.deepEqual(oldest.messages.map((m) => m.id), ids.slice(0, 10), 'a short last page');

  const none = await channel.query({ messages: { limit: 10, id_lt: ids[0] } });
  assert.deepEqual(none.messages, []);

  const newer = await channel.query({ messages: { limit: 5, id_gt: ids[4] } });
  assert.deepEqual(newer.messages.map((m) => m.id), ids.slice(5, 10));

  // The SDK's own paginator state: the local state holds Date objects.
  const local = channel.state.messages;
  assert.ok(local.length > 0);
  assert.ok(local.every((m) => m.created_at instanceof Date && isValidDate(m.created_at)), 'formatted dates are valid');
});

test('partialUpdateMessage sets and unsets fields', async () => {
  const server = serverClient();
  const { channel, agent } = await makeConversation(server);
  const { message } = await channel.sendMessage({ text: 'draft', user_id: agent, generating: true, scratch: 'x' });
  const r = await server.partialUpdateMessage(message.id, { set: { text: 'final', generating: false, score: 7 }, unset: ['scratch'] }, agent);
  assert.equal(r.message.id, message.id);
  assert.equal(r.message.text, 'final');
  assert.equal(r.message.generating, false);
  assert.equal(r.message.score, 7);
  assert.equal(r.message.scratch, undefined, 'unset removes the custom field');
  assert.ok(isValidDate(r.message.updated_at));

  const got = await server.getMessage(message.id);
  assert.equal(got.message.text, 'final');
  assert.equal(got.message.generating, false);
  assert.equal(got.message.scratch, undefined);
});

test('deleteMessage soft-deletes, and a hard delete makes the message missing', async () => {
  const server = serverClient();
  const { channel, alice } = await makeConversation(server);
  const a = (await channel.sendMessage({ text: 'soft', user_id: alice })).message;
  const b = (await channel.sendMessage({ text: 'hard', user_id: alice })).message;

  const soft = await server.deleteMessage(a.id);
  assert.equal(soft.message.id, a.id);
  assert.equal(soft.message.type, 'deleted');
  assert.ok(isValidDate(soft.message.deleted_at), `deleted_at parses: ${soft.message.deleted_at}`);

  const hard = await server.deleteMessage(b.id, { hardDelete: true });
  assert.equal(hard.message.id, b.id);
  await assert.rejects(server.getMessage(b.id), (err) => err.code === 16 && err.status === 404);

  const state = await channel.query({ messages: { limit: 25 } });
  assert.ok(!state.messages.some((m) => m.id === b.id), 'the hard-deleted message is gone from the channel');
  // A soft-deleted message stays in the channel, shown as type `deleted`.
  const softInState = state.messages.find((m) => m.id === a.id);
  assert.ok(softInState, `the soft-deleted message is still in the channel: ${state.messages.map((m) => m.id)}`);
  assert.equal(softInState.type, 'deleted');
});

test('queryChannels filters by member and sorts', async () => {
  const server = serverClient();
  const { channel: first, alice } = await makeConversation(server, { title: 'first' });
  const second = server.channel('agent', uid('conv'), { members: [alice], created_by_id: alice, title: 'second' });
  await second.create();
  await second.sendMessage({ text: 'hello', user_id: alice });

  const newestFirst = await server.queryChannels({ type: 'agent', members: { $in: [alice] } }, [{ created_at: -1 }], { limit: 10 });
  assert.deepEqual(newestFirst.map((c) => c.cid), [second.cid, first.cid]);
  assert.equal(newestFirst[0].data.title, 'second');
  assert.deepEqual(newestFirst[0].state.messages.map((m) => m.text), ['hello']);
  assert.ok(newestFirst[0].state.messages[0].created_at instanceof Date);
  assert.ok(isValidDate(newestFirst[0].state.messages[0].created_at));

  const oldestFirst = await server.queryChannels({ type: 'agent', members: { $in: [alice] } }, [{ created_at: 1 }], { limit: 10 });
  assert.deepEqual(oldestFirst.map((c) => c.cid), [first.cid, second.cid]);

  const byCid = await server.queryChannels({ cid: { $in: [first.cid] } }, {}, { limit: 10 });
  assert.deepEqual(byCid.map((c) => c.cid), [first.cid]);

  const nobody = await server.queryChannels({ type: 'agent', members: { $in: [uid('nobody')] } });
  assert.deepEqual(nobody, []);
});

test('a missing message is a rejected promise with code 16 and status 404', async () => {
  const server = serverClient();
  const missing = uid('no-such-message');
  await assert.rejects(server.getMessage(missing), (err) => {
    assert.ok(err instanceof Error);
    assert.equal(err.code, 16);
    assert.equal(err.status, 404);
    assert.match(err.message, /StreamChat error code 16/);
    assert.equal(err.response?.data?.StatusCode, 404);
    return true;
  });
  await assert.rejects(server.partialUpdateMessage(missing, { set: { text: 'x' } }, uid('u')), (err) => err.code === 16 && err.status === 404);
});
