// Rendering: small DOM builders (text always through textContent, never HTML) and the views
// of the fork tree, the channel's messages and the queue.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const number = new Intl.NumberFormat("en");
export const fmt = (n) => number.format(n || 0);

export function when(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  if (Number.isNaN(d.getTime())) return String(ts);
  return d.toLocaleString("en-GB", { day: "2-digit", month: "short", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function ago(ts) {
  const d = new Date(ts).getTime();
  if (Number.isNaN(d)) return "";
  const s = Math.max(0, Math.round((Date.now() - d) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function statusOf(node) {
  return node.fork ? node.fork.status : "root";
}

// Percent of a fork's messages copied: 100 once completed, whatever was cut.
export function percent(fork) {
  if (!fork) return 100;
  if (fork.status === "completed") return 100;
  const total = fork.total_message_count || 0;
  if (!total) return 0;
  return Math.min(100, Math.floor((100 * (fork.copied_message_count || 0)) / total));
}

function badge(status) {
  const label = { root: "root", backfilling: "backfilling", completed: "completed", failed: "failed" }[status] || status;
  return h("span", { class: `badge badge-${status}` }, label);
}

function bar(node) {
  const f = node.fork;
  const p = percent(f);
  const fill = h("span", { class: "bar-fill" });
  fill.style.width = `${p}%`;
  const text = f.total_message_count ? `${fmt(f.copied_message_count)} of ${fmt(f.total_message_count)} messages copied` : `${fmt(f.copied_message_count)} messages copied`;
  return h(
    "div",
    {
      class: `bar bar-${f.status}`,
      role: "progressbar",
      "aria-valuemin": 0,
      "aria-valuemax": 100,
      "aria-valuenow": p,
      "aria-valuetext": `${p}%: ${text}`,
      "aria-label": `Backfill of ${node.cid}`,
      "data-cid": node.cid,
    },
    fill,
  );
}

function nodeCard(node, current, open) {
  const status = statusOf(node);
  const f = node.fork;
  const title = node.readable ? node.name || node.cid : node.cid;
  const cls = ["node", `node-${status}`, node.cid === current ? "node-current" : "", node.deleted ? "node-deleted" : "", node.readable ? "" : "node-hidden"];
  const head = h(
    "div",
    { class: "node-head" },
    node.readable
      ? h(
          "button",
          { type: "button", class: "node-open", "data-cid": node.cid, "aria-current": node.cid === current ? "true" : null, onclick: () => open(node.cid) },
          h("span", { class: "node-name", text: title }),
          title !== node.cid ? h("span", { class: "node-cid mono", text: node.cid }) : null,
        )
      : h("span", { class: "node-open disabled" }, h("span", { class: "node-cid mono", text: node.cid }), h("span", { class: "tag", text: "no access" })),
    badge(status),
  );
  const facts = [];
  if (f && node.readable) {
    const total = f.total_message_count === null || f.total_message_count === undefined ? "" : ` / ${fmt(f.total_message_count)}`;
    facts.push(h("span", { class: "count mono", title: "messages copied / to copy" }, `${fmt(f.copied_message_count)}${total}`));
  }
  if (f && f.truncated) facts.push(h("span", { class: "tag tag-warn", text: "truncated" }));
  if (node.deleted) facts.push(h("span", { class: "tag tag-bad", text: "deleted" }));
  if (node.readable && node.member_count !== undefined) facts.push(h("span", { class: "muted" }, `${fmt(node.member_count)} member${node.member_count === 1 ? "" : "s"}`));
  if (node.readable && (f ? f.created_at : node.created_at)) facts.push(h("span", { class: "muted", title: when(f ? f.created_at : node.created_at) }, ago(f ? f.created_at : node.created_at)));
  return h(
    "div",
    { class: cls.filter(Boolean).join(" "), "data-node": node.cid, "data-status": status },
    head,
    facts.length ? h("div", { class: "node-facts" }, facts) : null,
    f && f.fork_point_text !== undefined && f.fork_point_text !== null
      ? h("blockquote", { class: "fork-point" }, h("span", { class: "visually-hidden", text: "Forked at: " }), f.fork_point_text || "(no text)")
      : null,
    f && f.failed_reason ? h("p", { class: "error small" }, `failed: ${f.failed_reason}`) : null,
    f && node.readable ? bar(node) : null,
  );
}

// The tree of `lineage` (nodes with parent_cid), the node `current` highlighted.
export function renderTree(container, lineage, current, open) {
  const children = new Map();
  const byCid = new Map();
  for (const n of lineage.nodes) {
    byCid.set(n.cid, n);
    const key = n.parent_cid || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(n);
  }
  // Siblings in the endpoint's order (oldest fork first), so a new fork lands at the end.
  const roots = lineage.nodes.filter((n) => !n.parent_cid || !byCid.has(n.parent_cid));
  const level = (nodes, depth) =>
    h(
      "ul",
      { class: depth === 0 ? "tree-root" : "tree-level", role: depth === 0 ? "list" : null },
      nodes.map((n) => h("li", {}, nodeCard(n, current, open), children.has(n.cid) ? level(children.get(n.cid), depth + 1) : null)),
    );
  container.replaceChildren(level(roots, 0));
}

// The channel's newest messages, newest first; messages a fork was made at are marked with
// links to those forks.
export function renderMessages(list, messages, forksAt, open) {
  list.replaceChildren(
    ...[...messages].reverse().map((m) => {
      const user = m.user || {};
      const forks = forksAt.get(m.id) || [];
      return h(
        "li",
        { class: `message${m.type && m.type !== "regular" ? ` message-${m.type}` : ""}${forks.length ? " message-forked" : ""}`, "data-id": m.id },
        h(
          "div",
          { class: "message-head" },
          h("span", { class: "author", text: user.name || user.id || "(unknown)" }),
          user.name && user.id && user.name !== user.id ? h("span", { class: "muted mono small", text: user.id }) : null,
          h("time", { datetime: m.created_at, class: "muted small", text: when(m.created_at) }),
        ),
        h("p", { class: "message-text", text: m.type === "deleted" ? "(deleted)" : m.text || "" }),
        forks.length
          ? h(
              "div",
              { class: "fork-marks" },
              h("span", { class: "fork-mark", text: forks.length === 1 ? "Forked here:" : `Forked here ${forks.length} times:` }),
              forks.map((n) => h("button", { type: "button", class: "link mono", onclick: () => open(n.cid), "aria-label": `Open fork ${n.cid}` }, n.cid)),
            )
          : null,
      );
    }),
  );
}

export function renderJobs(container, queues) {
  if (!queues.length) {
    container.replaceChildren(h("p", { class: "muted", text: "No queues yet." }));
    return;
  }
  const cols = ["queued", "running", "retrying", "failed", "dead_lettered"];
  const label = { queued: "Wait", running: "Run", retrying: "Retry", failed: "Fail", dead_lettered: "Dead" };
  const title = { queued: "queued", running: "running", retrying: "retrying", failed: "failed", dead_lettered: "dead-lettered" };
  const head = h(
    "thead",
    {},
    h("tr", {}, h("th", { scope: "col", text: "Queue" }), cols.map((c) => h("th", { scope: "col", class: "num", title: title[c], "aria-label": title[c], text: label[c] }))),
  );
  const rows = queues.map((q) =>
    h(
      "tr",
      {},
      h("th", { scope: "row", class: "mono", title: q.queue, text: q.queue.replace(/^offshoot\./, "") }),
      cols.map((c) => h("td", { class: `num${q[c] ? ` has-${c}` : ""}`, "data-state": c, text: fmt(q[c]) })),
    ),
  );
  const table = h("table", { class: "jobs" }, h("caption", { class: "visually-hidden", text: "Jobs per queue and state" }), head, h("tbody", {}, rows));
  container.replaceChildren(h("div", { class: "jobs-wrap" }, table));
}

export function renderDeadLetters(container, letters, replay) {
  if (!letters.length) {
    container.replaceChildren(h("p", { class: "muted", text: "No dead-lettered deliveries." }));
    return;
  }
  container.replaceChildren(
    h(
      "ul",
      { class: "letters" },
      letters.map((l) =>
        h(
          "li",
          { class: "letter", "data-id": l.id },
          h("div", { class: "letter-head" }, h("span", { class: "mono", text: l.event_type }), h("span", { class: "muted small", text: `${l.attempts} attempt${l.attempts === 1 ? "" : "s"} · ${ago(l.created_at)}` })),
          h("div", { class: "mono small ellipsis", title: l.url, text: l.url }),
          l.last_error ? h("div", { class: "error small ellipsis", title: l.last_error, text: l.last_error }) : null,
          h("button", { type: "button", class: "small", onclick: (e) => replay([l.id], e.currentTarget), "aria-label": `Replay ${l.event_type} to ${l.url}` }, "Replay"),
        ),
      ),
    ),
    ...(letters.length > 1 ? [h("button", { type: "button", class: "small ghost", onclick: (e) => replay(null, e.currentTarget) }, "Replay all")] : []),
  );
}
