"""JSON Schemas of every JSON file worldtrace writes (docs/outputs.md).

=================  ==================================  =====================================
file               schema                              written by
=================  ==================================  =====================================
chunks.jsonl       ``chunk-record.schema.json``        ``generate`` (one record per line)
summary.json       ``summary.schema.json``             ``generate`` (also partial runs)
metrics.json       ``metrics.schema.json``             ``metrics``
compare.json       ``compare.schema.json``             ``compare``
report.json        ``loopbench-report.schema.json``    ``loopbench report``
=================  ==================================  =====================================

Every object written at the top level of these files carries ``schema_version`` =
:data:`SCHEMA_VERSION`; it is bumped on any incompatible change (a field removed, renamed or of a
new type). Each field has one JSON type (``null`` where a value can be missing). Torch-free; the
validator (``jsonschema``) is only needed to validate, e.g. in the tests.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCHEMA_VERSION = 1
FOLDER = Path(__file__).parent
NAMES = ("chunk-record", "summary", "metrics", "compare", "loopbench-report")


def schema_path(name: str) -> Path:
    """Path of the schema file ``name`` (one of :data:`NAMES`).

    Raises:
        KeyError: an unknown name.
    """
    if name not in NAMES:
        raise KeyError(f"no schema named {name!r}; known: {', '.join(NAMES)}")
    return FOLDER / f"{name}.schema.json"


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    """The parsed JSON Schema (draft 2020-12) ``name``."""
    return json.loads(schema_path(name).read_text(encoding="utf-8"))


def versioned(obj: dict) -> dict:
    """``obj`` with ``schema_version`` as its first key (a new dict)."""
    return {"schema_version": SCHEMA_VERSION, **{k: v for k, v in obj.items() if k != "schema_version"}}


__all__ = ["FOLDER", "NAMES", "SCHEMA_VERSION", "load_schema", "schema_path", "versioned"]
