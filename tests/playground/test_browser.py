"""The playground in a real browser (Debian's Chromium): what a person sees, from ``/agent``
to the answer, with every decision path and every authorization rule.

The playground runs as a real process with the real ``web`` and ``worker``, and the scripted
model answering for the example agent. Screenshots are kept in var/artifacts/playground/.
"""

from __future__ import annotations

import asyncio
import html
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import test_utils, web
from playwright.async_api import Locator, Page, expect

from playground import people
from playground.guard import TOKEN_HEADER
from playground.people import Person
from tests.playground.conftest import (
    ARTIFACTS,
    BROWSER_LOOP,
    PlaygroundProcess,
    shot,
    start_playground,
)
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.timeout(120), BROWSER_LOOP]

SLOW = 20_000  # ms: a run goes through the real bot, worker and model


async def open_as(page: Page, pg: PlaygroundProcess, who: Person) -> None:
    await page.goto(f"{pg.url}/?as={who.id}")
    await expect(page.locator("#as")).to_have_value(who.id)


async def switch(page: Page, who: Person) -> None:
    await page.select_option("#as", who.id)
    await expect(page.locator("#as")).to_have_value(who.id)


async def send(page: Page, text: str, composer: str = "#composer") -> None:
    await page.fill(composer, text)
    await page.press(composer, "Enter")


async def start_task(page: Page, task: str) -> Locator:
    """``/agent <task>``; returns the thread pane, opened on the task's message."""
    await send(page, f"/agent {task}")
    root = page.locator("#messages .msg", has_text=f"Task started by @Riley: {task}").last
    await expect(root).to_be_visible(timeout=SLOW)
    link = root.locator(".replies-link")
    await expect(link).to_be_visible(timeout=SLOW)
    await link.click()
    thread = page.locator("#thread")
    await expect(thread).to_be_visible()
    return thread


def card(thread: Locator, tool: str = "delete_user") -> Locator:
    return thread.locator("#thread-replies .msg", has_text="Arguments").filter(has_text=tool)


async def test_approve_from_command_to_answer(page: Page, playground: PlaygroundProcess) -> None:
    await open_as(page, playground, people.REQUESTER)
    await expect(page.locator("#model-banner")).to_contain_text("Scripted model")
    thread = await start_task(page, "delete user 42")
    gate = card(thread).first
    await expect(gate).to_be_visible(timeout=SLOW)
    # The exact arguments and the expiry, as the approver will see them.
    await expect(gate).to_contain_text("delete_user")
    await expect(gate).to_contain_text('"user_id": "42"')
    await expect(gate).to_contain_text("Waiting for a decision")
    await expect(gate).to_contain_text("expires")
    await expect(gate.get_by_role("button", name="Approve")).to_be_visible()
    await expect(gate.get_by_role("button", name="Deny")).to_be_visible()
    await shot(page, "card-before-approval")
    await gate.screenshot(path=str(ARTIFACTS / "card-before.png"))

    await switch(page, people.APPROVER)
    gate = card(page.locator("#thread")).first
    await gate.get_by_role("button", name="Approve").click()
    await expect(gate).to_contain_text("Approved by @Avery", timeout=SLOW)
    await expect(gate).to_contain_text("user 42 deleted", timeout=SLOW)
    await expect(gate.get_by_role("button", name="Approve")).to_have_count(0)
    answer = page.locator("#thread-replies .msg", has_text="Answer")
    await expect(answer).to_contain_text("user 42 deleted", timeout=SLOW)
    await shot(page, "card-after-approval")
    await gate.screenshot(path=str(ARTIFACTS / "card-after.png"))


async def test_deny_with_a_reason(page: Page, playground: PlaygroundProcess) -> None:
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "delete user 43")
    await expect(card(thread).first).to_be_visible(timeout=SLOW)

    await switch(page, people.APPROVER)
    gate = card(page.locator("#thread")).first
    await gate.get_by_role("button", name="Deny").click()
    modal = page.locator(".modal[role=dialog]")
    await expect(modal).to_be_visible(timeout=SLOW)
    await expect(modal.locator(".modal-title")).to_have_text("Deny tool call")
    # Slack adds "(optional)" to an optional input's label itself: once, not twice.
    await expect(modal).to_contain_text("Reason (optional)")
    await expect(modal).not_to_contain_text("(optional) (optional)")
    await modal.locator("textarea, input[type=text]").first.fill("not during the change freeze")
    await shot(page, "deny-modal")
    await modal.locator(".modal-submit").click()
    await expect(modal).to_have_count(0, timeout=SLOW)
    await expect(gate).to_contain_text("Denied", timeout=SLOW)
    await expect(gate).to_contain_text("not during the change freeze")
    # The model was told the reason: the scripted model quotes it verbatim in its answer.
    answer = page.locator("#thread-replies .msg", has_text="Answer")
    await expect(answer).to_contain_text("not during the change freeze", timeout=SLOW)
    # Who denied it, by name as everywhere on the page: not a raw "<@U0PGAVERY>".
    await expect(answer).to_contain_text("the request was denied by @Avery")
    await expect(answer).not_to_contain_text(people.APPROVER.id)
    await expect(gate).not_to_contain_text("user 43 deleted")


async def test_only_approvers_decide(page: Page, playground: PlaygroundProcess) -> None:
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "delete user 42 again")
    gate = card(thread).first
    await expect(gate).to_be_visible(timeout=SLOW)

    # The requester may not approve their own call.
    await gate.get_by_role("button", name="Approve").click()
    mine = page.locator("#thread .msg.ephemeral")
    await expect(mine.last).to_contain_text("Only visible to you", timeout=SLOW)

    # An outsider's click: a message only they see; the card does not change.
    await switch(page, people.OUTSIDER)
    gate = card(page.locator("#thread")).first
    await gate.get_by_role("button", name="Approve").click()
    theirs = page.locator("#thread .msg.ephemeral")
    await expect(theirs).to_have_count(1, timeout=SLOW)
    await expect(theirs).to_contain_text("Only visible to you")
    await shot(page, "outsider-click")
    await expect(gate).to_contain_text("Waiting for a decision")
    await expect(gate.get_by_role("button", name="Approve")).to_be_visible()

    # The requester's message is not shown to anyone else.
    await switch(page, people.ON_CALL)
    await expect(page.locator("#thread .msg.ephemeral")).to_have_count(0)
    # A member of the @oncall approver group may approve.
    gate = card(page.locator("#thread")).first
    await gate.get_by_role("button", name="Approve").click()
    await expect(gate).to_contain_text("Approved by @Sam", timeout=SLOW)


async def open_home(page: Page) -> Locator:
    """The acting person opens the app's Home tab."""
    await page.click("#side-home")
    home = page.locator("#home")
    await expect(home).to_be_visible()
    await expect(home).to_contain_text("Waiting for your decision", timeout=SLOW)
    return home


def home_actions(home: Locator, needle: str) -> Locator:
    """The buttons of the pending call on Home whose summary contains ``needle``."""
    item = home.locator(".blk", has_text=needle).first
    return item.locator("xpath=following-sibling::*[starts-with(@data-block-id, 'home:')][1]")


async def test_app_home_lists_what_each_person_may_decide(
    page: Page, playground: PlaygroundProcess
) -> None:
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "delete user 47")
    await expect(card(thread).first).to_be_visible(timeout=SLOW)
    call = 'delete_user(user_id="47")'

    # The requester may deny their own call from Home, not approve it.
    home = await open_home(page)
    await expect(home).to_contain_text(call, timeout=SLOW)
    mine = home_actions(home, call)
    await expect(mine.get_by_role("button", name="Deny")).to_be_visible()
    await expect(mine.get_by_role("button", name="Approve")).to_have_count(0)

    # An outsider's Home lists nothing of it.
    await switch(page, people.OUTSIDER)
    await expect(home).to_contain_text("Waiting for your decision", timeout=SLOW)
    await expect(home).not_to_contain_text(call)

    # The approver's Home: the call, its run and requester, and the buttons.
    await switch(page, people.APPROVER)
    await expect(home).to_contain_text(call, timeout=SLOW)
    await expect(home).to_contain_text("requested by @Riley")
    theirs = home_actions(home, call)
    await expect(theirs.get_by_role("button", name="Approve")).to_be_visible()
    await shot(page, "app-home")
    # Open thread shows the card's thread.
    await theirs.get_by_role("button", name="Open thread").click()
    await expect(card(page.locator("#thread")).filter(has_text="47").first).to_be_visible()
    await expect(page.locator("#channel")).to_be_visible()

    # Approve on Home: the card and Home both show it.
    home = await open_home(page)
    await home_actions(home, call).get_by_role("button", name="Approve").click()
    await expect(home_actions(home, call)).to_have_count(0, timeout=SLOW)
    decided = home.locator(".blk", has_text="Approved").filter(has_text=call)
    await expect(decided).to_be_visible(timeout=SLOW)
    await shot(page, "app-home-after-approval")
    await page.click("#side-channel")
    gate = card(page.locator("#thread")).filter(has_text="47").first
    await expect(gate).to_contain_text("Approved by @Avery", timeout=SLOW)


async def test_a_reply_in_the_thread_continues_the_run(
    page: Page, playground: PlaygroundProcess
) -> None:
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "look up user 43")
    replies = thread.locator("#thread-replies .msg", has_text="Answer")
    await expect(replies.first).to_contain_text("User 43:", timeout=SLOW)
    # The reply goes to the bot as Slack's `message` event; the run continues in the thread.
    await send(page, "now delete user 43", composer="#thread-composer")
    await expect(
        thread.locator("#thread-replies .msg", has_text="now delete user 43")
    ).to_be_visible()
    gate = card(thread).first
    await expect(gate).to_be_visible(timeout=SLOW)
    await expect(gate).to_contain_text('"user_id": "43"')
    await shot(page, "thread-reply-continues")


async def test_a_mention_starts_a_run_in_its_thread(
    page: Page, playground: PlaygroundProcess
) -> None:
    await open_as(page, playground, people.REQUESTER)
    await send(page, "@agent look up user 42")
    mine = page.locator("#messages .msg", has_text="look up user 42").filter(has_text="Riley")
    link = mine.last.locator(".replies-link")
    await expect(link).to_be_visible(timeout=SLOW)
    await link.click()
    thread = page.locator("#thread")
    await expect(thread).to_contain_text("Task started by @Riley: look up user 42", timeout=SLOW)
    answer = thread.locator("#thread-replies .msg", has_text="Answer")
    # The look-up ran (user 42 may be gone by now: other tests in this playground delete it).
    await expect(answer).to_contain_text("User 42:", timeout=SLOW)


async def test_the_long_arguments_card_opens_them_all(
    page: Page, playground: PlaygroundProcess
) -> None:
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "email alan@partner.org the full incident report")
    gate = card(thread, "send_email").first
    await expect(gate).to_be_visible(timeout=SLOW)
    await expect(gate).to_contain_text("Arguments truncated")
    await switch(page, people.APPROVER)
    gate = card(page.locator("#thread"), "send_email").first
    await gate.get_by_role("button", name="View all arguments").click()
    modal = page.locator(".modal[role=dialog]")
    await expect(modal).to_be_visible(timeout=SLOW)
    await expect(modal.locator(".modal-title")).to_have_text("Tool call arguments")
    await expect(modal).to_contain_text("alan@partner.org")
    await shot(page, "all-arguments-modal")
    await modal.locator(".modal-close").click()
    await expect(modal).to_have_count(0)


async def test_expiry_shows_without_a_reload(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    pg = start_playground(redis_server.url, tmp_path, APPROVAL_TIMEOUT="4")
    try:
        await open_as(page, pg, people.REQUESTER)
        thread = await start_task(page, "delete user 42")
        gate = card(thread).first
        await expect(gate).to_contain_text("Waiting for a decision", timeout=SLOW)
        await expect(gate).to_contain_text("Expired", timeout=SLOW)
        await expect(gate.get_by_role("button", name="Approve")).to_have_count(0)
        answer = page.locator("#thread-replies .msg", has_text="Answer")
        await expect(answer).to_contain_text("expired", timeout=SLOW)
        await expect(answer).not_to_contain_text("denied")
        await shot(page, "expired-card")
    finally:
        pg.stop()


async def test_a_thousand_messages_and_a_restart(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    pg = start_playground(redis_server.url, tmp_path)
    try:
        # A script on this machine: it needs the session token, as the page does.
        token = {TOKEN_HEADER: pg.session_token()}
        async with aiohttp.ClientSession(headers=token) as http:
            sem = asyncio.Semaphore(16)

            async def post(i: int) -> None:
                async with (
                    sem,
                    http.post(
                        pg.url + "/ui/send",
                        json={"as": people.REQUESTER.id, "text": f"message number {i}"},
                    ) as resp,
                ):
                    assert resp.status == 200, await resp.text()

            for start in range(0, 1000, 100):  # in order, so the last one is newest
                await asyncio.gather(*(post(i) for i in range(start, start + 100)))
                await asyncio.sleep(0)
        await open_as(page, pg, people.REQUESTER)
        msgs = page.locator("#messages .msg")
        await expect(msgs.last).to_contain_text("message number 999")
        shown = await msgs.count()
        assert 10 <= shown <= 100, shown
        await page.locator("#load-older").click()
        await expect(msgs).to_have_count(shown + 50)
        await shot(page, "thousand-messages")
    finally:
        pg.stop()

    # A restart shows the same conversation: it lives in Redis.
    pg = start_playground(redis_server.url, tmp_path, prefix=pg.prefix)
    try:
        await open_as(page, pg, people.REQUESTER)
        await expect(page.locator("#messages .msg").last).to_contain_text("message number 999")
    finally:
        pg.stop()


async def test_another_web_page_cannot_start_a_run(
    page: Page, playground: PlaygroundProcess
) -> None:
    """A page of another origin posts ``/agent delete user 4242`` the two ways that need no
    CORS preflight: a ``no-cors`` fetch with a text/plain body, then a text/plain form (its
    field name and value spell the JSON). Both are refused; no run starts."""
    task = "delete user 4242"
    body = json.dumps({"as": people.REQUESTER.id, "text": f"/agent {task}", "pad": ""})
    field, value = body[:-2], '"}'  # the form sends "<name>=<value>": the JSON above
    send_url = f"{playground.url}/ui/send"
    evil = f"""<!doctype html><title>cute cats</title>
<form id="f" method="post" action="{send_url}" enctype="text/plain">
<input type="hidden" name='{html.escape(field)}' value='{html.escape(value)}'></form>
<script>
fetch({json.dumps(send_url)}, {{method: "POST", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: {json.dumps(body)}}})
  .catch(() => null).finally(() => document.getElementById("f").submit());
</script>"""

    async def cats(request: web.Request) -> web.Response:
        return web.Response(text=evil, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", cats)
    server = test_utils.TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        await page.goto(f"http://127.0.0.1:{server.port}/")
        # The form's answer, shown in place of the cats: refused before the bot heard of it.
        await page.wait_for_url(send_url, timeout=SLOW)
        await expect(page.locator("body")).to_contain_text("forbidden")
        await shot(page, "foreign-page-refused")
    finally:
        await server.close()
    # The playground's own page still works (with its token), and shows no such task.
    await open_as(page, playground, people.REQUESTER)
    thread = await start_task(page, "look up user 43 after the cats")
    answer = thread.locator("#thread-replies .msg", has_text="Answer")
    await expect(answer).to_contain_text("User 43:", timeout=SLOW)
    await expect(page.locator("#messages .msg", has_text=task)).to_have_count(0)
