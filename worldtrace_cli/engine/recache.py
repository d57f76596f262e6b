"""LongLive's prompt-switch K/V re-cache through the cache contract (selfforcing-architecture.md §10.3).

At a prompt switch LongLive recomputes the keys and values of its window under the new prompt: one DiT
call at timestep 0 on the clean latents of the last ``W`` latent frames (``W`` = the window, fewer at the
start), bidirectional among themselves, reading the sink (old prompt) as past. Frames whose slots the
sink protects only query; the K/V of the later frames replace the cache's. Written for any writer:

* the call covers frames ``r0 .. start - 1``, ``r0 = start - min(W, start)``;
* **official** (``recache``): with ``r0 > 0`` the call reads the slots the writer holds before
  ``r0`` (LongLive: the sink, the old prompt's; a global cache: every older frame; summaries:
  averages, landmarks) and its first ``N_s`` frames only query (``N_s`` = the writer's summary
  slots: LongLive's 3 sink slots); the recent slots among the later frames are rewritten. With
  ``r0 = 0`` (a switch within the first window: LongLive's early-switch surprise, §11.5) nothing is
  read, every frame attends, and the sink frames are rewritten too;
* ``recache-keep-sink`` (the fixed behaviour): as official, but an early switch starts the call after
  the first ``N_s`` frames and reads them: the sink always holds the first prompt (a switch before
  the sink is complete re-caches nothing);
* ``plain``: no re-cache (Self-Forcing's behaviour: new chunks read the new prompt, the cache keeps the
  old one's K/V).
"""

from __future__ import annotations

import torch

from ..memory import CacheWriter
from ..model.chunk import LayerPast
from ..trajectory.prompts import SWITCH_MODES


def past_before(writer: CacheWriter, num_layers: int, before: int) -> list[LayerPast]:
    """Every layer's :class:`LayerPast` of the slots the writer holds whose frames all precede latent
    frame ``before`` (LongLive: its sink; Self-Forcing's global cache: every older frame), positioned
    by the writer's scheme among themselves and the call's frames (as a chunk at ``before`` would read
    them without the slots the call replaces). Call ``writer.begin_chunk(before)`` first.

    Raises:
        ValueError: a writer whose slots differ in size (store-time compressed chunks).
    """
    from ..memory import SCHEMES

    slots = writer.slots()
    keep = [i for i, s in enumerate(slots) if max(s.frames) < before]
    positions = SCHEMES[writer.positions_scheme]([slots[i] for i in keep], before, writer.geometry)
    t = writer.geometry.tokens_per_frame
    rows = torch.tensor([i * t + j for i in keep for j in range(t)], dtype=torch.int64)
    out = []
    for layer in range(num_layers):
        if writer.token_counts(layer) is not None:
            raise ValueError(f"--cache {writer.name}: slots of differing sizes cannot be re-cached")
        k, v, _ = writer.read(layer)
        rows_d = rows.to(k.device)
        out.append(LayerPast(k[:, rows_d], v[:, rows_d], positions))
    return out


def can_recache(writer: CacheWriter) -> bool:
    """True when the writer rewrites verbatim frames (:meth:`~worldtrace_cli.memory.base.CacheWriter.rewrite`)."""
    return type(writer).rewrite is not CacheWriter.rewrite


def recache(rollout, start: int, rows: torch.Tensor, mode: str) -> dict:
    """Re-cache ``rollout``'s writer before the chunk starting at latent frame ``start`` under the new
    prompt's text ``rows`` [L, 4096]; returns the event for the chunk's record
    (``{"type": "prompt_recache", "frames": [r0, start], "query_only", "rewritten", "sink_rewritten"}``).

    ``rollout``: a :class:`~worldtrace_cli.engine.text_rollout.TextRollout`, through its public parts only:
    ``writer``, ``geometry``, ``recache_window`` W, ``history`` [1, C, n, h, w] (the last clean latent
    frames) and ``recache_pass`` (the one DiT call).
    """
    writer, history = rollout.writer, rollout.history
    n_summary = getattr(writer, "n_summary", 0)
    n_r = min(rollout.recache_window, start, history.shape[2])
    r0 = start - n_r
    early = r0 == 0
    if early and mode == "recache-keep-sink":
        if start <= n_summary:  # every frame made so far is a sink frame to keep: nothing to re-cache
            return {"type": "prompt_switch", "recache": False, "reason": "the frames so far are the kept sink"}
        r0 = n_summary
    query_only = 0 if early else min(n_summary, start - r0 - 1)
    writer.begin_chunk(r0)
    past = past_before(writer, rollout.geometry.num_layers, r0)  # r0 = 0: nothing (LongLive's early switch)
    x0 = history[:, :, history.shape[2] - (start - r0):]
    t = rollout.geometry.tokens_per_frame
    committed = rollout.recache_pass(x0, past, rows, query_only * t)
    kept = [(k[:, query_only * t:], v[:, query_only * t:]) for k, v in committed]
    summary_frames = {f for s in writer.slots() if s.role == "summary" for f in s.frames}
    rewritten = writer.rewrite(kept, list(range(r0 + query_only, start)), summary=early and mode == "recache")
    return {"type": "prompt_recache", "frames": [r0, start], "query_only": query_only, "rewritten": rewritten,
            "sink_rewritten": bool(summary_frames & set(rewritten))}


__all__ = ["SWITCH_MODES", "can_recache", "past_before", "recache"]
