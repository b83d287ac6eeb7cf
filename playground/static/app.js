// The playground page: channel, thread pane, composers, modals, live updates over SSE.
import {
  h, renderBlocks, syncInert, collectValues, snapshotInputs, restoreInputs, showInputErrors, missingRequired,
} from "./blocks.js";
import { mrkdwn, plainText, setDirectory, setMe, timeOf, dateOf, compareTs, userName, channelName } from "./mrkdwn.js";

const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;
const PAGE = 50;
const STORE_KEY = "playground.as";

const S = {
  state: null,
  as: null,
  es: null,
  gen: 0, // bumped on a user switch: answers to older requests are dropped
  thread: null, // ts of the open thread's root
  channel: null, // the channel shown (its id); the main one takes messages
  loads: 0, // history/thread loads in flight; live events wait for them
  queue: [],
  dismissed: new Set(),
  modals: new Map(), // view_id → modal record, in opening order
  home: false, // the app's Home tab is shown instead of the channel
  homeEvents: 0, // "home" events received: a /ui/home answer older than one is stale
};

// ----------------------------------------------------------------------------- HTTP
// The session token the server wrote into this page: sent back on every UI call (and as
// ?token= on the event stream), so that no other web page can drive the playground.
const TOKEN = document.querySelector('meta[name="playground-token"]')?.content ?? "";
let refused = false; // the server refused our token (it restarted): the page must be reloaded

async function api(path, body) {
  const headers = { "X-Playground-Token": TOKEN };
  const opts = body === undefined
    ? { cache: "no-store", headers }
    : { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const res = await fetch(path, opts);
  let data = null;
  try {
    data = await res.json();
  } catch {
    data = null;
  }
  if (res.status === 403) {
    const why = (data && data.error) || "forbidden";
    if (!refused) notice("error", `The playground refused this page (${why}).`);
    refused = true;
    throw new Error(why);
  }
  if (!res.ok && !(data && data.error)) throw new Error(`HTTP ${res.status}`);
  return data ?? {};
}

async function postAction(container, action) {
  let r;
  try {
    r = await api("/ui/action", { as: S.as, container, action });
  } catch (err) {
    r = { ok: false, error: err.message };
  }
  if (!r.ok) notice("error", "Action failed: " + (r.error || "unknown error"));
}

// ----------------------------------------------------------------------------- notices
function notice(level, text) {
  const box = $("notices");
  const n = h("div", { class: `notice notice-${level === "error" ? "error" : "info"}`, role: level === "error" ? "alert" : "status" },
    h("span", { class: "notice-text" }, String(text ?? "")),
    h("button", { type: "button", class: "notice-dismiss", "aria-label": "Dismiss", title: "Dismiss", onclick: () => n.remove(), html: X_SVG }));
  box.append(n);
  while (box.children.length > 5) box.firstElementChild.remove();
}

function setConn(up) {
  $("conn").hidden = up;
}

// ----------------------------------------------------------------------------- messages
const X_SVG = '<svg viewBox="0 0 20 20" width="14" height="14" aria-hidden="true"><path d="M5 5l10 10M15 5 5 15" stroke="currentColor" stroke-width="1.8" stroke-linecap="round"/></svg>';
const BOT_SVG = '<svg viewBox="0 0 36 36" width="36" height="36"><rect width="36" height="36" rx="8" fill="#611f69"/><rect x="9" y="12" width="18" height="14" rx="4" fill="#fff"/><circle cx="14.5" cy="19" r="2" fill="#611f69"/><circle cx="21.5" cy="19" r="2" fill="#611f69"/><rect x="17" y="7" width="2" height="5" fill="#fff"/><circle cx="18" cy="7" r="2" fill="#ecb22e"/></svg>';
const EYE_SVG = '<svg viewBox="0 0 20 20" width="14" height="14" aria-hidden="true"><path d="M10 4.5C5.5 4.5 2.3 8 1.5 10c.8 2 4 5.5 8.5 5.5s7.7-3.5 8.5-5.5c-.8-2-4-5.5-8.5-5.5Zm0 8.8a3.3 3.3 0 1 1 0-6.6 3.3 3.3 0 0 1 0 6.6Z" fill="currentColor"/></svg>';
const FILE_SVG = '<svg viewBox="0 0 24 24" width="28" height="28"><path d="M6 2h8l5 5v15H6z" fill="#e8e8e8" stroke="#616061" stroke-width="1.2"/><path d="M14 2v5h5" fill="none" stroke="#616061" stroke-width="1.2"/><path d="M9 12h7M9 15h7M9 18h5" stroke="#1264a3" stroke-width="1.4" stroke-linecap="round"/></svg>';
const COLORS = ["#2b6cb0", "#2f855a", "#b7791f", "#c05621", "#6b46c1", "#b83280", "#2c7a7b", "#9b2c2c"];

function colorFor(id) {
  let x = 0;
  for (const c of String(id)) x = (x * 31 + c.charCodeAt(0)) >>> 0;
  return COLORS[x % COLORS.length];
}

function initials(name) {
  const parts = String(name).trim().split(/[\s._-]+/).filter(Boolean);
  return ((parts[0] || "?")[0] + (parts[1] ? parts[1][0] : "")).toUpperCase();
}

function avatar(m, small = false) {
  const cls = "avatar" + (small ? " avatar-small" : "");
  if (m.bot) return h("div", { class: cls + " avatar-bot", "aria-hidden": "true", html: BOT_SVG });
  const el = h("div", { class: cls, "aria-hidden": "true" }, initials(m.user_name || userName(m.user) || "?"));
  el.style.background = colorFor(m.user);
  return el;
}

const isTop = (m) => !m.thread_ts || m.thread_ts === m.ts;
const keyOf = (m) => `${m.channel}/${m.ts}`;

function replyFaces(ids) {
  const wrap = h("span", { class: "reply-faces" });
  for (const id of (ids || []).slice(0, 4)) {
    const bot = S.state && S.state.bot && id === S.state.bot.id;
    wrap.append(avatar({ user: id, user_name: userName(id), bot }, true));
  }
  return wrap;
}

// A shared file (files.completeUploadExternal), as Slack shows one: its title, name and size,
// linking to the content.
function fileCard(f) {
  const size = Number(f.size) || 0;
  const kb = size < 1024 ? `${size} B` : size < 1048576 ? `${(size / 1024).toFixed(1)} kB` : `${(size / 1048576).toFixed(1)} MB`;
  return h("a", { class: "file-card", href: String(f.url || "#"), target: "_blank", rel: "noopener" },
    h("span", { class: "file-icon", "aria-hidden": "true", html: FILE_SVG }),
    h("span", { class: "file-meta" },
      h("span", { class: "file-title" }, String(f.title || f.name || "file")),
      h("span", { class: "file-sub" }, `${f.name || ""} · ${kb}`)));
}

function renderMessage(m, where) {
  const inChannel = where === "channel";
  const el = h("div", {
    class: "msg" + (m.bot ? " bot" : "") + (m.ephemeral ? " ephemeral" : "") +
      (inChannel && S.thread === m.ts ? " thread-open" : ""),
    "data-ts": m.ts, "data-channel": m.channel, "data-updated": String(m.updated || 0),
  });
  const content = h("div", { class: "msg-content" });
  if (m.ephemeral) {
    content.append(h("div", { class: "ephemeral-top" },
      h("span", { class: "ephemeral-eye", html: EYE_SVG }),
      h("span", { class: "ephemeral-label" }, "Only visible to you")));
  }
  content.append(h("div", { class: "msg-header" },
    h("span", { class: "msg-author" }, m.user_name || userName(m.user) || "unknown"),
    m.bot ? h("span", { class: "app-badge" }, "APP") : null,
    h("time", { class: "msg-time", title: dateOf(m.ts) }, timeOf(m.ts))));
  const body = h("div", { class: "msg-body" });
  if (Array.isArray(m.blocks) && m.blocks.length) {
    const container = { type: "message", channel: m.channel, ts: m.ts, is_ephemeral: !!m.ephemeral };
    if (m.thread_ts) container.thread_ts = m.thread_ts;
    body.append(renderBlocks(m.blocks, { surface: "message", postAction: (a) => postAction(container, a) }));
  } else if (m.text || !(m.files || []).length) {
    body.classList.add("rich");
    body.innerHTML = mrkdwn(m.text || "");
  }
  content.append(body);
  for (const f of m.files || []) content.append(fileCard(f));
  const n = Number(m.reply_count) || 0;
  if (inChannel && n > 0) {
    content.append(h("div", { class: "replies" },
      replyFaces(m.reply_users),
      h("button", { type: "button", class: "replies-link", onclick: () => openThread(m.ts) }, n === 1 ? "1 reply" : `${n} replies`),
      m.latest_reply ? h("span", { class: "replies-last" }, "Last reply " + timeOf(m.latest_reply)) : null));
  }
  if (m.ephemeral) {
    content.append(h("button", { type: "button", class: "ephemeral-dismiss", onclick: () => dismiss(m) }, "Dismiss message"));
  }
  el.append(h("div", { class: "msg-gutter" }, avatar(m)), content);
  if (inChannel && !m.ephemeral) {
    el.append(h("div", { class: "msg-hover" },
      h("button", { type: "button", class: "icon-btn", "aria-label": "Reply in thread", title: "Reply in thread", onclick: () => openThread(m.ts),
        html: '<svg viewBox="0 0 20 20" width="16" height="16" aria-hidden="true"><path d="M3 4.5h14v9H8l-4 3v-3H3z" fill="none" stroke="currentColor" stroke-width="1.6" stroke-linejoin="round"/></svg>' })));
  }
  return el;
}

/** Messages kept in ts order in one container, each upserted in place by key. */
class MessageList {
  constructor(box, where) {
    this.box = box;
    this.where = where;
    this.items = new Map();
    this.order = [];
  }

  upsert(m) {
    const key = keyOf(m);
    if (S.dismissed.has(key)) return;
    const old = this.items.get(key);
    if (old && (old.msg.updated || 0) > (m.updated || 0)) return; // a stale copy
    const el = renderMessage(m, this.where);
    if (old) {
      old.el.replaceWith(el);
      old.el = el;
      old.msg = m;
      return;
    }
    let lo = 0;
    let hi = this.order.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (compareTs(this.order[mid].ts, m.ts) <= 0) lo = mid + 1;
      else hi = mid;
    }
    const entry = { key, ts: m.ts, msg: m, el };
    this.box.insertBefore(el, this.order[lo] ? this.order[lo].el : null);
    this.order.splice(lo, 0, entry);
    this.items.set(key, entry);
  }

  get(channel, ts) {
    return this.items.get(`${channel}/${ts}`);
  }

  remove(channel, ts) {
    const entry = this.get(channel, ts);
    if (!entry) return;
    entry.el.remove();
    this.items.delete(entry.key);
    this.order.splice(this.order.indexOf(entry), 1);
  }

  clear() {
    this.box.replaceChildren();
    this.items.clear();
    this.order = [];
  }
}

let channel;
let replies;

function dismiss(m) {
  S.dismissed.add(keyOf(m));
  channel.remove(m.channel, m.ts);
  replies.remove(m.channel, m.ts);
}

function upsertMessage(m) {
  if (!m || !m.ts || m.channel !== S.channel) return;
  if (isTop(m)) {
    channel.upsert(m);
    if (S.thread === m.ts) renderThreadRoot(m);
  } else if (S.thread && m.thread_ts === S.thread) {
    replies.upsert(m);
  }
}

function removeMessage({ channel: ch, ts }) {
  channel.remove(ch, ts);
  replies.remove(ch, ts);
  if (S.thread === ts) {
    $("thread-root").replaceChildren(h("div", { class: "msg-deleted" }, "This message was deleted."));
  }
}

// ----------------------------------------------------------------------------- scrolling
// A pane sticks to its bottom while the person is there: new content keeps it there.
function stickyScroller(scroller, content) {
  const st = { stick: true };
  scroller.addEventListener("scroll", () => {
    st.stick = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 60;
  });
  // Content growing and the pane shrinking (a taller composer) both keep the bottom in view.
  const ro = new ResizeObserver(() => {
    if (st.stick) scroller.scrollTop = scroller.scrollHeight;
  });
  ro.observe(content);
  ro.observe(scroller);
  st.toBottom = () => {
    st.stick = true;
    scroller.scrollTop = scroller.scrollHeight;
  };
  return st;
}

let chScroll;
let thScroll;

// ----------------------------------------------------------------------------- loading
// While a load is in flight, live message events wait and are applied after it, so a
// slightly older snapshot never overwrites a newer event.
async function withLoad(fn) {
  S.loads++;
  try {
    await fn();
  } finally {
    S.loads--;
    if (S.loads === 0) for (const [type, data] of S.queue.splice(0)) apply(type, data);
  }
}

function setHasMore(more) {
  $("load-older").hidden = !more;
  const intro = $("channel-intro");
  intro.hidden = more;
  if (!more && S.state) {
    const name = channelName(S.channel);
    intro.replaceChildren(
      h("div", { class: "intro-title" }, "#" + name),
      h("div", {}, "This is the very beginning of the ", h("b", {}, "#" + name), " channel."));
  }
}

function loadHistory() {
  const gen = S.gen;
  return withLoad(async () => {
    const r = await api(`/ui/history?as=${enc(S.as)}&channel=${enc(S.channel)}&limit=${PAGE}`);
    if (gen !== S.gen) return;
    channel.clear();
    for (const m of r.messages || []) channel.upsert(m);
    setHasMore(!!r.has_more);
    chScroll.toBottom();
  }).catch((err) => notice("error", "Could not load the channel history: " + err.message));
}

async function loadOlder() {
  const oldest = channel.order[0];
  const btn = $("load-older");
  if (!oldest || btn.disabled) return;
  btn.disabled = true;
  btn.textContent = "Loading…";
  const gen = S.gen;
  try {
    await withLoad(async () => {
      const r = await api(`/ui/history?as=${enc(S.as)}&channel=${enc(S.channel)}&limit=${PAGE}&before=${enc(oldest.ts)}`);
      if (gen !== S.gen) return;
      const sc = $("channel-scroll");
      const height = sc.scrollHeight;
      const top = sc.scrollTop;
      sc.style.overflowAnchor = "none"; // we keep the view in place ourselves
      for (const m of r.messages || []) channel.upsert(m);
      setHasMore(!!r.has_more);
      sc.scrollTop = top + (sc.scrollHeight - height);
      sc.style.overflowAnchor = "";
    });
  } catch (err) {
    notice("error", "Could not load older messages: " + err.message);
  } finally {
    btn.disabled = false;
    btn.textContent = "Load older messages";
  }
}

function reloadAll() {
  loadHistory();
  if (S.thread) loadThread();
  if (S.home) loadHome(); // a view published before the stream opened is not sent on it
}

// ----------------------------------------------------------------------------- thread pane
function renderThreadRoot(m) {
  $("thread-root").replaceChildren(renderMessage(m, "thread"));
  const n = Number(m.reply_count) || 0;
  const count = $("thread-count");
  count.hidden = n === 0;
  count.replaceChildren(h("span", {}, n === 1 ? "1 reply" : `${n} replies`));
}

function loadThread() {
  const gen = S.gen;
  const ts = S.thread;
  return withLoad(async () => {
    const r = await api(`/ui/thread?as=${enc(S.as)}&channel=${enc(S.channel)}&ts=${enc(ts)}`);
    if (gen !== S.gen || ts !== S.thread) return;
    if (!r.root) {
      notice("error", "Could not open the thread: " + (r.error || "not found"));
      closeThread();
      return;
    }
    renderThreadRoot(r.root);
    replies.clear();
    for (const m of r.replies || []) replies.upsert(m);
    thScroll.toBottom();
  }).catch((err) => notice("error", "Could not load the thread: " + err.message));
}

function markThreadRoot(ts, on) {
  const entry = channel.order.find((e) => e.ts === ts);
  if (entry) entry.el.classList.toggle("thread-open", on);
}

function openThread(ts) {
  if (S.thread && S.thread !== ts) markThreadRoot(S.thread, false);
  S.thread = ts;
  markThreadRoot(ts, true);
  $("thread").hidden = false;
  document.body.classList.add("with-thread");
  replies.clear();
  const entry = channel.order.find((e) => e.ts === ts);
  if (entry) renderThreadRoot(entry.msg);
  else $("thread-root").replaceChildren();
  $("thread-composer-error").hidden = true;
  setUrl();
  loadThread();
  $("thread-composer").focus();
}

function closeThread() {
  if (S.thread) markThreadRoot(S.thread, false);
  S.thread = null;
  $("thread").hidden = true;
  document.body.classList.remove("with-thread");
  replies.clear();
  $("thread-root").replaceChildren();
  setUrl();
}

// ----------------------------------------------------------------------------- modals
function showView(viewId, view) {
  let m = S.modals.get(viewId);
  if (!m) {
    m = { id: viewId };
    m.title = h("h2", { class: "modal-title", id: `modal-title-${S.modals.size}` });
    m.body = h("div", { class: "modal-body" });
    m.error = h("div", { class: "modal-error", role: "alert", hidden: true });
    m.close = h("button", { type: "button", class: "bk-btn modal-close", onclick: () => closeView(m) });
    m.submit = h("button", { type: "button", class: "bk-btn bk-btn-primary modal-submit", onclick: () => submitView(m) });
    m.el = h("div", { class: "modal", role: "dialog", "aria-modal": "true", "aria-labelledby": m.title.id, "data-view-id": viewId },
      h("div", { class: "modal-header" }, m.title,
        h("button", { type: "button", class: "icon-btn modal-x", "aria-label": "Close dialog", title: "Close", onclick: () => closeView(m),
          html: X_SVG })),
      m.body, m.error, h("div", { class: "modal-footer" }, m.close, m.submit));
    m.backdrop = h("div", { class: "modal-backdrop" }, m.el);
    S.modals.set(viewId, m);
    document.body.append(m.backdrop);
    syncInert();
    fillView(m, view);
    const first = m.body.querySelector("textarea, input, select");
    (first || m.close).focus();
    return;
  }
  fillView(m, view);
}

function fillView(m, view) {
  const typed = snapshotInputs(m.body);
  m.view = view;
  m.title.innerHTML = plainText(view.title || "");
  m.body.replaceChildren(renderBlocks(view.blocks || [], {
    surface: "modal", postAction: (a) => postAction({ type: "view", view_id: m.id }, a),
  }));
  restoreInputs(m.body, typed);
  m.close.innerHTML = plainText(view.close || "Cancel");
  m.submit.hidden = !view.submit;
  if (view.submit) m.submit.innerHTML = plainText(view.submit);
  m.error.hidden = true;
}

function removeView(viewId) {
  const m = S.modals.get(viewId);
  if (!m) return;
  m.backdrop.remove();
  S.modals.delete(viewId);
  syncInert();
}

function closeView(m) {
  removeView(m.id);
  api("/ui/view/close", { as: S.as, view_id: m.id }).catch((err) => notice("error", "Closing the modal failed: " + err.message));
}

async function submitView(m) {
  const missing = missingRequired(m.body);
  if (showInputErrors(m.body, missing)) return;
  m.error.hidden = true;
  m.submit.disabled = true;
  let r;
  try {
    r = await api("/ui/view/submit", { as: S.as, view_id: m.id, values: collectValues(m.body) });
  } catch (err) {
    r = { ok: false, error: err.message };
  } finally {
    m.submit.disabled = false;
  }
  if (r.errors && Object.keys(r.errors).length) {
    if (!showInputErrors(m.body, r.errors)) showModalError(m, Object.values(r.errors).join(" · "));
  } else if (r.view) {
    const id = r.view_id || m.id;
    if (id !== m.id) removeView(m.id);
    showView(id, r.view);
  } else if (r.closed) {
    removeView(m.id);
  } else if (r.ok === false) {
    showModalError(m, r.error || "The submission failed.");
  }
}

function showModalError(m, text) {
  m.error.textContent = text;
  m.error.hidden = false;
}

function closeAllViewsLocally() {
  for (const id of [...S.modals.keys()]) removeView(id);
}

// ----------------------------------------------------------------------------- App Home
// The app's Home tab for the acting person: opening it tells the app (app_home_opened), and
// each views.publish for them arrives as a "home" event.
function renderHome(view) {
  const box = $("home-blocks");
  if (!view) {
    box.replaceChildren(h("div", { class: "home-empty" }, "The app has not published a Home view for you yet."));
    return;
  }
  box.replaceChildren(renderBlocks(view.blocks || [], {
    surface: "home",
    postAction: (a) => postAction({ type: "view", view_id: view.id }, a),
    openUrl: openPermalink,
  }));
}

// A link to a message of this workspace (chat.getPermalink) opens its thread here.
function openPermalink(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    return;
  }
  const m = u.pathname.match(/\/archives\/([^/]+)\/p(\d+)(\d{6})$/);
  if (!m) {
    window.open(url, "_blank", "noopener,noreferrer");
    return;
  }
  showChannel(m[1]);
  openThread(u.searchParams.get("thread_ts") || `${m[2]}.${m[3]}`);
}

function showHome() {
  S.home = true;
  $("channel").hidden = true;
  $("home").hidden = false;
  $("side-home").classList.add("active");
  markChannel(null);
  loadHome(true);
}

// The person's Home view as published so far; ``opened``: they open the tab (the app is told).
async function loadHome(opened = false) {
  const gen = S.gen;
  const seen = S.homeEvents;
  let r;
  try {
    r = opened ? await api("/ui/home", { as: S.as }) : await api(`/ui/home?as=${enc(S.as)}`);
  } catch (err) {
    notice("error", "Opening Home failed: " + err.message);
    return;
  }
  // The app may publish (a "home" event) before this answer arrives: the event is newer.
  if (gen === S.gen && S.home && seen === S.homeEvents) renderHome(r.view);
}

// Show a channel (``id``; the one shown when omitted); another channel is loaded, its open
// thread closed.
function showChannel(id = S.channel) {
  S.home = false;
  $("home").hidden = true;
  $("channel").hidden = false;
  $("side-home").classList.remove("active");
  if (id !== S.channel && S.state.channels.some((c) => c.id === id)) {
    closeThread();
    S.channel = id;
    channel.clear();
    nameChannel();
    setUrl();
    loadHistory();
  }
  markChannel(S.channel);
}

function markChannel(id) {
  for (const a of document.querySelectorAll("#side-channels .side-channel")) {
    const on = a.dataset.channel === id;
    a.classList.toggle("active", on);
    if (on) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

// The shown channel's name in the headers; people type in the main channel only.
function nameChannel() {
  const st = S.state;
  const name = channelName(S.channel);
  const main = S.channel === st.channel.id;
  document.title = `#${name} · ${st.team.name} (playground)`;
  $("channel-name").textContent = name;
  $("thread-channel").textContent = name;
  $("composer").placeholder = main ? `Message #${name}` : `Only #${st.channel.name} takes messages in the playground`;
  $("composer").disabled = !main;
  $("thread-composer").disabled = !main;
  $("thread-composer").placeholder = main ? "Reply…" : "Replies go to threads in #" + st.channel.name;
}

// ----------------------------------------------------------------------------- live events
function apply(type, data) {
  if (type === "message") upsertMessage(data);
  else if (type === "delete") removeMessage(data);
}

function onEvent(type, raw) {
  let data;
  try {
    data = JSON.parse(raw);
  } catch {
    return;
  }
  if (type === "message" || type === "delete") {
    if (S.loads > 0) S.queue.push([type, data]);
    else apply(type, data);
  } else if (type === "view") {
    if (data && data.view_id && data.view) showView(data.view_id, data.view);
  } else if (type === "view_closed") {
    if (data) removeView(data.view_id);
  } else if (type === "notice") {
    if (data) notice(data.level, data.text);
  } else if (type === "home") {
    if (data && data.user === S.as) {
      S.homeEvents++;
      if (S.home) renderHome(data.view);
    }
  }
}

function connect() {
  if (S.es) S.es.close();
  const es = new EventSource(`/ui/stream?as=${enc(S.as)}&token=${enc(TOKEN)}`);
  S.es = es;
  let opened = false;
  for (const type of ["message", "delete", "view", "view_closed", "notice", "home"]) {
    es.addEventListener(type, (ev) => S.es === es && onEvent(type, ev.data));
  }
  // Every (re)connection reloads: events sent while we were away are lost.
  es.onopen = () => {
    if (S.es !== es) return;
    opened = true;
    setConn(true);
    reloadAll();
  };
  es.onerror = () => {
    if (S.es !== es) return;
    setConn(false);
    if (es.readyState === EventSource.CLOSED && !refused) setTimeout(() => S.es === es && connect(), 2000);
  };
  // Show the history even if the stream is slow to open.
  setTimeout(() => {
    if (S.es === es && !opened) {
      setConn(false);
      reloadAll();
    }
  }, 2500);
}

// ----------------------------------------------------------------------------- composers
function autosize(ta) {
  ta.style.height = "auto";
  ta.style.height = Math.min(ta.scrollHeight, 200) + "px";
}

function setupComposer(ta, hint, error, sendBtn, threadTs) {
  const updateHint = () => {
    const v = ta.value;
    const cmd = (S.state && S.state.command) || "/agent";
    const word = v.split(/\s/, 1)[0];
    const show = v.startsWith("/") && !v.includes("\n") && (cmd.startsWith(word) || word === cmd);
    hint.hidden = !show;
    if (!show) return;
    hint.replaceChildren(
      h("div", { class: "slash-title" }, "Slash commands"),
      h("button", { type: "button", class: "slash-item", onclick: () => { ta.value = cmd + " "; ta.focus(); updateHint(); } },
        h("span", { class: "slash-cmd" }, cmd),
        h("span", { class: "slash-args" }, "[task] · status · cancel [run id] · retry [run id] · help")),
      h("div", { class: "slash-desc" }, `Sent to ${(S.state && S.state.bot && S.state.bot.name) || "the bot"} as a slash command.`));
  };
  const submit = async () => {
    const text = ta.value;
    if (!text.trim()) return;
    ta.value = "";
    autosize(ta);
    hint.hidden = true;
    error.hidden = true;
    const t = threadTs();
    const body = { as: S.as, text };
    if (t) body.thread_ts = t;
    let r;
    try {
      r = await api("/ui/send", body);
    } catch (err) {
      r = { ok: false, error: err.message };
    }
    if (!r.ok) {
      if (!ta.value) ta.value = text;
      autosize(ta);
      error.textContent = r.error || "The message could not be sent.";
      error.hidden = false;
    } else {
      (t ? thScroll : chScroll).toBottom();
    }
  };
  ta.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      submit();
    } else if (ev.key === "Escape" && !hint.hidden) {
      hint.hidden = true;
    }
  });
  ta.addEventListener("input", () => {
    autosize(ta);
    updateHint();
    error.hidden = true;
  });
  sendBtn.addEventListener("click", submit);
  return updateHint;
}

// ----------------------------------------------------------------------------- page setup
function setUrl() {
  const u = new URL(window.location.href);
  u.searchParams.set("as", S.as);
  if (S.state && S.channel !== S.state.channel.id) u.searchParams.set("channel", S.channel);
  else u.searchParams.delete("channel");
  if (S.thread) u.searchParams.set("thread", S.thread);
  else u.searchParams.delete("thread");
  window.history.replaceState(null, "", u);
}

function switchUser(id) {
  S.as = id;
  S.gen++;
  S.queue = [];
  S.dismissed.clear();
  try {
    localStorage.setItem(STORE_KEY, id);
  } catch {
    /* storage may be off */
  }
  setMe(id);
  setUrl();
  closeAllViewsLocally();
  $("composer-error").hidden = true;
  $("thread-composer-error").hidden = true;
  channel.clear();
  replies.clear();
  connect();
  if (S.home) showHome();
}

function fillSidebar(st, refillComposerHint) {
  $("workspace-name").textContent = st.team.name;
  $("side-channel-name").textContent = st.channel.name;
  $("side-channel").dataset.channel = st.channel.id;
  for (const c of st.channels || []) {
    if (c.id === st.channel.id) continue;
    $("side-channels").append(h("a", {
      class: "side-channel", href: "#", id: `side-channel-${c.id}`, "data-channel": c.id,
      onclick: (ev) => { ev.preventDefault(); showChannel(c.id); chScroll.toBottom(); },
    }, h("span", { class: "hash" }, "#"), h("span", {}, c.name)));
  }
  nameChannel();
  $("channel-sub").textContent = `${st.users.length} people and the ${st.bot.name} app`;
  const sel = $("as");
  sel.replaceChildren(...st.users.map((u) => h("option", { value: u.id }, u.title ? `${u.name} — ${u.title}` : u.name)));
  const banner = $("model-banner");
  banner.classList.toggle("scripted", !!(st.model && st.model.scripted));
  banner.replaceChildren(
    h("div", { class: "model-kicker" }, "Model"),
    h("div", { class: "model-label" }, (st.model && st.model.label) || "unknown"),
    st.model && st.model.scripted && st.model.hint ? h("div", { class: "model-hint" }, st.model.hint) : null);
  const ex = $("examples");
  ex.replaceChildren();
  $("examples-section").hidden = !(st.examples || []).length;
  for (const text of st.examples || []) {
    ex.append(h("button", {
      type: "button", class: "example-chip", title: "Put in the message box",
      onclick: () => {
        const ta = $("composer");
        ta.value = text;
        autosize(ta);
        refillComposerHint();
        ta.focus();
      },
    }, text));
  }
}

function pickUser(st) {
  const ids = new Set(st.users.map((u) => u.id));
  const fromUrl = new URL(window.location.href).searchParams.get("as");
  let stored = null;
  try {
    stored = localStorage.getItem(STORE_KEY);
  } catch {
    stored = null;
  }
  for (const id of [fromUrl, stored, st.default_user]) if (id && ids.has(id)) return id;
  return st.users.length ? st.users[0].id : st.default_user;
}

async function start() {
  let st;
  try {
    st = await api("/ui/state");
  } catch (err) {
    if (refused) return; // retrying cannot help: the notice says to reload
    notice("error", `Could not reach the playground server (${err.message}); retrying…`);
    setTimeout(start, 3000);
    return;
  }
  st.channels = st.channels || [st.channel];
  S.state = st;
  S.channel = st.channel.id;
  setDirectory(st);
  channel = new MessageList($("messages"), "channel");
  replies = new MessageList($("thread-replies"), "thread");
  chScroll = stickyScroller($("channel-scroll"), $("messages"));
  thScroll = stickyScroller($("thread-scroll"), $("thread-replies"));

  const chHint = setupComposer($("composer"), $("slash-hint"), $("composer-error"), $("send"), () => null);
  setupComposer($("thread-composer"), $("thread-slash-hint"), $("thread-composer-error"), $("thread-send"), () => S.thread);
  fillSidebar(st, chHint);

  S.as = pickUser(st);
  const sel = $("as");
  const showTitle = () => { sel.title = sel.selectedOptions[0] ? sel.selectedOptions[0].textContent : ""; };
  sel.value = S.as;
  showTitle();
  setMe(S.as);
  sel.addEventListener("change", () => {
    showTitle();
    switchUser(sel.value);
  });
  $("load-older").addEventListener("click", loadOlder);
  $("thread-close").addEventListener("click", closeThread);
  $("side-channel").addEventListener("click", (ev) => {
    ev.preventDefault();
    showChannel(st.channel.id);
    chScroll.toBottom();
  });
  // A link to a message of this workspace (a card's "this task's thread") opens it here.
  document.addEventListener("click", (ev) => {
    const a = ev.target instanceof Element ? ev.target.closest("a[href]") : null;
    if (!a || !/\/archives\/[^/]+\/p\d+$/.test(new URL(a.href).pathname)) return;
    ev.preventDefault();
    openPermalink(a.href);
  });
  $("side-home").addEventListener("click", (ev) => {
    ev.preventDefault();
    showHome();
  });
  $("side-home-name").textContent = st.bot.name;
  $("home-title").textContent = st.bot.name;
  document.addEventListener("keydown", (ev) => {
    if (ev.key !== "Escape" || !S.modals.size) return;
    ev.preventDefault();
    closeView([...S.modals.values()].at(-1));
  });

  const shown = new URL(window.location.href).searchParams.get("channel");
  if (shown && st.channels.some((c) => c.id === shown) && shown !== S.channel) {
    S.channel = shown;
    nameChannel();
  }
  markChannel(S.channel);
  const thread = new URL(window.location.href).searchParams.get("thread");
  if (thread) {
    S.thread = thread;
    $("thread").hidden = false;
    document.body.classList.add("with-thread");
  }
  setUrl();
  connect();
}

start();
