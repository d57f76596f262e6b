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
from .feed import ChunkRequest, ConditioningFeed
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
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        from .recache import SWITCH_MODES

        if switch not in SWITCH_MODES:
            raise ValueError(f"switch must be one of {', '.join(SWITCH_MODES)}, got {switch!r}")
        self.switch, self.recache_window = switch, recache_window or trained_offset + 1
        self._setup(dit, writer, seed, device, latent_hw, frames_per_chunk, trained_offset,
                    dit.patch_embedding.weight.dtype, len(self.timesteps), noise, on_step)
        self.state = TextRolloutState()
        if text_context is not None:  # a whole run's prompts (or one context): it feeds itself
            self.feed = ConditioningFeed.whole(prompts=None if isinstance(text_context, torch.Tensor) else prompts)

    @property
    def history(self) -> torch.Tensor | None:
        """The clean latents of the last ``recache_window`` latent frames [1, C, n, h, w] float32 (None
        before the first chunk): what a prompt switch re-caches."""
        return self.state.history

    def recache_pass(self, x0: torch.Tensor, past: list, rows: torch.Tensor, query_only_tokens: int):
        """The re-cache's one DiT call (:func:`~worldtrace_cli.engine.recache.recache`): at t = 0 over the
        clean latents ``x0`` [1, C, n, h, w], reading ``past`` (a :class:`~worldtrace_cli.model.chunk.LayerPast`
        per layer) and the new prompt's text ``rows`` [L, 4096] (its text K/V made anew, kept for the
        chunks after), the first ``query_only_tokens`` tokens only querying. Returns every layer's
        canonical ``(k, v)``."""
        self.state.cross_kv = None  # the call reads the new prompt
        inputs = LingbotChunk(rollout=self.state, past=past, text_context=rows,
                              temporal_freq_scale=self.writer.temporal_frequency_scale(),
                              query_only_tokens=query_only_tokens)
        _, committed = self.call_dit(x0, 0.0, None, inputs, commit=True)
        return committed

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
        """At a prompt switch (:attr:`~worldtrace_cli.engine.feed.ChunkRequest.switches`, the one test),
        re-cache the window under the new prompt (:func:`~worldtrace_cli.engine.recache.recache`, which
        also makes the new prompt's text K/V) unless ``plain``; a switch not re-cached drops the old
        prompt's text K/V (the DiT makes the new prompt's at the chunk's first call)."""
        from .recache import can_recache, recache

        if not request.switches:
            return []
        rows = self.prompt_rows(request)
        event = {"type": "prompt_switch", "recache": False}
        if self.switch != "plain" and self.state.history is not None and not can_recache(self.writer):
            event["reason"] = f"{self.writer.name} cannot rewrite its frames (CacheWriter.rewrite)"
        elif self.switch != "plain" and self.state.history is not None:
            with timer.phase("context"):  # the re-cache is a context pass over the window
                event = recache(self, frame_start, rows, self.switch)
        if event["type"] == "prompt_switch":
            self.state.cross_kv = None
        if event["type"] == "prompt_recache" and self.on_recache is not None:
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
        inputs = LingbotChunk(rollout=self.state, past=read.past, text_context=rows,
                              temporal_freq_scale=read.freq_scale)
        return inputs, None

    def flow(self, x, step, inputs, cond, probe=None):
        return self.call_dit(x, self.timesteps[step], cond, inputs, probe=probe)

    def to_x0(self, x, flow, step):
        return flow_to_x0(x, flow, self.sigmas[step])

    def renoise(self, x0, flow, step, draw):
        return add_noise(x0, draw().to(self.device), self.sigmas[step + 1])

    def context(self, x0, inputs, cond, draw=None):
        _, committed = self.call_dit(x0, 0.0, cond, inputs, commit=True)
        return committed


__all__ = ["FRAMES_PER_CHUNK", "TextRollout"]
