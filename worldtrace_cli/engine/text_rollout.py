"""Text-to-video in the one chunk loop: Self-Forcing / LongLive v1.0 (selfforcing-architecture.md §7).

:class:`TextRollout` is the ``t2v`` backbone's hooks for
:class:`~worldtrace_cli.engine.rollout.ChunkRollout`: chunks of 3 latent frames, the text context as the
only conditioning (no image channels, no camera), the Self-Forcing sampler
(:class:`~worldtrace_cli.model.selfforcing.sampler.SelfForcingSchedule`: x0 = x - sigma v, re-noised with
fresh Gaussian draws). The DiT is :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` built with
``model_type: t2v``; any cache writer serves it through the cache contract (keys stored canonically,
rotated at read time), the official caches included (global = ``full``, window + sink = ``sink``).
"""

from __future__ import annotations

import torch

from dataclasses import dataclass

from ..memory import CacheWriter
from ..model.lingbot.dit import LingbotChunk, LingbotRolloutState
from ..model.lingbot.sampler import add_noise, flow_to_x0
from ..model.selfforcing.sampler import SelfForcingSchedule
from .rollout import ChunkRollout

FRAMES_PER_CHUNK = 3  # num_frame_per_block of every released Self-Forcing / LongLive v1.0 config


@dataclass
class TextRolloutState(LingbotRolloutState):
    """The text K/V of every layer (recomputed after a resume) and ``history``: the clean latents of the
    last ``recache_window`` latent frames [1, C, n, h, w] float32 (what a prompt-switch re-cache
    recomputes; saved for a resume)."""

    history: torch.Tensor | None = None

    def state_dict(self) -> dict:
        """``{"history": tensor}`` once a chunk was made, else ``{}``."""
        return {} if self.history is None else {"history": self.history}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the text K/V are recomputed on the next call."""
        self.cross_kv, self.history = None, state.get("history")


class TextRollout(ChunkRollout):
    """A ``t2v`` DiT in the chunk loop.

    Args:
        dit: a :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` with ``model_type: t2v``, on ``device``.
        writer: the self-attention cache writer (reset here).
        text_context: umT5 rows [L, 4096] float32 (L <= 512; zero-padded to 512 by the DiT), or one
            such tensor per chunk (a prompt-segment trajectory: chunk c reads entry c, the last one
            past the list's end). A prompt switch changes the rows chunks read from then on and, as
            ``switch`` says, re-caches the window (:mod:`~worldtrace_cli.engine.recache`).
        seed: noise seed (chunk c draws from ``chunk_generator(seed, c)`` on the CPU).
        device: where the DiT runs; latent_hw: (lh, lw); frames_per_chunk: F (3).
        trained_offset: the largest query-key offset the model was trained on, in latent frames
            (Self-Forcing: 20, its 21-frame global cache; records compare slot offsets with it).
        schedule: :class:`SelfForcingSchedule` (shift 5).
        noise: optional ``noise(chunk, draw, shape)`` replacing the seeded draws (fixture replay).
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising call's x0.
        switch: what a prompt switch does to the cache (:data:`~worldtrace_cli.engine.recache.SWITCH_MODES`):
            ``recache`` LongLive's official re-cache (default), ``recache-keep-sink`` the fixed one,
            ``plain`` none. A writer that holds no verbatim frames is not re-cached (recorded).
        recache_window: W, the latent frames a re-cache recomputes (LongLive: its window, 12);
            default ``trained_offset + 1``.
    """

    def __init__(self, dit, writer: CacheWriter, text_context: torch.Tensor, seed: int, device: torch.device,
                 latent_hw: tuple[int, int], frames_per_chunk: int = FRAMES_PER_CHUNK, trained_offset: int = 20,
                 schedule: SelfForcingSchedule = SelfForcingSchedule(), noise=None, on_step=None,
                 switch: str = "recache", recache_window: int | None = None):
        if dit.cfg.has_camera:
            raise ValueError("TextRollout runs a t2v DiT (model_type t2v); LingBot-World runs in LingbotRollout")
        if not isinstance(text_context, torch.Tensor) and not len(text_context):
            raise ValueError("TextRollout: no text context (one [L, 4096] tensor, or one per chunk)")
        self.text_context, self._rows = text_context, None  # _rows: the rows the state's cross K/V were made from
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        from .recache import SWITCH_MODES

        if switch not in SWITCH_MODES:
            raise ValueError(f"switch must be one of {', '.join(SWITCH_MODES)}, got {switch!r}")
        self.switch, self.recache_window = switch, recache_window or trained_offset + 1
        self._setup(dit, writer, seed, device, latent_hw, frames_per_chunk, trained_offset,
                    dit.patch_embedding.weight.dtype, len(self.timesteps), noise, on_step)
        self.state = TextRolloutState()

    def prompt_rows(self, chunk: int) -> torch.Tensor:
        """The text rows chunk ``chunk`` is conditioned on: [L, 4096] float32."""
        if isinstance(self.text_context, torch.Tensor):
            return self.text_context
        return self.text_context[min(chunk, len(self.text_context) - 1)]

    def prepare_chunk(self, chunk: int, frame_start: int, timer) -> list[dict]:
        """At a prompt switch (this chunk's prompt rows are not the previous chunk's), re-cache the
        window under the new prompt (:func:`~worldtrace_cli.engine.recache.recache`) unless ``plain``."""
        from .recache import can_recache, recache

        rows, before = self.prompt_rows(chunk), self.prompt_rows(max(chunk - 1, 0))
        if chunk == 0 or rows is before or (rows.shape == before.shape and torch.equal(rows, before)):
            return []
        if self.switch == "plain" or self.state.history is None:
            return [{"type": "prompt_switch", "recache": False}]
        if not can_recache(self.writer):
            return [{"type": "prompt_switch", "recache": False,
                     "reason": f"{self.writer.name} cannot rewrite its frames (CacheWriter.rewrite)"}]
        with timer.phase("context"):  # the re-cache is a context pass over the window
            event = recache(self, frame_start, rows, self.switch)
        self._rows = rows
        return [event]

    def finish_chunk(self, x0: torch.Tensor) -> None:
        """Keep the last ``recache_window`` clean latent frames (``state.history``)."""
        if self.switch == "plain":
            return
        # cat makes a new tensor each chunk; the view of its last W frames keeps at most W + F alive
        hist = x0.clone() if self.state.history is None else torch.cat([self.state.history, x0], dim=2)
        self.state.history = hist[:, :, -self.recache_window:]

    def chunk_inputs(self, read, frame_start: int, frames: int):
        rows = self.prompt_rows(self.chunk)
        if rows is not self._rows:  # a prompt switch: the DiT re-projects the text K/V of every block
            self.state.cross_kv, self._rows = None, rows
        inputs = LingbotChunk(rollout=self.state, past=read.past, text_context=rows,
                              temporal_freq_scale=read.freq_scale)
        return inputs, None

    def flow(self, x, step, inputs, cond):
        return self._dit(x, self.timesteps[step], cond, inputs)

    def to_x0(self, x, flow, step):
        return flow_to_x0(x, flow, self.sigmas[step])

    def renoise(self, x0, flow, step, draw):
        return add_noise(x0, draw().to(self.device), self.sigmas[step + 1])

    def context(self, x0, inputs, cond):
        _, committed = self._dit(x0, 0.0, cond, inputs, commit=True)
        return committed


__all__ = ["FRAMES_PER_CHUNK", "TextRollout"]
