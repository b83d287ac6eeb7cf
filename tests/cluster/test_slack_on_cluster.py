"""The Slack flow with every process on Redis Cluster: ``web`` and ``worker`` are real
processes given the cluster's URL (nothing else: they detect the cluster by themselves)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests import redis_cluster
from tests.agents import read_journal
from tests.bot.conftest import APPROVER, REQUESTER, SIGNING_SECRET
from tests.core.workers import WorkerProcess, worker_env
from tests.redis_cluster import ClusterServer
from tests.security.webproc import start_web
from tests.slack_fake import FakeSlack, SlackClient

pytestmark = pytest.mark.timeout(120)

cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster


def approve_value(fake: FakeSlack) -> tuple[str, str] | None:
    """(the card's ts, what its Approve button sends), once a card offers it."""
    for m in fake.messages:
        for b in m.blocks:
            for e in b.get("elements", []) if b.get("type") == "actions" else []:
                if e.get("action_id") == cards.APPROVE_ACTION:
                    return m.ts, str(e["value"])
    return None


async def test_the_slack_flow_with_every_process_on_the_cluster(
    clean_cluster: ClusterServer, fake_slack: FakeSlack, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.txt"
    fake_openai.script(
        "delete user 9", [call("delete_user", {"user_id": "9"}), reply("User 9 is deleted.")]
    )
    web = await start_web(
        clean_cluster.url, fake_slack, tmp_path / "web.log", DECISION_REPLICAS="1"
    )
    env = worker_env(clean_cluster.url, fake_openai.base_url, journal, DECISION_REPLICAS="1")
    worker = WorkerProcess(env, tmp_path / "worker.log")
    try:
        slack = SlackClient(web.events_url, SIGNING_SECRET, fake=fake_slack)
        assert (await slack.command("delete user 9", user_id=REQUESTER)).status == 200
        card_ts, value = await fake_slack.wait_for(approve_value, timeout=30, what="a card")
        click = await slack.action(
            cards.APPROVE_ACTION, value, user_id=APPROVER, message_ts=card_ts
        )
        assert click.status == 200

        def answered(f: FakeSlack) -> bool:
            return any("User 9 is deleted." in m.text for m in f.messages)

        await fake_slack.wait_for(answered, timeout=30, what="the answer in the thread")
        assert fake_slack.shows(fake_slack.messages[0].channel, card_ts, "Approved")
        assert read_journal(str(journal)) == ["delete_user:9"]
        # Each process found the cluster by itself.
        assert "Redis Cluster" in web.log.read_text()
        assert "Redis Cluster, 16 shards" in (tmp_path / "worker.log").read_text()
    finally:
        web.kill()
        worker.kill()


async def test_app_home_on_the_cluster(
    clean_cluster: ClusterServer, fake_slack: FakeSlack, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """App Home reads every shard's pending gates and the approver's decisions (one key per
    command), and its publish lease lives on its own slot: listing and a Home click work."""
    journal = tmp_path / "journal.txt"
    fake_openai.script(
        "delete user 5", [call("delete_user", {"user_id": "5"}), reply("User 5 is deleted.")]
    )
    web = await start_web(clean_cluster.url, fake_slack, tmp_path / "web.log")
    env = worker_env(clean_cluster.url, fake_openai.base_url, journal)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    try:
        slack = SlackClient(web.events_url, SIGNING_SECRET, fake=fake_slack)
        opened = {"type": "app_home_opened", "user": APPROVER, "tab": "home", "channel": "D0A"}
        assert (await slack.event(opened)).status == 200
        assert (await slack.command("delete user 5", user_id=REQUESTER)).status == 200

        async def home_with(needle: str) -> dict[str, Any]:
            async def shown() -> dict[str, Any] | None:
                view = await fake_slack.store.home(APPROVER)
                return view if view and needle in json.dumps(view, ensure_ascii=False) else None

            loop = asyncio.get_running_loop()
            end = loop.time() + 30
            while (view := await shown()) is None:
                assert loop.time() < end, f"Home never showed {needle!r}"
                await asyncio.sleep(0.05)
            return view

        view = await home_with("delete_user")
        (value,) = [
            e["value"]
            for b in view["blocks"]
            if b["type"] == "actions"
            for e in b["elements"]
            if e["action_id"] == cards.APPROVE_ACTION
        ]
        payload = slack.action_payload(cards.APPROVE_ACTION, value, user_id=APPROVER)
        for key in ("channel", "message", "response_url"):
            payload.pop(key)
        payload["container"] = {"type": "view", "view_id": view["id"]}
        payload["view"] = view
        assert (await slack.payload(payload)).status == 200
        await home_with("✅ Approved")

        def answered(f: FakeSlack) -> bool:
            return any("User 5 is deleted." in m.text for m in f.messages)

        await fake_slack.wait_for(answered, timeout=30, what="the answer in the thread")
        assert read_journal(str(journal)) == ["delete_user:5"]
    finally:
        web.kill()
        worker.kill()
