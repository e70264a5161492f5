"""Deterministic JSON for the fixtures of `scripts/smollm2_reference.py`, and the library versions
recorded in them.

Every fixture is written with sorted keys, a one-space indent and lists of scalars on one line, so
that regenerating it with the same libraries gives the same bytes and a change reads as a small
diff. A module the script imports, not a script.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "crates" / "server" / "tests" / "fixtures"


def sorted_keys(value):
    """A copy with every dict's keys in sorted order.

    The fixture files are written with sorted keys, so the inputs are rendered in that same order:
    `tojson` then prints keys exactly as a reader of the fixture sees them.
    """
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def dumps(value, indent: int = 0) -> str:
    """Deterministic JSON: sorted keys, 1-space indent, lists of scalars on one line, UTF-8."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f'{pad} {json.dumps(k, ensure_ascii=False)}: {dumps(value[k], indent + 1)}' for k in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            return "[" + ", ".join(dumps(v) for v in value) + "]"
        items = [f"{pad} {dumps(v, indent + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value}")
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False)


def write_json(path: Path, value) -> None:
    text = dumps(value) + "\n"
    json.loads(text)  # sanity check
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.relative_to(REPO)} ({len(text.encode('utf-8'))} bytes)", file=sys.stderr)


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ["transformers", "torch", "gguf", "tokenizers", "jinja2", "accelerate", "numpy"]:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out
