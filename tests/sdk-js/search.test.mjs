// Message search with the official JS SDK: `client.search` server-side and as a connected user,
// `channel.search`, and the UI kit's search source (`MessageSearchSource`, what the React UI
// kit's search box runs) with its exact request and its `next` pages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MessageSearchSource } from 'stream-chat';
import { serverClient, uid, withUser } from './helpers.mjs';

/** Two users, two channels (`mine` with both, `theirs` with the other only) and messages. */
async function seedSearch(server) {
  const me = uid('seeker');
  const other = uid('other');
  await server.upsertUsers([{ id: me }, { id: other }]);
  const mine = server.channel('agent', uid('s-mine'), { created_by_id: me, members: [me, other] });
  const theirs = server.channel('agent', uid('s-theirs'), { created_by_id: other, members: [other] });
  await mine.create();
  await theirs.create();
  const word = `w${uid('x').replace(/[^a-z0-9]/g, '')}`;
  const sent = [];
  for (let i = 0; i < 7; i++) {
    const r = await mine.sendMessage({ text: `Café ${word} number ${i}`, user_id: i % 2 ? other : me });
    sent.push(r.message.id);
  }
  await mine.sendMessage({ text: 'nothing to find here', user_id: me });
  await theirs.sendMessage({ text: `cafe ${word} not for the seeker`, user_id: other });
  return { me, other, mine, theirs, word, sent };
}

test('client.search server-side: query string and message filters, results carry their channel', async () => {
  const server = serverClient();
  const { mine, theirs, word, sent } = await seedSearch(server);
  const r = await server.search({ cid: { $in: [mine.cid, theirs.cid] } }, word, { limit: 100 });
  assert.equal(r.results.length, 8, 'every channel server-side');
  assert.equal(typeof r.duration, 'string');
  const inMine = r.results.filter(({ message }) => message.channel?.cid === mine.cid).map(({ message }) => message.id);
  assert.deepEqual(inMine.sort(), [...sent].sort());
  const filtered = await server.search({ cid: mine.cid }, { text: { $autocomplete: 'caf' }, 'user.id': { $ne: sent[0] } }, { limit: 3, sort: [{ created_at: -1 }] });
  assert.equal(filtered.results.length, 3);
  assert.deepEqual(filtered.results.map(({ message }) => message.id), [sent[6], sent[5], sent[4]], 'newest first');
  assert.equal(typeof filtered.next, 'string', 'more pages: a next cursor');
  const page2 = await server.search({ cid: mine.cid }, { text: { $autocomplete: 'caf' } }, { limit: 3, next: filtered.next });
  assert.deepEqual(page2.results.map(({ message }) => message.id), [sent[3], sent[2], sent[1]], 'the sort travels in the cursor');
  await assert.rejects(server.search({ cid: mine.cid }, word, { limit: 1000 }), (e) => e.code === 4 && e.status === 400);
});

test('a user finds only messages of their channels, with client.search and channel.search', async () => {
  const server = serverClient();
  const { me, mine, theirs, word, sent } = await seedSearch(server);
  await withUser(server, me, async (client) => {
    const r = await client.search({ members: { $in: [me] } }, `CAFE ${word}`, { limit: 10 });
    assert.deepEqual(r.results.map(({ message }) => message.id).sort(), [...sent].sort());
    assert.ok(r.results.every(({ message }) => message.channel.cid === mine.cid && message.user?.id), 'with channel and user');
    const none = await client.search({ cid: theirs.cid }, word);
    assert.deepEqual(none.results, [], 'not a member of theirs');
    const channel = client.channel('agent', mine.id);
    const own = await channel.search({ text: word, type: 'regular' }, { limit: 2, offset: 2 });
    assert.equal(own.results.length, 2);
  });
});

test('the UI kit search source sends its request and pages with next', async () => {
  const server = serverClient();
  const { me, mine, word, sent } = await seedSearch(server);
  await withUser(server, me, async (client) => {
    const source = new MessageSearchSource(client, { pageSize: 4 });
    source.activate();
    await source.executeQuery(word);
    assert.equal(source.lastQueryError, undefined, `${source.lastQueryError}`);
    assert.deepEqual(source.items.map((m) => m.id), [sent[6], sent[5], sent[4], sent[3]], 'newest first');
    assert.ok(source.items.every((m) => m.cid === mine.cid));
    assert.equal(typeof source.next, 'string', 'a next page');
    await source.executeQuery();
    assert.equal(source.lastQueryError, undefined, `${source.lastQueryError}`);
    assert.deepEqual(source.items.map((m) => m.id), [...sent].reverse(), 'the second page appended');
    assert.equal(source.hasNext, false, 'the last page');
  });
});
