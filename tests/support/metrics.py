"""Reading Prometheus text: samples and one sample's value."""
from __future__ import annotations

import re


_SAMPLE = re.compile(r"\A([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\Z")


_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict, float]]:
    """Parse Prometheus text format into (name, labels, value)."""
    out = []
    for raw in text.splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        match = _SAMPLE.match(raw.strip())
        assert match, f"not a Prometheus sample line: {raw!r}"
        name, labels, value = match.groups()
        out.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def value(parsed, name: str, **labels) -> float | None:
    found = [v for n, lab, v in parsed if n == name and all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None
