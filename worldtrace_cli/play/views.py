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
    ``frames`` (source latent frames, the first 8), ``n`` (how many), ``mean`` (their mean), ``vpos``
    (virtual position), ``share`` (its share of the chunk's attention, None without attention stats)
    and ``still`` (the source latent frame the page shows for it: the one nearest the mean)."""
    from ..outputs.records import expand_slot_records

    out = []
    for s in expand_slot_records(record["cache"]["slots"]):
        frames = s["frames"]
        mean = sum(frames) / len(frames) if frames else None
        out.append({"role": s["role"], "kind": s["kind"], "frames": frames[:8], "n": len(frames), "mean": mean,
                    "vpos": s["virtual_position"], "share": s.get("attention"),
                    "still": None if mean is None else min(frames, key=lambda f: abs(f - mean))})
    return out


def self_share(record: dict) -> float | None:
    """The chunk's share of attention on itself (``--attention-stats``), None without stats."""
    attention = record["cache"].get("attention")
    return None if attention is None else attention["self"]


def frame_index(chunk: int, latent_frame: int, frames_per_chunk: int) -> int:
    """Index, in chunk ``chunk``'s decoded frames, of the last pixel frame latent frame ``latent_frame``
    (one of the chunk's) decodes to (:func:`~worldtrace_cli.outputs.records.latent_pixel_frames`)."""
    from ..outputs.records import latent_pixel_frames
    from ..trajectory.actions import chunk_rows

    return latent_pixel_frames(latent_frame)[-1] - chunk_rows(chunk, frames_per_chunk)[0]


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


__all__ = ["event_view", "frame_index", "jpeg_b64", "one_line", "self_share", "slot_view"]
