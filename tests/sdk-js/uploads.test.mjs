// Uploads through the JS SDK as the UI kit makes them: getAppSettings (a user's token), then
// channel.sendFile / channel.sendImage, the returned link downloaded without headers, and the
// link attached to a message and read back re-signed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { serverClient, withUser, makeConversation } from './helpers.mjs';

const PNG = Buffer.from(
  '89504e470d0a1a0a0000000d4948445200000001000000010806000000' + '1f15c4890000000d49444154789c63f80f00010101001' + '8dd8db40000000049454e44ae426082',
  'hex',
);

test('upload: a member reads the upload settings, sends a file and an image, and the links serve the same bytes', async () => {
  const server = serverClient();
  const { channel, alice } = await makeConversation(server);
  await withUser(server, alice, async (client) => {
    const settings = await client.getAppSettings();
    assert.ok(settings.app.file_upload_config, 'a client reads file_upload_config');
    assert.ok(settings.app.image_upload_config, 'a client reads image_upload_config');
    assert.equal(settings.app.webhook_url, undefined, 'no server-only field reaches a client');

    const ch = client.channel(channel.type, channel.id);
    await ch.watch();
    const text = Buffer.from('notes for the agent\n'.repeat(1000));
    const file = await ch.sendFile(text, 'notes.txt', 'text/plain');
    assert.match(file.file, /\/uploads\/[0-9a-f]{32}\/notes\.txt\?exp=\d+&sig=[0-9a-f]{64}$/);
    const got = await fetch(file.file);
    assert.equal(got.status, 200);
    assert.deepEqual(Buffer.from(await got.arrayBuffer()), text, 'the link downloads the same bytes');

    const image = await ch.sendImage(PNG, 'pixel.png', 'image/png');
    assert.equal(typeof image.file, 'string');
    const img = await fetch(image.file);
    assert.equal(img.headers.get('content-type'), 'image/png');
    assert.deepEqual(Buffer.from(await img.arrayBuffer()), PNG);

    await assert.rejects(ch.sendImage(Buffer.from('<html></html>'), 'fake.png', 'image/png'), /not an image/);

    const sent = await ch.sendMessage({ text: 'see attached', attachments: [{ type: 'file', asset_url: file.file, title: 'notes.txt' }] });
    const read = await client.getMessage(sent.message.id);
    const again = await fetch(read.message.attachments[0].asset_url);
    assert.equal(again.status, 200, 'the stored link, re-signed on read, works');

    await ch.deleteFile(image.file);
    assert.equal((await fetch(image.file)).status, 404, 'a deleted image is gone');
  });
});
