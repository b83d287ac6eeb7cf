"""A local Slack playground: the gateway's real bot and worker, without a Slack workspace.

``python -m playground`` (what ``make run`` starts when ``SLACK_BOT_TOKEN`` is unset) serves,
on 127.0.0.1 only:

- the Slack Web API methods the bot calls, at ``/api/`` (the bot's ``SLACK_API_URL``), and
  the ``response_url`` endpoints, in Slack's wire format, with Block Kit validated the way
  Slack does (``invalid_blocks``);
- a page in the browser: a channel with threads, every Block Kit element the bot sends,
  modals, ephemeral messages, live updates, and a user switcher;
- signed requests to the bot's ``/slack/events``, exactly as Slack sends them.

It then starts the ``web`` and ``worker`` processes, unchanged, pointed at itself. With no
``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``, a scripted model answers for the example agent.
Its conversation lives in the same Redis, so a restart shows the history.
"""
