"""Prompt segments: the trajectory of a text-to-video preset (mode ``text``, Self-Forcing / LongLive).

A text trajectory is a list of prompt segments with their lengths in chunks::

    mode: text
    prompt: a red lighthouse on a cliff     # optional: the prompt of segments without their own
    segments:
      - {prompt: a red lighthouse on a cliff, chunks: 200, label: A}
      - {prompt: the lighthouse at night, chunks: 200, label: B}

Lengths are whole chunks (3 latent frames, 12 pixel frames; the first 9): a prompt switch happens at
a chunk boundary, as in LongLive's interactive inference (selfforcing-architecture.md §10). A segment
without ``prompt`` takes the top-level ``prompt``, which ``--prompt`` replaces; ``prompt`` and
``action``/``keys``/``mouse`` never mix. Parsed by :func:`parse_prompt_segment` from
:mod:`worldtrace_cli.trajectory`'s parser (torch-free).
"""

from __future__ import annotations

from .actions import CHUNK_FRAMES, MAX_CHUNKS, Segment

# what a prompt switch does to the cache (worldtrace_cli.engine.recache): LongLive's official K/V re-cache,
# the same keeping the sink on an early switch, or none (Self-Forcing's)
SWITCH_MODES = ("recache", "recache-keep-sink", "plain")
MAX_PROMPT_CHARS = 10_000  # far past the encoder's 512 tokens (longer prompts are truncated with a warning)
PROMPT_SEGMENT_KEYS = ("label", "prompt", "chunks")
_NOT_HERE = ("action", "keys", "mouse", "frames")  # action-segment keys: refused with a hint


def check_prompt(text: str, where: str) -> str:
    """A prompt stripped of surrounding whitespace; ``where`` names it in the error.

    Raises:
        ValueError: empty (or only whitespace), or longer than :data:`MAX_PROMPT_CHARS` characters.
    """
    text = text.strip()
    if not text:
        raise ValueError(f"{where}: empty prompt (give the scene in words)")
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"{where}: prompt of {len(text)} characters; at most {MAX_PROMPT_CHARS} (the encoder reads "
                         f"512 tokens)")
    return text


def prompt_label(prompt: str | None, width: int = 40) -> str:
    """A prompt shortened for records and progress (``chunk_actions``): its first ``width`` characters."""
    if prompt is None:
        return "prompt"
    return prompt if len(prompt) <= width else prompt[:width - 1] + "…"


def parse_prompt_segment(p, node, field: str, start_row: int, parse_label) -> Segment:
    """One ``mode: text`` segment (``p``: the trajectory parser; ``parse_label(p, node, field)``: the
    parser's label check).

    Returns a :class:`Segment` with ``prompt`` (None: the top-level prompt applies), no keyboard or
    mouse, ``num_frames`` = 12 chunks (9 fewer rows for the first chunk of the run), or a label-only
    marker (0 rows). Raises TrajectoryError (``file:line: field: problem``): an action/keys/mouse key,
    ``frames`` instead of ``chunks``, an empty prompt, chunks outside [1, 100000].
    """
    f = p.mapping(node, field, PROMPT_SEGMENT_KEYS + _NOT_HERE)
    for key in f:
        if key in _NOT_HERE:
            hint = (" (a text trajectory holds prompts, not actions)" if key in ("action", "keys", "mouse") else
                    " (prompt segments are whole chunks: use chunks)" if key == "frames" else "")
            raise p.error(f[key], f"{field}.{key}", f"not a prompt-segment key{hint}; valid: {', '.join(PROMPT_SEGMENT_KEYS)}")
    line = node.start_mark.line + 1
    label = parse_label(p, f["label"], f"{field}.label") if "label" in f else None
    prompt = None
    if "prompt" in f:
        try:
            prompt = check_prompt(p.string(f["prompt"], f"{field}.prompt"), f"{field}.prompt")
        except ValueError as exc:
            raise p.error(f["prompt"], f"{field}.prompt", str(exc).split(": ", 1)[1]) from None
    if "chunks" not in f:
        if "prompt" in f or label is None:
            raise p.error(node, field, "needs a length: chunks")
        return Segment("", (), None, 0, label, line)
    chunks = p.integer(f["chunks"], f"{field}.chunks", 1, MAX_CHUNKS)
    num_frames = CHUNK_FRAMES * chunks - (3 if start_row == 0 else 0)
    return Segment(prompt_label(prompt), (), None, num_frames, label, line, prompt)


__all__ = ["MAX_PROMPT_CHARS", "SWITCH_MODES", "PROMPT_SEGMENT_KEYS", "check_prompt", "parse_prompt_segment", "prompt_label"]
