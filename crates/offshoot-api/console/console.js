// The console's behaviour: sign-in from the URL fragment (kept in memory, removed from the
// address bar), finding and opening channels, the live fork tree, the channel view and the
// queue. Everything it shows comes from the public API with the signed-in token.

import { api, claims, parseCredentials, signIn, signOut, signedIn, token } from "./api.js";
import { h, renderDeadLetters, renderJobs, renderMessages, renderTree, statusOf } from "./view.js";

// While any node backfills the tree is read again this often; otherwise now and then, so a
// fork started elsewhere appears by itself.
const LIVE_POLL_MS = 700;
const IDLE_POLL_MS = 3000;
const QUEUE_POLL_MS = 5000;

const $ = (id) => document.getElementById(id);

const state = {
  cid: null,
  lineage: null,
  timer: null,
  queueTimer: null,
  sessionTimer: null,
  generation: 0,
  messagesAt: 0,
};

function show(signedInNow) {
  $("signin").hidden = signedInNow;
  $("app").hidden = !signedInNow;
  $("find").hidden = !signedInNow;
  $("session").hidden = !signedInNow;
}

function signInPrompt(message) {
  stopPolling();
  signOut();
  state.cid = null;
  state.lineage = null;
  for (const id of ["results", "tree", "messages", "jobs", "dead-letters"]) $(id).replaceChildren();
  $("signin-error").textContent = message || "";
  show(false);
}

// The header's "expires in": kept current; at expiry the token is dropped and the page asks again.
function describeSession() {
  if (!signedIn()) return;
  const c = claims(token());
  if (c.exp && c.exp * 1000 <= Date.now()) {
    signInPrompt("The token expired. Run offshoot console for a new link.");
    return;
  }
  const who = c.user_id ? `as ${c.user_id}` : "server-side";
  let expiry = "";
  if (c.exp) {
    const mins = Math.ceil((c.exp * 1000 - Date.now()) / 60000);
    expiry = ` · expires in ${mins} min`;
  }
  $("session-who").textContent = `Signed in ${who}${expiry}`;
}

function start(credentials) {
  signIn(credentials);
  describeSession();
  if (!signedIn()) return;
  clearInterval(state.sessionTimer);
  state.sessionTimer = setInterval(describeSession, 15000);
  show(true);
  $("find-q").focus();
  refreshQueue();
}

// Errors: an expired or refused token goes back to the sign-in prompt; others are shown where
// they happened.
function failed(where, e) {
  if (e.expired) {
    signInPrompt(`The server refused the token (${e.message}). Run offshoot console for a new link.`);
    return true;
  }
  $(where).textContent = `${e.message}${e.code > 0 ? ` (code ${e.code})` : ""}`;
  $(where).classList.add("error");
  return false;
}

function ok(where, text) {
  $(where).textContent = text;
  $(where).classList.remove("error");
}

// ---- finding channels

async function find(by, q) {
  const filter = by === "member" ? { members: { $in: [q] } } : { cid: q };
  ok("results-status", "Searching…");
  try {
    const data = await api.queryChannels(filter);
    const channels = data.channels || [];
    ok("results-status", channels.length ? `${channels.length} channel${channels.length === 1 ? "" : "s"}` : `No channel found for ${by === "member" ? "member" : "cid"} “${q}”.`);
    $("results").replaceChildren(
      ...channels.map(({ channel: c }) =>
        h(
          "li",
          {},
          h(
            "button",
            { type: "button", class: "result", "data-cid": c.cid, onclick: () => open(c.cid) },
            h("span", { class: "result-name", text: c.name || c.id }),
            h("span", { class: "mono small muted", text: c.cid }),
            h(
              "span",
              { class: "result-facts small muted" },
              `${c.member_count || 0} members`,
              c.fork ? h("span", { class: `badge badge-${c.fork.status}` }, `fork · ${c.fork.status}`) : null,
            ),
          ),
        ),
      ),
    );
    if (channels.length === 1) open(channels[0].channel.cid);
  } catch (e) {
    failed("results-status", e);
  }
}

// ---- the open channel: tree + messages, polled

function stopPolling() {
  clearInterval(state.sessionTimer);
  clearTimeout(state.timer);
  clearTimeout(state.queueTimer);
  state.timer = null;
  state.queueTimer = null;
}

function open(cid) {
  state.cid = cid;
  state.lineage = null;
  state.generation += 1;
  clearTimeout(state.timer);
  for (const b of document.querySelectorAll(".result")) b.setAttribute("aria-pressed", String(b.dataset.cid === cid));
  // Nothing of the channel shown before stays on screen under the new one's name.
  $("tree").replaceChildren();
  $("messages").replaceChildren();
  ok("tree-status", "Loading…");
  ok("channel-status", "Loading…");
  $("channel-title").textContent = cid;
  $("channel-meta").textContent = "";
  tick(state.generation, true);
}

function anyBackfilling(lineage) {
  return lineage.nodes.some((n) => statusOf(n) === "backfilling");
}

async function tick(generation, withMessages) {
  let live = false;
  try {
    const lineage = await api.lineage(state.cid);
    if (generation !== state.generation) return;
    const before = state.lineage;
    state.lineage = lineage;
    drawTree(lineage);
    live = anyBackfilling(lineage);
    const self = lineage.nodes.find((n) => n.cid === state.cid);
    // The messages again when the tree changed shape or the open channel itself is filling.
    const shapeChanged = !before || before.nodes.length !== lineage.nodes.length;
    const selfFilling = self && statusOf(self) === "backfilling";
    const due = Date.now() - state.messagesAt > 2000;
    if (withMessages || shapeChanged || (selfFilling && due) || (before && wasFilling(before, state.cid) && !selfFilling)) {
      await loadMessages(generation);
    }
  } catch (e) {
    if (generation !== state.generation) return;
    if (failed("tree-status", e)) return;
    if (withMessages) await loadMessages(generation);
  }
  if (generation !== state.generation || !signedIn()) return;
  $("tree-live").hidden = !live;
  clearTimeout(state.timer);
  state.timer = setTimeout(() => tick(generation, false), live ? LIVE_POLL_MS : IDLE_POLL_MS);
}

function wasFilling(lineage, cid) {
  const n = lineage.nodes.find((x) => x.cid === cid);
  return n && statusOf(n) === "backfilling";
}

function drawTree(lineage) {
  const tree = $("tree");
  const focused = document.activeElement && tree.contains(document.activeElement) ? document.activeElement.dataset.cid : null;
  renderTree(tree, lineage, state.cid, open);
  if (focused) {
    const again = tree.querySelector(`.node-open[data-cid="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
  const forks = lineage.nodes.length - 1;
  const filling = lineage.nodes.filter((n) => statusOf(n) === "backfilling").length;
  let text = forks === 0 ? "No forks: this channel has not been forked and is not a fork." : `${forks} fork${forks === 1 ? "" : "s"} under ${lineage.root_cid}`;
  if (filling) text += ` · ${filling} backfilling`;
  if (lineage.truncated_tree) text += " · tree cut at its node limit";
  ok("tree-status", text);
}

async function loadMessages(generation) {
  const cid = state.cid;
  state.messagesAt = Date.now();
  try {
    const data = await api.channel(cid, 30);
    if (generation !== state.generation) return;
    const ch = data.channel || {};
    $("channel-title").textContent = ch.name || cid;
    $("channel-meta").textContent = `${cid} · ${ch.member_count || 0} members${ch.created_by ? ` · created by ${ch.created_by.id}` : ""}`;
    const messages = data.messages || [];
    const forksAt = new Map();
    const nodes = state.lineage ? state.lineage.nodes : [];
    for (const n of nodes) {
      if (n.parent_cid === cid && n.fork && n.fork.source_message_id) {
        const list = forksAt.get(n.fork.source_message_id) || [];
        list.push(n);
        forksAt.set(n.fork.source_message_id, list);
      }
    }
    renderMessages($("messages"), messages, forksAt, open);
    const shown = new Set(messages.map((m) => m.id));
    const earlier = [...forksAt.entries()].filter(([id]) => !shown.has(id)).flatMap(([, n]) => n);
    const self = nodes.find((n) => n.cid === cid);
    ok("channel-status", messages.length ? `The ${messages.length} newest message${messages.length === 1 ? "" : "s"}, newest first.` : "No messages.");
    const status = $("channel-status");
    if (self && self.parent_cid) {
      status.append(" ", h("button", { type: "button", class: "link mono", onclick: () => open(self.parent_cid), "aria-label": `Open the source ${self.parent_cid}` }, `Forked from ${self.parent_cid}`));
    }
    if (earlier.length) {
      status.append(" Forked at older messages: ");
      earlier.forEach((n, i) => {
        if (i) status.append(", ");
        status.append(h("button", { type: "button", class: "link mono", onclick: () => open(n.cid), "aria-label": `Open fork ${n.cid}` }, n.cid));
      });
    }
  } catch (e) {
    if (generation !== state.generation) return;
    $("messages").replaceChildren();
    failed("channel-status", e);
  }
}

// ---- queue and webhooks

async function refreshQueue() {
  clearTimeout(state.queueTimer);
  if (!signedIn()) return;
  try {
    const [jobs, letters] = await Promise.all([api.jobs(), api.deadLetters()]);
    renderJobs($("jobs"), jobs.queues || []);
    renderDeadLetters($("dead-letters"), letters.dead_letters || [], replay);
    ok("queue-status", "");
  } catch (e) {
    $("jobs").replaceChildren();
    $("dead-letters").replaceChildren();
    // Refused (a user's token: the queue is server-side) is not going to change by asking again.
    if (failed("queue-status", e) || e.status === 403) return;
  }
  if (signedIn()) state.queueTimer = setTimeout(refreshQueue, QUEUE_POLL_MS);
}

async function replay(ids, button) {
  if (button) button.disabled = true;
  try {
    const r = await api.replay(ids);
    ok("queue-status", `Replayed ${r.replayed} deliver${r.replayed === 1 ? "y" : "ies"}.`);
  } catch (e) {
    failed("queue-status", e);
  }
  const keep = $("queue-status").textContent;
  await refreshQueue();
  if (!$("queue-status").textContent) ok("queue-status", keep);
}

// ---- wiring

function boot() {
  // The token arrives in the fragment, which browsers never send to the server; take it and
  // remove it from the address bar and the history entry at once.
  const fromFragment = parseCredentials(location.hash.slice(1));
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);

  $("signin-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const c = parseCredentials($("signin-link").value, $("signin-key").value);
    if (!c) {
      $("signin-error").textContent = "No token found: paste the whole link printed by offshoot console, or a token and its API key.";
      return;
    }
    $("signin-link").value = "";
    $("signin-error").textContent = "";
    start(c);
  });
  $("find").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = $("find-q").value.trim();
    if (q) find($("find-by").value, q);
  });
  $("find-q").addEventListener("input", () => {
    // A cid has a colon; anything else is most likely a user id.
    $("find-by").value = $("find-q").value.includes(":") ? "cid" : $("find-by").value;
  });
  $("sign-out").addEventListener("click", () => signInPrompt(""));
  $("queue-refresh").addEventListener("click", refreshQueue);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && state.cid && signedIn()) tick(state.generation, false);
  });

  if (fromFragment) start(fromFragment);
  else signInPrompt("");
}

boot();
