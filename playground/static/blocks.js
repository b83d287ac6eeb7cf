// Block Kit → DOM. Text goes through mrkdwn.js (escaped) or textContent, never raw.
import {
  plainText, textObject, safeUrl, emojiName, userName, channelName, groupHandle, isMe,
} from "./mrkdwn.js";

/** Create an element: h("div", {class: "x"}, child, "text", …). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "html") el.innerHTML = v; // callers pass only escaped HTML
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c != null && c !== false) el.append(c);
  return el;
}

const textEl = (obj, cls, tag = "div") => h(tag, { class: cls, html: textObject(obj) });

// An image with an unusable URL shows its alt text instead of a broken picture.
function image(url, alt, cls, extra = {}) {
  const src = safeUrl(url);
  const missing = () => h("span", { class: cls + " img-missing", title: "image not shown" }, alt || "image");
  if (!src || src.startsWith("mailto:")) return missing();
  const img = h("img", { class: cls, src, alt: alt || "", ...extra });
  img.addEventListener("error", () => img.replaceWith(missing()), { once: true });
  return img;
}

/**
 * Render a list of blocks.
 * ctx: { postAction(action) → Promise, surface: "message" | "modal" | "home",
 *        openUrl(url)?: how a link button opens its URL (default: a new tab) }
 */
export function renderBlocks(blocks, ctx) {
  const frag = document.createDocumentFragment();
  if (!Array.isArray(blocks)) return frag;
  blocks.forEach((block, i) => frag.append(renderBlock(block, i, ctx)));
  return frag;
}

const RENDER = {
  header: (b) => h("div", { class: "blk blk-header", html: plainText(b.text) }),
  divider: () => h("hr", { class: "blk blk-divider" }),
  section: renderSection,
  context: renderContext,
  image: renderImageBlock,
  actions: renderActions,
  input: renderInput,
  rich_text: renderRichText,
};

function renderBlock(block, index, ctx) {
  const type = block && typeof block === "object" ? String(block.type) : block === null ? "null" : typeof block;
  const fn = Object.hasOwn(RENDER, type) ? RENDER[type] : null;
  if (fn) {
    try {
      const el = fn(block, ctx, index);
      if (block.block_id != null && !el.dataset.blockId) el.dataset.blockId = block.block_id;
      return el;
    } catch (err) {
      console.warn("could not render block", block, err);
    }
  }
  return unsupported("block", type, block);
}

function unsupported(what, type, json) {
  let dump;
  try {
    dump = JSON.stringify(json, null, 2);
  } catch {
    dump = String(json);
  }
  const cls = what === "block" ? "block-unsupported" : "element-unsupported";
  const label = what === "block" ? "Unsupported block: " : "Unsupported element: ";
  return h("div", { class: cls },
    h("span", { class: "unsupported-label" }, label + type),
    h("details", {}, h("summary", {}, "JSON"), h("pre", {}, dump)));
}

// ----------------------------------------------------------------------------- blocks
function renderSection(b, ctx) {
  const main = h("div", { class: "sec-main" });
  if (b.text) main.append(textEl(b.text, "sec-text rich"));
  if (Array.isArray(b.fields) && b.fields.length) {
    main.append(h("div", { class: "sec-fields" }, ...b.fields.map((f) => textEl(f, "sec-field rich"))));
  }
  const el = h("div", { class: "blk blk-section" }, main);
  if (b.accessory) {
    const acc = b.accessory.type === "image"
      ? image(b.accessory.image_url, b.accessory.alt_text, "sec-image")
      : renderElement(b.accessory, b, ctx);
    el.append(h("div", { class: "sec-accessory" }, acc));
  }
  return el;
}

function renderContext(b) {
  const items = (b.elements || []).map((e) => {
    if (e.type === "image") {
      return image(e.image_url, e.alt_text, "ctx-image", { title: e.alt_text || null });
    }
    if (e.type === "mrkdwn" || e.type === "plain_text") return textEl(e, "ctx-text rich", "span");
    return unsupported("element", e.type, e);
  });
  return h("div", { class: "blk blk-context" }, ...items);
}

function renderImageBlock(b) {
  return h("figure", { class: "blk blk-image" },
    b.title ? h("figcaption", { class: "img-title", html: plainText(b.title) }) : null,
    image(b.image_url, b.alt_text, "blk-img", { loading: "lazy" }));
}

function renderActions(b, ctx) {
  return h("div", { class: "blk blk-actions" }, ...(b.elements || []).map((e) => renderElement(e, b, ctx)));
}

function renderInput(b, ctx, index) {
  const el = b.element || {};
  const id = "in-" + Math.random().toString(36).slice(2, 10);
  // Slack gives a block without block_id a generated one; a stable stand-in will do here.
  b = { ...b, block_id: b.block_id ?? `input-${index}` };
  const wrap = h("div", { class: "blk blk-input", "data-optional": b.optional ? "1" : null, "data-block-id": b.block_id });
  wrap.append(h("label", { class: "input-label", for: id },
    h("span", { html: plainText(b.label) }),
    b.optional ? h("span", { class: "input-optional" }, " (optional)") : null));
  if (el.type === "plain_text_input") {
    const attrs = {
      id, class: "bk-text-input",
      placeholder: el.placeholder ? el.placeholder.text : null,
      maxlength: el.max_length || null,
      "data-block-id": b.block_id,
      "data-action-id": el.action_id ?? "",
      "data-type": "plain_text_input",
    };
    const field = el.multiline ? h("textarea", { ...attrs, rows: 4 }) : h("input", { ...attrs, type: "text" });
    if (el.initial_value != null) field.value = String(el.initial_value);
    wrap.append(field);
  } else if (el.type === "static_select") {
    const sel = renderSelect(el, b, ctx, true);
    sel.id = id;
    wrap.append(sel);
  } else if (el.type === "number_input") {
    // Slack's number input: text that must be a number (a whole one unless decimals are allowed).
    const field = h("input", {
      id, type: "text", class: "bk-text-input bk-number-input",
      inputmode: el.is_decimal_allowed ? "decimal" : "numeric",
      placeholder: el.placeholder ? el.placeholder.text : null,
      "data-block-id": b.block_id, "data-action-id": el.action_id ?? "", "data-type": "number_input",
      "data-decimal": el.is_decimal_allowed ? "1" : null,
      "data-min": el.min_value ?? null, "data-max": el.max_value ?? null,
    });
    if (el.initial_value != null) field.value = String(el.initial_value);
    wrap.append(field);
  } else if (el.type === "checkboxes") {
    wrap.append(renderCheckboxes(el, b, id));
  } else {
    wrap.append(unsupported("element", el.type, el));
  }
  if (b.hint) wrap.append(h("div", { class: "input-hint", html: plainText(b.hint) }));
  wrap.append(h("div", { class: "input-error", hidden: true, role: "alert" }));
  return wrap;
}

function renderCheckboxes(el, b, id) {
  const box = h("div", {
    id, class: "bk-checkboxes", "data-block-id": b.block_id, "data-action-id": el.action_id ?? "",
    "data-type": "checkboxes",
  });
  const initial = new Set((el.initial_options || []).map((o) => o.value));
  const opts = el.options || [];
  opts.forEach((o, i) => {
    const input = h("input", { type: "checkbox", value: String(i), id: `${id}-${i}` });
    input.checked = initial.has(o.value);
    box.append(h("label", { class: "bk-checkbox", for: `${id}-${i}` }, input, " ", optionText(o)));
  });
  box.selectedOptionsObject = () => [...box.querySelectorAll("input[type=checkbox]")]
    .filter((c) => c.checked).map((c) => { const o = opts[Number(c.value)]; return { text: o.text, value: o.value }; });
  return box;
}

// ----------------------------------------------------------------------------- elements
function renderElement(e, block, ctx) {
  switch (e && e.type) {
    case "button": return renderButton(e, block, ctx);
    case "overflow": return renderOverflow(e, block, ctx);
    case "static_select": return renderSelect(e, block, ctx, false);
    case "image": return image(e.image_url, e.alt_text, "sec-image");
    default: return unsupported("element", e && e.type, e);
  }
}

async function runAction(el, ctx, action) {
  el.disabled = true;
  el.classList.add("busy");
  try {
    await ctx.postAction(action);
  } finally {
    el.disabled = false;
    el.classList.remove("busy");
  }
}

function openUrl(url) {
  const href = safeUrl(url);
  if (href) window.open(href, "_blank", "noopener,noreferrer");
}

function renderButton(e, block, ctx) {
  const style = e.style === "primary" || e.style === "danger" ? " bk-btn-" + e.style : "";
  const btn = h("button", { type: "button", class: "bk-btn" + style, html: plainText(e.text) });
  btn.addEventListener("click", async () => {
    if (btn.disabled) return;
    if (e.confirm && !(await confirmDialog(e.confirm))) return;
    if (e.url) (ctx.openUrl || openUrl)(e.url);
    const action = {
      type: "button", action_id: e.action_id, block_id: block.block_id, value: e.value, text: e.text,
    };
    if (e.style) action.style = e.style;
    await runAction(btn, ctx, action);
  });
  return btn;
}

function optionText(o) {
  return o && o.text ? o.text.text ?? "" : "";
}

function renderOverflow(e, block, ctx) {
  const wrap = h("div", { class: "bk-overflow" });
  const toggle = h("button", { type: "button", class: "bk-btn bk-overflow-btn", "aria-haspopup": "menu", title: "More actions" }, "⋯");
  const menu = h("div", { class: "bk-menu", role: "menu", hidden: true });
  const close = (ev) => {
    if (ev && wrap.contains(ev.target)) return;
    menu.hidden = true;
    document.removeEventListener("click", close, true);
  };
  for (const o of e.options || []) {
    menu.append(h("button", {
      type: "button", role: "menuitem", class: "bk-menu-item", html: plainText(o.text),
      onclick: async () => {
        close();
        if (e.confirm && !(await confirmDialog(e.confirm))) return;
        if (o.url) openUrl(o.url);
        await runAction(toggle, ctx, {
          type: "overflow", action_id: e.action_id, block_id: block.block_id,
          selected_option: { text: o.text, value: o.value },
        });
      },
    }));
  }
  toggle.addEventListener("click", () => {
    menu.hidden = !menu.hidden;
    if (!menu.hidden) document.addEventListener("click", close, true);
  });
  wrap.append(toggle, menu);
  return wrap;
}

function renderSelect(e, block, ctx, inInput) {
  const sel = h("select", {
    class: "bk-select", "data-block-id": block.block_id ?? "", "data-action-id": e.action_id ?? "",
    "data-type": "static_select",
  });
  sel.append(h("option", { value: "", disabled: true, selected: true }, e.placeholder ? e.placeholder.text : "Select…"));
  const all = [];
  const addOpts = (parent, opts) => {
    for (const o of opts || []) {
      all.push(o);
      const opt = h("option", { value: String(all.length - 1) }, optionText(o));
      if (e.initial_option && e.initial_option.value === o.value) opt.selected = true;
      parent.append(opt);
    }
  };
  addOpts(sel, e.options);
  for (const g of e.option_groups || []) {
    const og = h("optgroup", { label: g.label ? g.label.text : "" });
    addOpts(og, g.options);
    sel.append(og);
  }
  sel.selectedOptionObject = () => (sel.value === "" ? null : all[Number(sel.value)]);
  if (!inInput) {
    sel.addEventListener("change", async () => {
      const o = sel.selectedOptionObject();
      if (!o) return;
      if (e.confirm && !(await confirmDialog(e.confirm))) return;
      await runAction(sel, ctx, {
        type: "static_select", action_id: e.action_id, block_id: block.block_id,
        selected_option: { text: o.text, value: o.value },
      });
    });
  }
  return sel;
}

// ----------------------------------------------------------------------------- rich_text
function renderRichText(b) {
  const el = h("div", { class: "blk blk-rich-text" });
  for (const part of b.elements || []) el.append(richPart(part));
  return el;
}

function richPart(p) {
  switch (p.type) {
    case "rich_text_section": return h("div", { class: "rt-section" }, ...richInline(p.elements));
    case "rich_text_preformatted": return h("pre", { class: "mrk-pre" }, ...richInline(p.elements, true));
    case "rich_text_quote": return h("blockquote", {}, ...richInline(p.elements));
    case "rich_text_list": {
      const list = h(p.style === "ordered" ? "ol" : "ul", { class: "rt-list" });
      list.style.marginLeft = `${(Number(p.indent) || 0) * 20}px`;
      if (p.offset) list.setAttribute("start", String(Number(p.offset) + 1));
      for (const item of p.elements || []) list.append(h("li", {}, ...richInline(item.elements)));
      return list;
    }
    default: return unsupported("element", p.type, p);
  }
}

function richInline(elements, pre = false) {
  return (elements || []).map((e) => {
    let node;
    switch (e.type) {
      case "text": node = document.createTextNode(e.text ?? ""); break;
      case "link": {
        const href = safeUrl(e.url);
        node = href
          ? h("a", { href, target: "_blank", rel: "noopener noreferrer" }, e.text || e.url)
          : document.createTextNode(e.text || e.url || "");
        break;
      }
      case "user": node = h("span", { class: "mention" + (isMe(e.user_id) ? " mention-me" : "") }, "@" + userName(e.user_id)); break;
      case "usergroup": node = h("span", { class: "mention mention-group" }, "@" + groupHandle(e.usergroup_id)); break;
      case "channel": node = h("span", { class: "mention mention-channel" }, "#" + channelName(e.channel_id)); break;
      case "broadcast": node = h("span", { class: "mention mention-broadcast" }, "@" + e.range); break;
      case "emoji": node = document.createTextNode(e.unicode ? unicodeEmoji(e.unicode) : emojiName(e.name) || `:${e.name}:`); break;
      case "date": node = document.createTextNode(e.fallback || ""); break;
      default: node = unsupported("element", e.type, e);
    }
    const st = e.style || {};
    if (!pre && st.code) node = h("code", {}, node);
    if (st.bold) node = h("b", {}, node);
    if (st.italic) node = h("i", {}, node);
    if (st.strike) node = h("s", {}, node);
    return node;
  });
}

function unicodeEmoji(hex) {
  try {
    return String.fromCodePoint(...String(hex).split("-").map((x) => parseInt(x, 16)));
  } catch {
    return "";
  }
}

// ----------------------------------------------------------------------------- layers
/** Only the topmost dialog is usable (and visible to assistive tech); the page behind is inert. */
export function syncInert() {
  const layers = [...document.body.children].filter((e) => e.tagName !== "SCRIPT");
  const dialogs = layers.filter((e) => e.matches(".modal-backdrop, .confirm-backdrop"));
  const top = dialogs.filter((e) => e.matches(".confirm-backdrop")).at(-1) || dialogs.at(-1);
  for (const el of layers) {
    const off = !!top && el !== top;
    el.inert = off;
    if (off) el.setAttribute("aria-hidden", "true");
    else el.removeAttribute("aria-hidden");
  }
}

// ----------------------------------------------------------------------------- confirm
/** Slack's confirmation dialog; resolves true only when its confirm button is pressed. */
export function confirmDialog(c) {
  return new Promise((resolve) => {
    const prev = document.activeElement;
    const done = (ok) => {
      document.removeEventListener("keydown", onKey, true);
      backdrop.remove();
      syncInert();
      if (prev && prev.focus) prev.focus();
      resolve(ok);
    };
    const onKey = (ev) => {
      if (ev.key === "Escape") {
        ev.stopPropagation();
        done(false);
      }
    };
    const deny = h("button", { type: "button", class: "bk-btn confirm-deny", onclick: () => done(false), html: plainText(c.deny || "Cancel") });
    const okCls = c.style === "danger" ? "bk-btn bk-btn-danger" : "bk-btn bk-btn-primary";
    const ok = h("button", { type: "button", class: okCls + " confirm-ok", onclick: () => done(true), html: plainText(c.confirm || "Yes") });
    const titleId = "confirm-title-" + Math.random().toString(36).slice(2, 8);
    const box = h("div", { class: "confirm", role: "alertdialog", "aria-modal": "true", "aria-labelledby": titleId },
      h("h2", { class: "confirm-title", id: titleId, html: plainText(c.title || "Are you sure?") }),
      h("div", { class: "confirm-text rich", html: c.text ? textObject(c.text) : "" }),
      h("div", { class: "confirm-buttons" }, deny, ok));
    const backdrop = h("div", { class: "confirm-backdrop", onclick: (ev) => ev.target === backdrop && done(false) }, box);
    document.addEventListener("keydown", onKey, true);
    document.body.append(backdrop);
    syncInert();
    deny.focus();
  });
}

// ----------------------------------------------------------------------------- modal inputs
/** view.state.values as Slack sends it, from the inputs under root. */
export function collectValues(root) {
  const values = {};
  for (const f of root.querySelectorAll("[data-type][data-block-id]")) {
    if (!f.closest(".blk-input")) continue;
    const blockId = f.dataset.blockId;
    const actionId = f.dataset.actionId;
    const entry = { type: f.dataset.type };
    if (f.dataset.type === "plain_text_input" || f.dataset.type === "number_input") {
      entry.value = f.value === "" ? null : f.value;
    } else if (f.dataset.type === "checkboxes") entry.selected_options = f.selectedOptionsObject();
    else entry.selected_option = f.selectedOptionObject ? f.selectedOptionObject() : null;
    (values[blockId] ||= {})[actionId] = entry;
  }
  return values;
}

/** What the person typed, to carry across a re-render of the same view. */
export function snapshotInputs(root) {
  const snap = new Map();
  for (const f of root.querySelectorAll("[data-type][data-block-id]")) {
    const boxes = [...f.querySelectorAll("input[type=checkbox]")];
    snap.set(f.dataset.blockId + "\u0000" + f.dataset.actionId, boxes.length ? boxes.map((c) => c.checked) : f.value);
  }
  return snap;
}

export function restoreInputs(root, snap) {
  for (const f of root.querySelectorAll("[data-type][data-block-id]")) {
    const key = f.dataset.blockId + "\u0000" + f.dataset.actionId;
    if (!snap.has(key)) continue;
    const was = snap.get(key);
    if (Array.isArray(was)) f.querySelectorAll("input[type=checkbox]").forEach((c, i) => { c.checked = !!was[i]; });
    else f.value = was;
  }
}

/** Show {block_id: message} under each input block; returns how many were placed. */
export function showInputErrors(root, errors) {
  let shown = 0;
  for (const blk of root.querySelectorAll(".blk-input")) {
    const slot = blk.querySelector(".input-error");
    const msg = errors ? errors[blk.dataset.blockId] : undefined;
    slot.hidden = msg == null;
    slot.textContent = msg == null ? "" : String(msg);
    blk.classList.toggle("has-error", msg != null);
    if (msg != null) shown++;
  }
  return shown;
}

/** Slack's own check before a submit: required inputs must not be empty. */
export function missingRequired(root) {
  const errors = {};
  for (const blk of root.querySelectorAll(".blk-input")) {
    if (blk.dataset.optional) continue;
    const f = blk.querySelector("[data-type]");
    if (f && f.dataset.type === "checkboxes") {
      if (!f.selectedOptionsObject().length) errors[blk.dataset.blockId] = "Please select an option.";
    } else if (f && f.value.trim() === "") errors[blk.dataset.blockId] = "Please fill out this field.";
  }
  // Slack checks a number input in the browser before anything is sent.
  for (const f of root.querySelectorAll("[data-type=number_input]")) {
    const v = f.value.trim();
    if (v === "" || errors[f.dataset.blockId]) continue;
    const n = Number(v);
    const whole = f.dataset.decimal ? true : /^-?\d+$/.test(v);
    if (!Number.isFinite(n) || !whole) {
      errors[f.dataset.blockId] = f.dataset.decimal ? "Please enter a number." : "Please enter a whole number.";
    } else if (f.dataset.min != null && n < Number(f.dataset.min)) {
      errors[f.dataset.blockId] = `Please enter a number of at least ${f.dataset.min}.`;
    } else if (f.dataset.max != null && n > Number(f.dataset.max)) {
      errors[f.dataset.blockId] = `Please enter a number of at most ${f.dataset.max}.`;
    }
  }
  return errors;
}
