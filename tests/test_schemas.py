"""The output schemas: valid JSON Schemas, one type per field, and strict where scripts rely on them.
Every output is validated against its schema where the tests produce it (test_cli, test_compare,
test_loopbench_run, test_resume, test_loopworld)."""

import jsonschema
import pytest
import torch

from worldtrace_cli.memory.base import Slot
from worldtrace_cli.outputs.records import expand_slot_records, frame_ranges, slot_records
from worldtrace_cli.schemas import NAMES, load_schema


@pytest.mark.parametrize("name", NAMES)
def test_schemas_are_valid_and_versioned(name):
    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema_version"]["const"] == 1 and "schema_version" in schema["required"]

    def types(node, path):  # one JSON type per field, plus null where a value can be missing
        if isinstance(node, dict):
            t = node.get("type")
            if isinstance(t, list):
                assert len(t) == 2 and "null" in t or path.endswith("keyframes"), (name, path, t)
            for k, v in node.items():
                types(v, f"{path}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                types(v, f"{path}/{i}")
    types(schema, "")


def record(slots):
    return {"schema_version": 1, "chunk": 3, "latent_frames": [9, 12], "pixel_frames": [33, 45],
            "cache": {"writer": "x", "positions": "actual", "slots": slots, "trained_offset": 5, "slot_count": 1,
                      "max_offset": 8.0, "kv_bytes": 0, "host_bytes": 0, "events": []},
            "timings_s": {"denoise": 1.0}, "memory": {"rss_bytes": 1}, "latents": {"mean": 0.0, "std": 1.0},
            "frames_sha256": "0" * 64}


def test_slot_runs_are_linear_and_round_trip():
    """A full cache of n verbatim frames is one record entry (chunks.jsonl grows linearly); averaged
    and non-contiguous slots keep their frames as ranges; the expansion restores every slot."""
    n = 600
    slots = [Slot("past", (f,), "recent") for f in range(n)]
    runs = slot_records(slots, [float(f - n) for f in range(n)], n, [8] * n, [10] * n)
    assert len(runs) == 1 and runs[0]["count"] == n and runs[0]["frames"] == [[0, n - 1]]
    assert runs[0]["bytes"] == 10 * n and runs[0]["max_offset"] == 2 + n
    mixed = [Slot("field", (0, 1, 2, 5), "summary"), Slot("landmark", (7,), "summary"), Slot("landmark", (8,), "summary"),
             Slot("ema", (3,), "summary", time=2.5), Slot("recent", (9,), "recent"), Slot("recent", (11,), "recent")]
    positions = [-6.0, -5.0, -4.0, -3.0, -2.0, -1.0]
    runs = slot_records(mixed, positions, 12, [8] * 6, [1] * 6)
    assert [r["count"] for r in runs] == [1, 2, 1, 1, 1]  # 7, 8 merge; 9, 11 are not consecutive
    compressed = slot_records(mixed[1:3], positions[1:3], 12, [8, 3], [1, 1])  # fewer tokens: its own run
    assert [r["count"] for r in compressed] == [1, 1] and [r["tokens"] for r in compressed] == [8, 3]
    assert runs[0]["frames"] == [[0, 2], [5, 5]] and frame_ranges([4, 3]) == [[4, 4], [3, 3]]
    flat = expand_slot_records(runs)
    assert [s["frames"] for s in flat] == [list(s.frames) for s in mixed]
    assert [s["offset"] for s in flat] == positions and [s["role"] for s in flat] == [s.role for s in mixed]
    validator = jsonschema.Draft202012Validator(load_schema("chunk-record"))
    validator.validate(record(runs))


def test_chunk_schema_rejects_the_old_layouts():
    validator = jsonschema.Draft202012Validator(load_schema("chunk-record"))
    run = slot_records([Slot("past", (4,), "recent")], torch.tensor([-1.0]).tolist(), 5, [8], [8])[0]
    validator.validate(record([run]))
    for bad in ({**run, "frames": [4]}, {**run, "frames": {"first": 0, "last": 9, "count": 10}}, {**run, "offset": -1.0},
                {**run, "role": "field"}):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(record([bad]))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({k: v for k, v in record([run]).items() if k != "schema_version"})
