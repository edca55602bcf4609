// The API as the console reads it: Stream's plain-HTTP auth (`?api_key=KEY`, the JWT in
// `Authorization`, `stream-auth-type: jwt`), legacy paths, errors turned into ApiError with
// Stream's message and code. The credentials live in this module's memory only.

let credentials = null;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  get expired() {
    return this.status === 401;
  }
}

// Reads `api_key` and `token` from a fragment or a pasted link/token. Returns null when
// there is no token in it.
export function parseCredentials(text, fallbackKey = "") {
  const raw = (text || "").trim();
  if (!raw) return null;
  const hash = raw.includes("#") ? raw.slice(raw.indexOf("#") + 1) : raw.includes("token=") ? raw : "";
  if (hash) {
    const p = new URLSearchParams(hash);
    const token = p.get("token");
    const key = p.get("api_key") || fallbackKey;
    return token && key ? { key, token } : null;
  }
  // A bare token: three base64url parts.
  if (/^[\w-]+\.[\w-]+\.[\w-]*$/.test(raw) && fallbackKey) return { key: fallbackKey.trim(), token: raw };
  return null;
}

// The token's claims (not verified here: the server does that on every call).
export function claims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), "=")));
  } catch {
    return {};
  }
}

export function signIn(c) {
  credentials = { key: c.key, token: c.token };
}

export function signOut() {
  credentials = null;
}

export function signedIn() {
  return credentials !== null;
}

export function token() {
  return credentials ? credentials.token : null;
}

export async function call(method, path, body) {
  if (!credentials) throw new ApiError(401, 0, "not signed in");
  const sep = path.includes("?") ? "&" : "?";
  const init = {
    method,
    headers: { Authorization: credentials.token, "stream-auth-type": "jwt" },
    cache: "no-store",
    credentials: "omit",
    referrerPolicy: "no-referrer",
  };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`${path}${sep}api_key=${encodeURIComponent(credentials.key)}`, init);
  } catch (e) {
    throw new ApiError(0, -1, `the server does not answer (${e.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const message = data && data.message ? data.message : `HTTP ${response.status}`;
    throw new ApiError(response.status, data && data.code !== undefined ? data.code : -1, message);
  }
  return data;
}

const seg = (s) => encodeURIComponent(s);

export function splitCid(cid) {
  const i = cid.indexOf(":");
  return i > 0 ? [cid.slice(0, i), cid.slice(i + 1)] : ["messaging", cid];
}

export const api = {
  queryChannels(filter, limit = 30) {
    return call("POST", "/channels", {
      filter_conditions: filter,
      sort: [{ field: "last_message_at", direction: -1 }],
      limit,
      message_limit: 0,
      member_limit: 0,
      state: false,
      watch: false,
      presence: false,
    });
  },
  // Read-only (the `/query` variant would create a missing channel).
  channel(cid, messages = 30) {
    const [type, id] = splitCid(cid);
    return call("GET", `/channels/${seg(type)}/${seg(id)}?messages_limit=${messages}`);
  },
  lineage(cid) {
    const [type, id] = splitCid(cid);
    return call("GET", `/channels/${seg(type)}/${seg(id)}/lineage`);
  },
  jobs() {
    return call("GET", "/jobs");
  },
  deadLetters(limit = 25) {
    return call("GET", `/webhooks/dead_letters?limit=${limit}`);
  },
  replay(ids) {
    return call("POST", "/webhooks/dead_letters/replay", ids ? { ids } : { all: true });
  },
};
