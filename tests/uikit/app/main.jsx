// A minimal app of the official React UI kit (stream-chat-react) on the official JS SDK, as a
// customer would write it: Chat, Channel, Window, MessageList, MessageComposer (the kit's
// message input), Thread, and the kit's Search (its sources: channels, users, messages). Its settings come in
// the page's fragment: #base=…&key=…&user=…&token=…&cid=type:id (tests/uikit/run.py).
import React, { useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { StreamChat } from 'stream-chat';
import {
  Channel,
  ChannelHeader,
  Chat,
  MessageComposer,
  MessageList,
  Search,
  Thread,
  Window,
  useChatContext,
} from 'stream-chat-react';
import 'stream-chat-react/dist/css/index.css';

const settings = Object.fromEntries(new URLSearchParams(window.location.hash.slice(1)));

// The app's first channel, opened the way the kit's own ChannelList opens one.
const OpenFirst = ({ cid }) => {
  const { client, setActiveChannel } = useChatContext();
  useEffect(() => {
    const [type, id] = cid.split(':');
    const channel = client.channel(type, id);
    channel.watch().then(() => setActiveChannel(channel), (e) => (window.__appError = String(e)));
  }, [client, cid, setActiveChannel]);
  return null;
};

const App = () => {
  const [client, setClient] = useState();
  useEffect(() => {
    const c = new StreamChat(settings.key, { baseURL: settings.base });
    c.connectUser({ id: settings.user }, settings.token).then(
      () => setClient(c),
      (e) => (window.__appError = String(e)),
    );
    return () => void c.disconnectUser();
  }, []);
  if (!client) return <p id='connecting'>Connecting…</p>;
  return <Connected client={client} />;
};

// For the test: the search controller Chat made (its sources: channels, users, messages), to
// read what each source found.
const ExposeSearch = () => {
  const { searchController } = useChatContext();
  window.__searchController = searchController;
  return null;
};

// Chat's own search controller, as an app that renders <Search /> gets it.
const Connected = ({ client }) => {
  return (
    <Chat client={client} theme='str-chat__theme-light'>
      <ExposeSearch />
      <div className='app'>
        <aside className='app-search'>
          <Search placeholder='Search messages' />
        </aside>
        <OpenFirst cid={settings.cid} />
        <Channel>
          <Window>
            <ChannelHeader />
            <MessageList />
            <MessageComposer />
          </Window>
          <Thread />
        </Channel>
      </div>
    </Chat>
  );
};

createRoot(document.getElementById('root')).render(<App />);
