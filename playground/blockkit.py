"""What Slack's client does with Block Kit before the app hears of it: the action a click on
an element sends (built from the stored blocks, never from what the page says), and a
submitted view's ``state.values`` with the errors the client shows without sending anything.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Any


def elements(blocks: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """(block_id, element) for every interactive element of a list of blocks."""
    out: list[tuple[str, dict[str, Any]]] = []
    for b in blocks:
        if not isinstance(b, dict):
            continue
        block_id = str(b.get("block_id") or "")
        if b.get("type") == "actions":
            out += [(block_id, e) for e in b.get("elements") or [] if isinstance(e, dict)]
        elif b.get("type") == "section" and isinstance(b.get("accessory"), dict):
            out.append((block_id, b["accessory"]))
        elif b.get("type") == "input" and isinstance(b.get("element"), dict):
            out.append((block_id, b["element"]))
    return out


def find_element(blocks: list[Any], action: dict[str, Any]) -> dict[str, Any] | None:
    """The action Slack would send for a click on the element the page names, built from the
    stored blocks (never from what the page says the value is)."""
    for block_id, e in elements(blocks):
        if str(e.get("action_id") or "") != str(action.get("action_id") or ""):
            continue
        if action.get("block_id") and block_id and block_id != action["block_id"]:
            continue
        out: dict[str, Any] = {
            "type": e.get("type"),
            "action_id": e.get("action_id"),
            "block_id": block_id or action.get("block_id") or secrets.token_hex(3),
        }
        if e.get("type") == "button":
            out["text"] = e.get("text")
            for key in ("value", "style", "url"):
                if key in e:
                    out[key] = e[key]
        elif e.get("type") in ("overflow", "static_select"):
            opt = action.get("selected_option")
            chosen = opt.get("value") if isinstance(opt, dict) else None
            options = [o for o in e.get("options") or [] if isinstance(o, dict)]
            match = next((o for o in options if o.get("value") == chosen), None)
            if match is None:
                return None
            out["selected_option"] = match
        return out
    return None


def view_state(
    view: dict[str, Any], values: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """``view.state.values`` for what the person typed or picked, and the errors Slack's
    client shows without sending anything (a required field left empty, too short, too
    long, a number input that does not hold a number of the kind and range it asks for).
    Options are the view's own: a picked option the element does not offer counts as none."""
    state: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for b in view.get("blocks") or []:
        if not isinstance(b, dict) or b.get("type") != "input":
            continue
        block_id = str(b.get("block_id") or "")
        element = b.get("element") or {}
        kind = element.get("type")
        action_id = str(element.get("action_id") or "")
        entry = values.get(block_id)
        typed = entry.get(action_id) if isinstance(entry, dict) else None
        typed = typed if isinstance(typed, dict) else {}
        if kind in ("static_select", "checkboxes"):
            offered = [o for o in element.get("options") or [] if isinstance(o, dict)]
            for group in element.get("option_groups") or []:
                offered += [o for o in group.get("options") or [] if isinstance(o, dict)]
            if kind == "static_select":
                picked = [typed.get("selected_option")]
            else:
                picked = typed.get("selected_options") or []
            chosen = [
                o
                for o in offered
                if any(isinstance(p, dict) and p.get("value") == o.get("value") for p in picked)
            ]
            if not chosen and not b.get("optional"):
                errors[block_id] = "Please fill out this field."
            if kind == "static_select":
                state[block_id] = {
                    action_id: {"type": kind, "selected_option": chosen[0] if chosen else None}
                }
            else:
                state[block_id] = {action_id: {"type": kind, "selected_options": chosen}}
            continue
        raw = typed.get("value")
        value = raw if isinstance(raw, str) and raw.strip() else None
        if value is None and not b.get("optional"):
            errors[block_id] = "Please fill out this field."
        elif value is not None and kind == "number_input":
            problem = number_problem(value.strip(), element)
            if problem:
                errors[block_id] = problem
        elif value is not None and len(value) < int(element.get("min_length") or 0):
            errors[block_id] = f"Please enter at least {element['min_length']} characters."
        elif (
            value is not None
            and element.get("max_length")
            and len(value) > int(element["max_length"])
        ):
            errors[block_id] = f"Please enter at most {element['max_length']} characters."
        state[block_id] = {action_id: {"type": kind, "value": value}}
    return state, errors


def number_problem(value: str, element: dict[str, Any]) -> str | None:
    """What Slack's client says of a number input's text (None: it sends it)."""
    decimal = bool(element.get("is_decimal_allowed"))
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or (not decimal and not re.fullmatch(r"-?\d+", value)):
        return "Please enter a number." if decimal else "Please enter a whole number."
    for key, word in (("min_value", "least"), ("max_value", "most")):
        bound = element.get(key)
        try:
            limit = float(bound) if bound is not None else None
        except ValueError:
            limit = None
        if limit is not None and (number < limit if key == "min_value" else number > limit):
            return f"Please enter a number of at {word} {bound}."
    return None
