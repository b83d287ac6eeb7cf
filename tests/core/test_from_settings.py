"""``Gateway.from_settings``: the gateway a program builds is configured as the workers are."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from agent_core import ConfigError, Gateway, Settings
from tests.redis_server import free_port


async def test_from_settings_reads_what_the_worker_reads(redis_url: str, redis: Redis) -> None:
    settings = Settings(REDIS_URL=redis_url, KEY_PREFIX="acme", SHARDS=4, DECISION_REPLICAS=1)
    gw = await Gateway.from_settings(settings, agent_name="ops")
    try:
        assert (gw.keys.prefix, gw.keys.shards, gw.agent_name) == ("acme", 4, "ops")
        # DECISION_REPLICAS is not dropped: decisions wait for a replica (WAIT).
        assert gw.decision_replicas == 1
        run = await gw.start_run("look up user 42", requested_by="U1")
        assert gw.keys.owns(run.run_id)
        assert await redis.keys("*acme*")  # the run went under KEY_PREFIX
        assert not await redis.keys("*agw*")
    finally:
        await gw.aclose()
    # The client it made is closed; the data stays.
    assert await redis.keys("*acme*")


async def test_unreachable_redis_is_one_line_naming_redis_url() -> None:
    settings = Settings(REDIS_URL=f"redis://:secret-pw@127.0.0.1:{free_port()}/0")
    with pytest.raises(ConfigError) as err:
        await Gateway.from_settings(settings)
    assert str(err.value).startswith("REDIS_URL: cannot reach Redis at redis://:***@127.0.0.1")
    assert "secret-pw" not in str(err.value)


async def test_a_client_passed_in_stays_open(redis: Redis) -> None:
    async with Gateway(redis) as gw:
        assert gw.decision_replicas == 0
    assert await redis.ping()  # its owner closes it
