"""The tests' Slack: the playground's Web API in memory with faults and a record
(:class:`FakeSlack`), and a client that sends the bot what Slack sends (:class:`SlackClient`).

Nothing here ships: the Web API itself is the playground's (:mod:`playground.slack_api`).
"""

from playground.state import Message as SlackMessage
from playground.wire import MAX_BLOCKS_CHARS, blocks_problem, sign

from .client import HttpResult, SlackClient
from .fake import FakeSlack, SlackCall
from .memory import FakeFile, MemoryStore

__all__ = [
    "MAX_BLOCKS_CHARS",
    "FakeFile",
    "FakeSlack",
    "HttpResult",
    "MemoryStore",
    "SlackCall",
    "SlackClient",
    "SlackMessage",
    "blocks_problem",
    "sign",
]
