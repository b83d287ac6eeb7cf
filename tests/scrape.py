"""Reading ``GET /metrics`` as Prometheus does: over HTTP, parsed by prometheus_client."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class Samples:
    """One scrape: every sample by name and labels."""

    values: dict[Key, float]
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> Samples:
        values: dict[Key, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                values[(s.name, frozenset(s.labels.items()))] = s.value
        return cls(values, text)

    def get(self, name: str, **labels: str) -> float:
        """The sample's value; 0 when absent (a counter not incremented yet)."""
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def has(self, name: str, **labels: str) -> bool:
        return (name, frozenset(labels.items())) in self.values

    def since(self, before: Samples, name: str, **labels: str) -> float:
        """How much the sample grew since ``before`` (counters are process-wide)."""
        return self.get(name, **labels) - before.get(name, **labels)

    def grown(self, before: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every series of ``name`` that grew since ``before``, by its labels."""
        return {
            labels: value - before.values.get((n, labels), 0.0)
            for (n, labels), value in self.values.items()
            if n == name and value != before.values.get((n, labels), 0.0)
        }


async def scrape(url: str) -> Samples:
    """``GET url`` (a /metrics endpoint), checked to be Prometheus' text format."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
        return Samples.parse(await resp.text())
