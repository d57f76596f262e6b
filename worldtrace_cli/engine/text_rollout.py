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
from .feed import ChunkRequest
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
        text_context: umT5 rows [L, 4096] float32 (L <= 512; zero-padded to 512 by the DiT) of every
            chunk, or one such tensor per chunk of a whole run with ``prompts`` (a prompt-segment
            trajectory: chunk c reads entry c, the last one past the list's end; the run feeds itself).
        prompts: the whole run's prompt of each chunk (with a list ``text_context``); a chunk whose
            prompt is not the chunk before's switches: the rows chunks read change from then on and,
            as ``switch`` says, the window is re-cached (:mod:`~worldtrace_cli.engine.recache`).
        encode: ``prompt -> rows`` for the prompts of chunks fed one by one
            (:class:`~worldtrace_cli.engine.feed.ChunkRequest`'s ``prompt``; a live session); None:
            only the run's own prompts.
        on_recache: optional ``on_recache(rollout)`` observer called right after a prompt switch's
            re-cache, before the chunk reads the cache (the fixture replay compares the cache there).
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

    def __init__(self, dit, writer: CacheWriter, text_context, seed: int, device: torch.device,
                 latent_hw: tuple[int, int], frames_per_chunk: int = FRAMES_PER_CHUNK, trained_offset: int = 20,
                 schedule: SelfForcingSchedule = SelfForcingSchedule(), noise=None, on_step=None,
                 switch: str = "recache", recache_window: int | None = None, prompts: list | None = None,
                 encode=None, on_recache=None):
        if dit.cfg.has_camera:
            raise ValueError("TextRollout runs a t2v DiT (model_type t2v); LingBot-World runs in LingbotRollout")
        if text_context is not None and not isinstance(text_context, torch.Tensor):
            if not len(text_context) or prompts is None or len(prompts) != len(text_context):
                raise ValueError("TextRollout: one text context per chunk needs one prompt per chunk")
        self.text_context, self.prompts, self._encode, self.on_recache = text_context, prompts, encode, on_recache
        self._rows = None  # the rows the state's cross K/V were made from
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        from .recache import SWITCH_MODES

        if switch not in SWITCH_MODES:
            raise ValueError(f"switch must be one of {', '.join(SWITCH_MODES)}, got {switch!r}")
        self.switch, self.recache_window = switch, recache_window or trained_offset + 1
        self._setup(dit, writer, seed, device, latent_hw, frames_per_chunk, trained_offset,
                    dit.patch_embedding.weight.dtype, len(self.timesteps), noise, on_step)
        self.state = TextRolloutState()

    def own_request(self, chunk: int) -> ChunkRequest:
        """The run's own prompts (a list of contexts), or no prompt: the one context of every chunk."""
        if isinstance(self.text_context, torch.Tensor):
            return ChunkRequest(chunk)
        if self.text_context is None:
            return super().own_request(chunk)
        last = len(self.prompts) - 1
        return ChunkRequest(chunk, prompt=self.prompts[min(chunk, last)],
                            previous_prompt=self.prompts[min(chunk - 1, last)] if chunk else None)

    def prompt_rows(self, request: ChunkRequest) -> torch.Tensor:
        """The text rows of ``request``'s chunk: [L, 4096] float32 (its prompt's, encoded once)."""
        if request.prompt is None:
            if not isinstance(self.text_context, torch.Tensor):
                raise ValueError(f"chunk {request.chunk}: a text rollout needs each chunk's prompt")
            return self.text_context
        if self.prompts is not None and request.prompt in self.prompts:
            return self.text_context[self.prompts.index(request.prompt)]
        if self._encode is None:
            raise ValueError(f"chunk {request.chunk}: prompt {request.prompt[:40]!r} is not one of the run's")
        return self._encode(request.prompt)

    def prepare_chunk(self, chunk: int, frame_start: int, timer, request: ChunkRequest) -> list[dict]:
        """At a prompt switch (this chunk's prompt is not the previous chunk's), re-cache the window
        under the new prompt (:func:`~worldtrace_cli.engine.recache.recache`) unless ``plain``."""
        from .recache import can_recache, recache

        if chunk == 0 or request.prompt is None or request.prompt == request.previous_prompt:
            return []
        rows = self.prompt_rows(request)
        if self.switch == "plain" or self.state.history is None:
            return [{"type": "prompt_switch", "recache": False}]
        if not can_recache(self.writer):
            return [{"type": "prompt_switch", "recache": False,
                     "reason": f"{self.writer.name} cannot rewrite its frames (CacheWriter.rewrite)"}]
        with timer.phase("context"):  # the re-cache is a context pass over the window
            event = recache(self, frame_start, rows, self.switch)
        self._rows = rows
        if self.on_recache is not None:
            self.on_recache(self)
        return [event]

    def finish_chunk(self, x0: torch.Tensor) -> None:
        """Keep the last ``recache_window`` clean latent frames (``state.history``)."""
        if self.switch == "plain":
            return
        # cat makes a new tensor each chunk; the view of its last W frames keeps at most W + F alive
        hist = x0.clone() if self.state.history is None else torch.cat([self.state.history, x0], dim=2)
        self.state.history = hist[:, :, -self.recache_window:]

    def chunk_inputs(self, read, frame_start: int, frames: int, request: ChunkRequest):
        rows = self.prompt_rows(request)
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
