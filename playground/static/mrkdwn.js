// Slack mrkdwn → safe HTML. Every input is untrusted: text is HTML-escaped before any
// markup is added, and the only markup added is built here from fixed templates.

const EMOJI = {
  white_check_mark: "✅", heavy_check_mark: "✔️", x: "❌", warning: "⚠️",
  hourglass_flowing_sand: "⏳", hourglass: "⌛", lock: "🔒", closed_lock_with_key: "🔐",
  key: "🔑", no_entry: "⛔", no_entry_sign: "🚫", robot_face: "🤖", stopwatch: "⏱️",
  alarm_clock: "⏰", thumbsup: "👍", "+1": "👍", thumbsdown: "👎", "-1": "👎", wave: "👋",
  rocket: "🚀", eyes: "👀", memo: "📝", pencil: "📝", gear: "⚙️", information_source: "ℹ️",
  exclamation: "❗", question: "❓", white_circle: "⚪", large_green_circle: "🟢",
  red_circle: "🔴", large_yellow_circle: "🟡", zap: "⚡", skull: "💀",
  hammer_and_wrench: "🛠️", clock1: "🕐", bust_in_silhouette: "👤",
  busts_in_silhouette: "👥", tada: "🎉", fire: "🔥", bulb: "💡", mag: "🔍", link: "🔗",
  repeat: "🔁", arrow_forward: "▶️", heavy_multiplication_x: "✖️", octagonal_sign: "🛑",
  construction: "🚧", clipboard: "📋", sparkles: "✨", star: "⭐", bell: "🔔", pray: "🙏",
  ok_hand: "👌", point_right: "👉", smile: "😄", slightly_smiling_face: "🙂",
  black_square_for_stop: "⏹️", hourglass_done: "⌛", "100": "💯", thinking_face: "🤔",
};

// Who and what the ids in <@U…>, <#C…>, <!subteam^S…> name; filled from /ui/state.
const dir = { users: new Map(), channels: new Map(), groups: new Map(), me: null };

export function setDirectory({ users = [], bot = null, channel = null, channels = [], usergroups = [], me = null }) {
  dir.users = new Map(users.map((u) => [u.id, u.name]));
  if (bot) dir.users.set(bot.id, bot.name);
  dir.channels = new Map(channel ? [[channel.id, channel.name]] : []);
  for (const c of channels) dir.channels.set(c.id, c.name);
  dir.groups = new Map(usergroups.map((g) => [g.id, g.handle]));
  dir.me = me;
}

export function setMe(id) {
  dir.me = id;
}

export const userName = (id) => dir.users.get(id) || id;
export const channelName = (id) => dir.channels.get(id) || id;
export const groupHandle = (id) => dir.groups.get(id) || id;
export const isMe = (id) => id === dir.me;

const HTML_ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const esc = (s) => String(s).replace(/[&<>"']/g, (c) => HTML_ESC[c]);

// Slack escapes exactly these three in message text.
const decodeSlack = (s) => s.replace(/&(lt|gt|amp);/g, (_, n) => ({ lt: "<", gt: ">", amp: "&" })[n]);

export function emojiName(name) {
  return EMOJI[name.replace(/::skin-tone-\d$/, "")] || null;
}

// Works on already-escaped HTML text: shortcodes contain no characters that escaping changes.
export function emojify(html) {
  return html.replace(/:([a-z0-9_+'-]+(?:::skin-tone-\d)?):/g, (m, n) => emojiName(n) || m);
}

/** A Block Kit plain_text object (or string) → HTML. */
export function plainText(obj) {
  if (obj == null) return "";
  const text = typeof obj === "string" ? obj : String(obj.text ?? "");
  const html = esc(text);
  return obj.emoji === false ? html : emojify(html);
}

/** A Block Kit text object of either type → HTML. */
export function textObject(obj) {
  if (!obj) return "";
  return obj.type === "mrkdwn" ? mrkdwn(obj.text ?? "") : plainText(obj);
}

/** Only absolute http(s) and mailto links, normalised; null for anything else. */
export function safeUrl(raw) {
  const text = String(raw ?? "").trim();
  if (!/^(https?:\/\/|mailto:)/i.test(text)) return null;
  try {
    const u = new URL(text);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

const mention = (label, cls = "") =>
  `<span class="mention${cls ? " " + cls : ""}">${esc(label)}</span>`;

// One <…> token (without the brackets), raw from the message.
function token(inner) {
  const bar = inner.indexOf("|");
  const target = bar < 0 ? inner : inner.slice(0, bar);
  const label = bar < 0 ? null : decodeSlack(inner.slice(bar + 1));
  if (target.startsWith("@")) {
    const id = target.slice(1);
    const name = dir.users.get(id) || label || id;
    return mention("@" + name, isMe(id) ? "mention-me" : "");
  }
  if (target.startsWith("#")) {
    const id = target.slice(1);
    return mention("#" + (dir.channels.get(id) || label || id), "mention-channel");
  }
  if (target.startsWith("!")) {
    const [kind, ...rest] = target.slice(1).split("^");
    if (["here", "channel", "everyone"].includes(kind)) return mention("@" + kind, "mention-broadcast");
    if (kind === "subteam") {
      const id = rest[0] || "";
      const handle = dir.groups.get(id) || (label || "").replace(/^@/, "") || id;
      return mention("@" + handle, "mention-group");
    }
    if (kind === "date") return `<span class="mrk-date">${esc(label ?? rest[0] ?? "")}</span>`;
    return esc(label ?? "<" + decodeSlack(inner) + ">");
  }
  const url = decodeSlack(target);
  const href = safeUrl(url);
  const shown = label ?? url.replace(/^mailto:/i, "");
  if (!href) return emojify(esc(shown));
  return `<a href="${esc(href)}" target="_blank" rel="noopener noreferrer">${emojify(esc(shown))}</a>`;
}

const PH_OPEN = "\uE000";
const PH_CLOSE = "\uE001";

function inline(seg, slots) {
  const hold = (html) => PH_OPEN + (slots.push(html) - 1) + PH_CLOSE;
  // Raw "<" only ever opens a token: Slack sends a literal "<" as &lt;.
  let s = seg.replace(/<([^<>]+)>/g, (_, inner) => hold(token(inner)));
  s = s.replace(/`([^`\n]+)`/g, (_, code) => hold(`<code>${esc(decodeSlack(code))}</code>`));
  s = s.replace(/\bhttps?:\/\/[^\s<>`\uE000\uE001]+/g, (m) => {
    const trail = m.match(/[.,;:!?)'"]+$/);
    const url = trail ? m.slice(0, -trail[0].length) : m;
    const href = safeUrl(decodeSlack(url));
    const html = href
      ? `<a href="${esc(href)}" target="_blank" rel="noopener noreferrer">${esc(decodeSlack(url))}</a>`
      : esc(decodeSlack(url));
    return hold(html) + (trail ? trail[0] : "");
  });
  s = emojify(esc(decodeSlack(s)));
  const B = "(^|[^A-Za-z0-9";
  s = s.replace(new RegExp(B + "*])\\*(?=\\S)([^*\\n]*?\\S)\\*(?![A-Za-z0-9*])", "g"), "$1<b>$2</b>");
  s = s.replace(new RegExp(B + "_])_(?=\\S)([^_\\n]*?\\S)_(?![A-Za-z0-9_])", "g"), "$1<i>$2</i>");
  s = s.replace(new RegExp(B + "~])~(?=\\S)([^~\\n]*?\\S)~(?![A-Za-z0-9~])", "g"), "$1<s>$2</s>");
  return s;
}

// Lines starting with ">" (escaped by now) become block quotes; other lines join with <br>.
function lines(html) {
  const out = [];
  let quote = null;
  for (const line of html.split("\n")) {
    const m = line.match(/^&gt; ?(.*)$/);
    if (m) {
      (quote ||= []).push(m[1]);
      continue;
    }
    if (quote) {
      out.push({ q: quote.join("<br>") });
      quote = null;
    }
    out.push({ l: line });
  }
  if (quote) out.push({ q: quote.join("<br>") });
  let html2 = "";
  out.forEach((p, i) => {
    if (p.q !== undefined) html2 += `<blockquote>${p.q}</blockquote>`;
    else html2 += p.l + (i < out.length - 1 && out[i + 1].q === undefined ? "<br>" : "");
  });
  return html2;
}

function restore(html, slots) {
  const re = /\uE000(\d+)\uE001/g;
  for (let i = 0; i < 5 && re.test(html); i++) html = html.replace(re, (_, n) => slots[+n] ?? "");
  return html;
}

/** Slack mrkdwn text → HTML safe to assign to innerHTML. */
export function mrkdwn(text) {
  const src = String(text ?? "").replace(/[\uE000\uE001]/g, "");
  const slots = [];
  let html = "";
  const parts = src.split("```");
  // Odd pieces are inside ``` fences; an unclosed last fence is shown literally.
  const isPre = (i) => i % 2 === 1 && (parts.length % 2 === 1 || i < parts.length - 1);
  parts.forEach((part, i) => {
    if (isPre(i)) {
      const body = part.replace(/^\n/, "").replace(/\n$/, "");
      html += `<pre class="mrk-pre">${esc(decodeSlack(body))}</pre>`;
      return;
    }
    let seg = i % 2 === 1 ? "```" + part : part;
    if (isPre(i - 1)) seg = seg.replace(/^\n/, "");
    if (isPre(i + 1)) seg = seg.replace(/\n$/, "");
    if (seg) html += lines(inline(seg, slots));
  });
  return restore(html, slots);
}

/** HH:MM (local time) from a Slack ts string. */
export function timeOf(ts) {
  const d = new Date(Number(String(ts).split(".")[0]) * 1000);
  return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
}

export function dateOf(ts) {
  return new Date(Number(String(ts).split(".")[0]) * 1000).toLocaleString();
}

/** Compare two Slack ts strings exactly (no float rounding). */
export function compareTs(a, b) {
  const [ai, af = ""] = String(a).split(".");
  const [bi, bf = ""] = String(b).split(".");
  if (ai.length !== bi.length) return ai.length - bi.length;
  if (ai !== bi) return ai < bi ? -1 : 1;
  const n = Math.max(af.length, bf.length);
  const x = af.padEnd(n, "0");
  const y = bf.padEnd(n, "0");
  return x === y ? 0 : x < y ? -1 : 1;
}
