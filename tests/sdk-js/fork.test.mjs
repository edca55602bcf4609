// The fork over raw HTTP through the JS SDK's signed request helper (the SDK has no fork
// method), and `channel.forked` over the WebSocket to the source's watchers and the fork's
// members and watchers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverClient, connectUser, makeConversation, seedMessages, nextEvent, collectEvents, fork, uid, isValidDate, startWorker } from './helpers.mjs';

// The server runs without the worker role; the long fork's test starts a worker process once
// its client watches the fork, so the watch certainly sees the fork backfilling.

/** Every message of a channel, oldest first, paging backwards with id_lt. */
async function allMessages(channel, pageSize = 100) {
  const out = [];
  let idLt;
  for (let guard = 0; guard < 100; guard++) {
    const r = await channel.query({ messages: idLt ? { limit: pageSize, id_lt: idLt } : { limit: pageSize } });
    if (r.messages.length === 0) break;
    out.unshift(...r.messages);
    if (r.messages.length < pageSize) break;
    idLt = r.messages[0].id;
  }
  return out;
}

async function disconnectAll(...clients) {
  await Promise.all(clients.filter(Boolean).map((c) => c.disconnectUser()));
}

test('a short fork completes at once; the source watcher and the fork member both get channel.forked', async () => {
  const server = serverClient();
  const { channel: source, alice, agent } = await makeConversation(server, { title: 'source' });
  const carol = uid('carol');
  await server.upsertUsers([{ id: carol, name: 'Carol' }]);
  const ids = await seedMessages(source, [alice, agent], 6);
  const forkId = uid('branch');
  const forkCid = `agent:${forkId}`;

  let aliceClient;
  let carolClient;
  try {
    ({ client: aliceClient } = await connectUser(server, alice));
    ({ client: carolClient } = await connectUser(server, carol));
    const watchedSource = aliceClient.channel('agent', source.id);
    await watchedSource.watch();

    const onSource = nextEvent(watchedSource, 'channel.forked', (e) => e.fork?.channel_cid === forkCid);
    // Carol is a member of the fork only, connected but watching nothing: she hears it as a member.
    const onFork = nextEvent(carolClient, 'channel.forked', (e) => e.cid === forkCid);
    const added = nextEvent(carolClient, 'notification.added_to_channel', (e) => e.channel?.cid === forkCid || e.cid === forkCid);
    const collected = collectEvents(carolClient, 'channel.forked');

    // Fork at the fifth message: the sixth is not copied.
    const r = await fork(server, source.id, {
      message_id: ids[4],
      channel: { id: forkId, data: { title: 'the branch', topic: 'what-if' }, members: [alice, carol] },
      user_id: carol,
    });
    assert.equal(r.channel.cid, forkCid);
    assert.equal(r.channel.title, 'the branch', 'channel.data custom fields apply to the fork');
    assert.equal(r.channel.topic, 'what-if');
    assert.equal(r.channel.created_by?.id, carol, 'user_id becomes the fork creator');
    assert.equal(r.fork.channel_cid, forkCid);
    assert.equal(r.fork.source_channel_cid, source.cid);
    assert.equal(r.fork.source_message_id, ids[4]);
    assert.equal(r.fork.status, 'completed');
    assert.equal(r.fork.copied_message_count, 5);
    assert.ok(isValidDate(r.fork.created_at), `fork.created_at parses: ${r.fork.created_at}`);
    assert.deepEqual(Object.keys(r.fork.message_id_map).sort(), ids.slice(0, 5).sort());
    assert.deepEqual(r.messages.map((m) => m.id), ids.slice(0, 5).map((id) => r.fork.message_id_map[id]));
    assert.deepEqual(r.messages.map((m) => m.text), ids.slice(0, 5).map((_, i) => `message ${i}`));
    assert.deepEqual(r.members.map((m) => m.user_id).sort(), [alice, carol].sort());
    assert.equal(r.channel.fork?.status, 'completed', 'the fork channel carries its summary');
    assert.equal(r.channel.fork?.message_id_map, undefined, 'channel.fork has no message_id_map');

    const ev = await onSource;
    assert.equal(ev.cid, source.cid, 'the source watcher hears it on the source cid');
    assert.equal(ev.fork.channel_cid, forkCid);
    assert.equal(ev.fork.source_channel_cid, source.cid);
    assert.equal(ev.fork.status, 'completed');
    assert.equal(ev.fork.copied_message_count, 5);
    assert.equal(ev.fork.message_id_map, undefined, 'events carry no message_id_map');
    assert.equal(ev.channel?.cid, source.cid);
    assert.equal(ev.user?.id, carol);
    assert.ok(isValidDate(ev.created_at));

    const fev = await onFork;
    assert.equal(fev.cid, forkCid);
    assert.equal(fev.channel?.cid, forkCid);
    assert.equal(fev.fork.channel_cid, forkCid);
    assert.equal(fev.fork.status, 'completed');
    assert.equal(fev.fork.copied_message_count, 5);
    await added;

    // Once per user and channel: a marker sent after it arrives after any duplicate would.
    const forkForCarol = carolClient.channel('agent', forkId);
    await forkForCarol.watch();
    const marker = nextEvent(forkForCarol, 'message.new', (e) => e.message?.text === 'marker');
    await server.channel('agent', forkId).sendMessage({ text: 'marker', user_id: carol });
    await marker;
    collected.stop();
    assert.equal(collected.events.filter((e) => e.cid === forkCid).length, 1, 'channel.forked arrives once');

    // The source is unchanged.
    const src = await source.query({ messages: { limit: 25 } });
    assert.deepEqual(src.messages.map((m) => m.id), ids);
    assert.equal(src.channel.fork, undefined, 'a channel that is not a fork has no fork field');
  } finally {
    await disconnectAll(aliceClient, carolClient);
  }
});

test('a long fork backfills; channel.forked arrives later, completed, on the source and on the watched fork', async () => {
  const server = serverClient();
  const { channel: source, alice, agent } = await makeConversation(server, { title: 'long source' });
  const carol = uid('carol');
  await server.upsertUsers([{ id: carol, name: 'Carol' }]);
  const N = 160;
  const ids = await seedMessages(source, [alice, agent], N, { textPrefix: 'turn' });
  const forkId = uid('long-branch');
  const forkCid = `agent:${forkId}`;

  let aliceClient;
  let carolClient;
  let worker;
  try {
    ({ client: aliceClient } = await connectUser(server, alice));
    ({ client: carolClient } = await connectUser(server, carol));
    const watchedSource = aliceClient.channel('agent', source.id);
    const srcState = await watchedSource.watch();
    assert.equal(srcState.messages.at(-1).id, ids.at(-1));

    // Subscribe before the fork request: the fork may finish before anything else returns.
    const onSource = nextEvent(watchedSource, 'channel.forked', (e) => e.fork?.channel_cid === forkCid);
    const forkForCarol = carolClient.channel('agent', forkId);
    const onFork = nextEvent(forkForCarol, 'channel.forked', (e) => e.cid === forkCid);
    const carolForked = collectEvents(carolClient, 'channel.forked');
    const aliceForked = collectEvents(aliceClient, 'channel.forked');

    const r = await fork(server, source.id, { message_id: ids.at(-1), channel: { id: forkId, members: [alice, carol] }, user_id: alice });
    assert.equal(r.channel.cid, forkCid);
    assert.equal(r.fork.status, 'backfilling', 'more than 100 top-level messages: the rest is copied later');
    assert.equal(r.fork.copied_message_count, 0, 'the count is set once the fork is completed');
    assert.equal(typeof r.fork.task_id, 'string');
    assert.ok(r.fork.task_id.length > 0);
    assert.equal(Object.keys(r.fork.message_id_map).length, 100, 'the request copies the newest 100');
    assert.deepEqual(Object.keys(r.fork.message_id_map).sort(), ids.slice(-100).sort());
    assert.equal(r.fork.message_id_map[ids[0]], undefined, 'the oldest come later');
    assert.equal(r.messages.at(-1).id, r.fork.message_id_map[ids.at(-1)], 'the newest page is there at once');
    assert.equal(r.messages.at(-1).text, `turn ${N - 1}`);

    // Carol, a member of the fork, watches it while it backfills: no worker runs yet.
    const watchState = await forkForCarol.watch();
    assert.equal(watchState.channel.cid, forkCid);
    assert.equal(watchState.channel.fork?.status, 'backfilling', 'no worker has started: the history is still to be copied');
    assert.equal(watchState.messages.at(-1).id, r.fork.message_id_map[ids.at(-1)], 'the watch shows the newest page, copied by the request');
    worker = startWorker();

    const ev = await onSource;
    assert.equal(ev.cid, source.cid);
    assert.equal(ev.fork.channel_cid, forkCid);
    assert.equal(ev.fork.status, 'completed');
    assert.equal(ev.fork.copied_message_count, N);
    assert.equal(ev.fork.task_id, r.fork.task_id);
    assert.equal(ev.user?.id, alice);

    const fev = await onFork;
    assert.equal(fev.cid, forkCid);
    assert.equal(fev.channel?.cid, forkCid);
    assert.equal(fev.fork.status, 'completed');
    assert.equal(fev.fork.copied_message_count, N);

    // Exactly once each: markers sent after the fork finished arrive after any duplicate would.
    const markSrc = nextEvent(watchedSource, 'message.new', (e) => e.message?.text === 'marker');
    const markFork = nextEvent(forkForCarol, 'message.new', (e) => e.message?.text === 'marker');
    await source.sendMessage({ text: 'marker', user_id: alice });
    await server.channel('agent', forkId).sendMessage({ text: 'marker', user_id: alice });
    await Promise.all([markSrc, markFork]);
    carolForked.stop();
    aliceForked.stop();
    assert.deepEqual(carolForked.events.map((e) => e.cid), [forkCid], 'carol (fork member) hears it once, on the fork');
    assert.deepEqual(aliceForked.events.map((e) => e.cid).sort(), [forkCid, source.cid].sort(), 'alice (member of both) hears both, once each');

    // The task finished, and the fork now holds the whole history with the source's timestamps.
    const task = await server.getTask(r.fork.task_id);
    assert.equal(task.status, 'completed');
    const forkChannel = server.channel('agent', forkId);
    const copied = (await allMessages(forkChannel)).filter((m) => m.text !== 'marker');
    assert.equal(copied.length, N);
    assert.deepEqual(copied.map((m) => m.text), ids.map((_, i) => `turn ${i}`));
    const sourceAll = await allMessages(source);
    const srcById = new Map(sourceAll.map((m) => [m.id, m]));
    copied.forEach((m, i) => {
      assert.ok(isValidDate(m.created_at));
      assert.equal(m.created_at, srcById.get(ids[i]).created_at, `copy ${i} keeps the source's created_at`);
      assert.equal(m.seq, i, 'custom fields are copied');
    });
    const q = await forkChannel.query({ messages: { limit: 1 } });
    assert.equal(q.channel.fork?.status, 'completed');
    assert.equal(q.channel.fork?.copied_message_count, N);

    // The lookup endpoint maps the backfilled (oldest) messages too; a member may call it.
    const lookup = await carolClient.post(`${carolClient.baseURL}/channels/agent/${forkId}/fork/message_ids`, { source_message_ids: ids.slice(0, 3) });
    assert.deepEqual(Object.keys(lookup.message_id_map).sort(), ids.slice(0, 3).sort());
    assert.deepEqual(ids.slice(0, 3).map((id) => lookup.message_id_map[id]), copied.slice(0, 3).map((m) => m.id));
  } finally {
    await worker?.stop();
    await disconnectAll(aliceClient, carolClient);
  }
});

test('fork errors surface as rejected promises with Stream codes', async () => {
  const server = serverClient();
  const { channel: source, alice, agent } = await makeConversation(server);
  const ids = await seedMessages(source, [alice, agent], 2);

  // A message that is not in the source: 400, code 4.
  await assert.rejects(fork(server, source.id, { message_id: uid('nope'), channel: { id: uid('f') } }), (err) => err.status === 400 && err.code === 4);
  // The target exists and is not this fork: 400, code 4, fork_target_exists.
  const other = server.channel('agent', uid('exists'), { members: [alice], created_by_id: alice });
  await other.create();
  await assert.rejects(fork(server, source.id, { message_id: ids[1], channel: { id: other.id } }), (err) => {
    assert.equal(err.status, 400);
    assert.equal(err.code, 4);
    assert.equal(err.response?.data?.exception_fields?.reason, 'fork_target_exists');
    return true;
  });
  // Users cannot fork, not even a member of the source: 403, code 17.
  const { client } = await connectUser(server, alice);
  try {
    await assert.rejects(
      client.post(`${client.baseURL}/channels/agent/${source.id}/fork`, { message_id: ids[1], channel: { id: uid('f') } }),
      (err) => err.status === 403 && err.code === 17,
    );
  } finally {
    await client.disconnectUser();
  }
  // A retry of the same fork returns the existing one.
  const forkId = uid('retry');
  const first = await fork(server, source.id, { message_id: ids[1], channel: { id: forkId } });
  const again = await fork(server, source.id, { message_id: ids[1], channel: { id: forkId } });
  assert.equal(again.channel.cid, first.channel.cid);
  assert.equal(again.fork.status, 'completed');
  assert.deepEqual(again.messages.map((m) => m.id), first.messages.map((m) => m.id));
});
