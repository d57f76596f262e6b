"""What the page is sent: frames as JPEG, a chunk record's slots and events as the page draws them,
an exception as one line."""

from __future__ import annotations

import base64
import io

JPEG_QUALITY = 85


def jpeg_b64(frames) -> list[str]:
    """uint8 [T, H, W, 3] frames as base64 JPEG strings (Pillow)."""
    from PIL import Image

    out = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
        out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def slot_view(record: dict) -> list[dict]:
    """A chunk record's slots as the page draws them: one dict per slot with ``role``, ``kind``,
    ``frames`` (source latent frames), ``mean`` (their mean) and ``vpos`` (virtual position)."""
    from ..outputs.records import expand_slot_records

    return [{"role": s["role"], "kind": s["kind"], "frames": s["frames"][:8], "n": len(s["frames"]),
             "mean": sum(s["frames"]) / len(s["frames"]) if s["frames"] else None, "vpos": s["virtual_position"]}
            for s in expand_slot_records(record["cache"]["slots"])]


def event_view(record: dict) -> list[dict]:
    """The events worth showing live: landmarks stored and retrievals (with what they picked)."""
    out = []
    for e in record["cache"].get("events") or []:
        if e.get("type") == "landmark_test" and e.get("landmark"):
            out.append({"type": "landmark", "frame": e["frame"]})
        elif e.get("type") == "retrieval" and e.get("retrieved"):
            out.append({"type": "retrieval", "picked": [p.get("frames", p) for p in e["retrieved"]][:6]})
    return out


def one_line(exc: BaseException) -> str:
    """An exception as one short line: ``Type: message`` (whitespace folded, 300 characters)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


__all__ = ["event_view", "jpeg_b64", "one_line", "slot_view"]
