"""Reading a registry the way Prometheus does: over HTTP, parsed back into families."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def fetch(url: str, *, accept: str | None = None, timeout: float = 5) -> tuple[str, str]:
    """GET ``url``; returns (content type, body)."""
    headers = {"Accept": accept} if accept else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.headers["Content-Type"], response.read().decode()


def samples(text: str) -> list[Sample]:
    """Every sample of a classic-text exposition."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample ``name{labels}`` (labels matched as a subset), or None."""
    for sample in samples(text):
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None
