// Two connected JS clients: presence (user.presence.changed when the other connects and
// disconnects, applied by the SDK to its users and the channel's members), watchers
// (user.watching.start / stop, watcher_count) and unread counters (they move when the other
// sends and go back to 0 when the reader marks the channel read).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverClient, connectUser, withUser, makeConversation, nextEvent, isValidDate } from './helpers.mjs';

test('a watcher with presence: true hears the other user come online and go offline', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server);
  await withUser(server, alice, async (a) => {
    const watched = a.channel('agent', channel.id);
    const state = await watched.watch({ presence: true });
    assert.equal(state.members.find((m) => m.user_id === agent)?.user?.online, false, 'the agent is not connected yet');

    const online = nextEvent(a, 'user.presence.changed', (e) => e.user?.id === agent && e.user.online === true);
    const started = nextEvent(watched, 'user.watching.start', (e) => e.user?.id === agent);
    const { client: b } = await connectUser(server, agent);
    let bConnected = true;
    try {
      const ev = await online;
      assert.ok(isValidDate(ev.user.last_active), `last_active is a date: ${ev.user.last_active}`);
      // The SDK applied the event to its user registry and to the channel's member.
      assert.equal(a.state.users[agent]?.online, true);
      assert.equal(watched.state.members[agent]?.user?.online, true);

      // The agent watches too: alice hears it, with the count of both.
      await b.channel('agent', channel.id).watch();
      const start = await started;
      assert.equal(start.watcher_count, 2);
      assert.equal(watched.state.watcher_count, 2);
      assert.ok(watched.state.watchers[agent], 'the SDK lists the agent among the watchers');

      const offline = nextEvent(a, 'user.presence.changed', (e) => e.user?.id === agent && e.user.online === false);
      const stopped = nextEvent(watched, 'user.watching.stop', (e) => e.user?.id === agent);
      await b.disconnectUser();
      bConnected = false;
      await offline;
      const stop = await stopped;
      assert.equal(stop.watcher_count, 1);
      assert.equal(a.state.users[agent]?.online, false);
      assert.equal(watched.state.members[agent]?.user?.online, false);
      assert.equal(watched.state.watchers[agent], undefined);
    } finally {
      if (bConnected) await b.disconnectUser();
    }
  });
});

test('unread counters move when the other client sends and go back to 0 when the reader marks read', async () => {
  const server = serverClient();
  const { channel, alice, agent } = await makeConversation(server);
  await withUser(server, alice, async (a) => {
    const watched = a.channel('agent', channel.id);
    await watched.watch({ presence: true });
    await watched.markRead();
    await withUser(server, agent, async (b) => {
      const theirs = b.channel('agent', channel.id);
      await theirs.watch();
      for (const [i, text] of ['one', 'two'].entries()) {
        const heard = nextEvent(watched, 'message.new', (e) => e.message?.text === text);
        await theirs.sendMessage({ text });
        const ev = await heard;
        assert.equal(ev.total_unread_count, i + 1, `total_unread_count after ${text}`);
        assert.equal(ev.unread_channels, 1);
        assert.equal(watched.countUnread(), i + 1, 'the SDK counts the unread messages of the channel');
      }
      const { users } = await server.queryUsers({ id: alice });
      assert.equal(users[0].total_unread_count, 2, 'the server agrees');

      const read = nextEvent(a, 'notification.mark_read', (e) => e.cid === channel.cid);
      await watched.markRead();
      const ev = await read;
      assert.equal(ev.total_unread_count, 0);
      assert.equal(ev.unread_channels, 0);
      assert.equal(watched.countUnread(), 0);
      const after = await server.queryUsers({ id: alice });
      assert.equal(after.users[0].total_unread_count, 0);
      assert.equal(after.users[0].online, true, 'alice is connected');
    });
  });
});
