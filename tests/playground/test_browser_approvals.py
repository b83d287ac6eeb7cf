"""The approval features in a real browser (Debian's Chromium, driven by Playwright): two
approvers switching users, an approval channel, Edit & approve, Approve & allow. Apart from
tests/playground/test_browser.py so that the two test processes share the browser tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from playground import people
from tests.playground.conftest import BROWSER_LOOP, shot, start_playground
from tests.playground.test_browser import SLOW, card, open_as, send, start_task, switch
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.timeout(120), BROWSER_LOOP]


async def test_a_two_person_approval_switching_users(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    # The quorum agent: its wire tool needs two distinct approvers (approvals=2).
    pg = start_playground(
        redis_server.url,
        tmp_path,
        AGENT="tests.agents:quorum",
        PLAYGROUND_MODEL="tests.agents:quorum_model",
    )
    try:
        await open_as(page, pg, people.REQUESTER)
        thread = await start_task(page, "wire 500")
        gate = card(thread, "wire").first
        await expect(gate).to_contain_text("0 of 2 approvals", timeout=SLOW)
        await gate.get_by_role("button", name="Approve").click()
        await expect(page.locator("body")).to_contain_text("You asked for this run", timeout=SLOW)

        await switch(page, people.APPROVER)
        gate = card(page.locator("#thread"), "wire").first
        await gate.get_by_role("button", name="Approve").click()
        await expect(gate).to_contain_text("1 of 2 approvals: @Avery", timeout=SLOW)
        await expect(page.locator("body")).to_contain_text("Your approval is counted", timeout=SLOW)
        await expect(gate.get_by_role("button", name="Approve")).to_be_visible()
        await gate.get_by_role("button", name="Approve").click()
        await expect(page.locator("body")).to_contain_text(
            "You already approved this request", timeout=SLOW
        )
        await shot(page, "quorum-half-approved")

        await switch(page, people.ON_CALL)
        gate = card(page.locator("#thread"), "wire").first
        await gate.get_by_role("button", name="Approve").click()
        await expect(gate).to_contain_text("Approved by @Avery and @Sam", timeout=SLOW)
        await expect(gate).to_contain_text("wired 500", timeout=SLOW)
        await expect(gate.get_by_role("button", name="Approve")).to_have_count(0)
        answer = page.locator("#thread-replies .msg", has_text="Answer")
        await expect(answer).to_contain_text("Approved by U0PGAVERY and U0PGSAM.", timeout=SLOW)
        await shot(page, "quorum-approved")
    finally:
        pg.stop()


async def test_an_approval_in_the_approval_channel(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    """A tool routed to #finance-approvals (APPROVAL_ROUTES): its card is there, with a link to
    the task's thread, which holds one line that follows the decision; only @finance decides."""
    routes = json.dumps(
        {"send_email": {"channel": people.FINANCE_CHANNEL_ID, "approvers": people.FINANCE_GROUP}}
    )
    pg = start_playground(redis_server.url, tmp_path, APPROVAL_ROUTES=routes)
    try:
        await open_as(page, pg, people.REQUESTER)
        thread = await start_task(page, "email alan@partner.org about Launch: hello")
        line = thread.locator("#thread-replies .msg", has_text="send_email")
        await expect(line).to_contain_text(
            "waiting for approval in #finance-approvals", timeout=SLOW
        )
        await expect(line.get_by_role("button", name="Approve")).to_have_count(0)

        # Avery is in APPROVERS, not in @finance: the card in the channel refuses them.
        await switch(page, people.APPROVER)
        await page.click(f"#side-channel-{people.FINANCE_CHANNEL_ID}")
        await expect(page.locator("#channel-name")).to_have_text("finance-approvals")
        gate = page.locator("#messages .msg", has_text="Arguments").filter(has_text="send_email")
        await expect(gate).to_be_visible(timeout=SLOW)
        await expect(gate).to_contain_text("Asked in this task's thread")
        await gate.get_by_role("button", name="Approve").click()
        refused = page.locator("#messages .msg.ephemeral")
        await expect(refused).to_contain_text("Only the approvers of send_email", timeout=SLOW)
        await expect(gate).to_contain_text("Waiting for a decision")

        # Sam, of @finance, approves in the channel.
        await switch(page, people.ON_CALL)
        gate = page.locator("#messages .msg", has_text="Arguments").filter(has_text="send_email")
        await expect(gate).to_be_visible(timeout=SLOW)
        await gate.get_by_role("button", name="Approve").click()
        await expect(gate).to_contain_text("Approved by @Sam", timeout=SLOW)
        await shot(page, "approval-channel-card")

        # The card's link opens the task's thread, whose line tells the outcome.
        await gate.get_by_role("link", name="this task's thread").click()
        await expect(page.locator("#channel-name")).to_have_text("general")
        line = page.locator("#thread-replies .msg", has_text="send_email")
        await expect(line).to_contain_text("approved by @Sam in #finance-approvals", timeout=SLOW)
        answer = page.locator("#thread-replies .msg", has_text="Answer")
        await expect(answer).to_be_visible(timeout=SLOW)
        await shot(page, "approval-channel-thread")
    finally:
        pg.stop()


async def test_edit_and_approve_in_the_page(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    # The editing agent: refund_order lets an approver edit amount_cents, reason and notify.
    pg = start_playground(
        redis_server.url,
        tmp_path,
        AGENT="tests.agents:editing",
        PLAYGROUND_MODEL="tests.agents:editing_model",
    )
    try:
        await open_as(page, pg, people.REQUESTER)
        thread = await start_task(page, "refund A-7")
        gate = card(thread, "refund_order").first
        await expect(gate.get_by_role("button", name="Edit & approve")).to_be_visible(timeout=SLOW)
        await gate.get_by_role("button", name="Edit & approve").click()
        await expect(page.locator("body")).to_contain_text("You asked for this run", timeout=SLOW)
        await expect(page.locator(".modal[role=dialog]")).to_have_count(0)

        await switch(page, people.APPROVER)
        gate = card(page.locator("#thread"), "refund_order").first
        await gate.get_by_role("button", name="Edit & approve").click()
        modal = page.locator(".modal[role=dialog]")
        await expect(modal).to_be_visible(timeout=SLOW)
        await expect(modal.locator(".modal-title")).to_have_text("Edit & approve")
        amount = modal.locator("[data-block-id='arg:amount_cents'] input")
        await expect(amount).to_have_value("4900")
        await expect(
            modal.locator("[data-block-id='arg:notify'] input[type=checkbox]")
        ).to_be_checked()
        # Slack's own check: a whole number.
        await amount.fill("25.5")
        await modal.locator(".modal-submit").click()
        await expect(modal).to_contain_text("Please enter a whole number.")
        # The bot's check (the tool's schema): the error on the field, the modal stays open.
        await amount.fill("2500")
        await modal.locator("[data-block-id='arg:tags'] textarea").fill('"urgent"')
        await modal.locator(".modal-submit").click()
        await expect(modal.locator(".blk-input[data-block-id='arg:tags']")).to_contain_text(
            "must be array or null", timeout=SLOW
        )
        await modal.locator("[data-block-id='arg:tags'] textarea").fill('["urgent"]')
        await modal.locator("[data-block-id='arg:reason'] select").select_option(label="late")
        await shot(page, "edit-modal")
        await modal.locator(".modal-submit").click()
        await expect(modal).to_have_count(0, timeout=SLOW)
        await expect(gate).to_contain_text("Edited", timeout=SLOW)
        await expect(gate).to_contain_text("amount_cents: 4900 → 2500")
        await expect(gate).to_contain_text("refunded 2500 on A-7 (late)", timeout=SLOW)
        await expect(gate.get_by_role("button", name="Edit & approve")).to_have_count(0)
        answer = page.locator("#thread-replies .msg", has_text="Answer")
        await expect(answer).to_contain_text(
            'Approved by U0PGAVERY with edited arguments: {"amount_cents":2500', timeout=SLOW
        )
        await expect(answer).to_contain_text('the original request was {"amount_cents":4900')
        await shot(page, "edit-approved")
    finally:
        pg.stop()


async def test_approve_and_allow_in_the_thread(
    page: Page, redis_server: RedisServer, tmp_path: Path
) -> None:
    # The shipping agent: its ship tool allows grants for 1 h (allow_for=3600).
    pg = start_playground(
        redis_server.url,
        tmp_path,
        AGENT="tests.agents:shipping",
        PLAYGROUND_MODEL="tests.agents:shipping_model",
    )
    try:
        await open_as(page, pg, people.REQUESTER)
        thread = await start_task(page, "ship 1")
        gate = card(thread, "ship").first
        await expect(gate).to_contain_text("Waiting for a decision", timeout=SLOW)
        allow = "Approve & allow ship in this thread for 1 h"
        # The requester cannot allow their own run's calls.
        await gate.get_by_role("button", name=allow).click()
        await expect(page.locator("body")).to_contain_text("You asked for this run", timeout=SLOW)

        await switch(page, people.APPROVER)
        gate = card(page.locator("#thread"), "ship").first
        await gate.get_by_role("button", name=allow).click()
        modal = page.locator(".modal[role=dialog]")
        await expect(modal).to_be_visible(timeout=SLOW)
        await expect(modal.locator(".modal-title")).to_have_text("Approve & allow")
        await modal.locator("select").select_option(label='only env="staging"')
        await shot(page, "grant-modal")
        await modal.locator(".modal-submit").click()
        await expect(modal).to_have_count(0, timeout=SLOW)
        await expect(gate).to_contain_text("and allowed", timeout=SLOW)
        await expect(gate).to_contain_text("shipped 1 to staging", timeout=SLOW)

        # The requester asks again in the thread: the grant decides, nobody is asked.
        await switch(page, people.REQUESTER)
        await send(page, "now ship 2", composer="#thread-composer")
        second = card(page.locator("#thread"), "ship").filter(has_text='"version": 2')
        await expect(second).to_contain_text("Allowed by @Avery's grant until", timeout=SLOW)
        await expect(second).to_contain_text("shipped 2 to staging", timeout=SLOW)
        await expect(second.get_by_role("button")).to_have_count(0)
        answer = page.locator("#thread-replies .msg", has_text="Approved by U0PGAVERY's grant")
        await expect(answer).to_contain_text("in this thread until", timeout=SLOW)
        await shot(page, "grant-decided")
    finally:
        pg.stop()
