"""A loaded Self-Forcing / LongLive model behind the :class:`~worldtrace_cli.engine.base.PipelineBase` interface.

``Pipeline.from_preset`` returns a :class:`TextPipeline` for a preset with ``architecture:
selfforcing``; the jobs call the same methods as for MG2 and LingBot (``build_writer``, ``condition``,
``rollout``, ``decoder``). What differs (selfforcing-architecture.md): no start image and no actions;
each chunk is conditioned on its prompt segment's umT5 rows (encoded once per distinct prompt);
chunks of 3 latent frames through the 4-step Self-Forcing sampler
(:class:`~worldtrace_cli.engine.text_rollout.TextRollout`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import InputError
from .base import ModelKey, PipelineBase, RunConditioning, check_speed

log = logging.getLogger("worldtrace")


@dataclass
class TextConditioned:
    """A run's prompts encoded: ``prompts`` the chunk-by-chunk prompt strings known when it was
    conditioned, ``contexts`` their umT5 rows (one [L, 4096] float32 tensor per chunk, shared between
    chunks of one prompt), ``truncated`` the prompts longer than the encoder's 512 tokens (cut to 512,
    warned), ``switch`` what a prompt switch does to the cache
    (:data:`~worldtrace_cli.engine.recache.SWITCH_MODES`), ``encode``: ``prompt -> rows`` for the
    prompts of chunks fed one by one (a live session), each encoded once."""

    prompts: list
    contexts: list
    truncated: list
    switch: str = "recache"
    encode: object = None


def schedule_of(preset):
    """The preset's :class:`~worldtrace_cli.model.selfforcing.sampler.SelfForcingSchedule`: its nominal
    ``denoising_steps`` (Self-Forcing's [1000, 750, 500, 250]) as table rows ``1000 - t``, at its
    ``timestep_shift``."""
    from ..model.selfforcing.sampler import NUM_TRAIN_TIMESTEPS, SelfForcingSchedule

    return SelfForcingSchedule(preset.timestep_shift, tuple(NUM_TRAIN_TIMESTEPS - t for t in preset.denoising_steps))


def token_count(text_encoder, prompt: str) -> int:
    """Tokens the encoder's tokenizer makes of ``prompt`` (cleaned as for encoding), EOS included,
    without the 512-token truncation."""
    from ..model.lingbot.text import clean_prompt
    from ..trajectory.prompts import MAX_PROMPT_CHARS

    # no truncation: room for every byte of the longest prompt taken (the byte tokenizer pads to it)
    tok = text_encoder.tokenizer([clean_prompt(prompt)], max_length=4 * MAX_PROMPT_CHARS + 2, truncation=False,
                                 padding=False,
                                 add_special_tokens=True, return_tensors="pt")
    return int(tok.attention_mask.sum())


def encode_prompts(pipeline, prompts: list[str]) -> tuple[list, list]:
    """(every prompt's umT5 rows [L, 4096] on the pipeline's device, one tensor per distinct prompt:
    chunks of one prompt share it; the distinct prompts over the encoder's 512 tokens, truncated to
    512). The truncation is warned the first time the encoder meets the prompt."""
    encoder, rows, truncated = pipeline.world.text, {}, []
    for prompt in dict.fromkeys(prompts):
        n = token_count(encoder, prompt)
        if n > encoder.max_length:
            truncated.append(prompt)
            if prompt not in encoder._cache:
                log.warning(f"prompt {prompt[:40]!r}...: {n} tokens, truncated to the encoder's {encoder.max_length}")
        rows[prompt] = encoder.encode(prompt).to(pipeline.device)
    return [rows[p] for p in prompts], truncated


class TextPipeline(PipelineBase):
    """A ``selfforcing`` preset's DiT (``t2v``), Wan2.1 VAE and umT5 encoder (CLIP tower only for
    ``--metrics all``), loaded once. ``world`` is a :class:`~worldtrace_cli.model.lingbot.world.LingbotWorld`.
    It reads every chunk's prompt (umT5); no image, no camera."""

    reads = frozenset({"prompts", "text"})

    @classmethod
    def from_preset(cls, preset, checkpoint=None, random_weights: bool = False, weights_seed: int = 0,
                    device: str = "auto", dtype: str = "auto", rope_precision: str = "float32",
                    compile_mode: str = "none", hash_checkpoint: bool = False, key: ModelKey | None = None
                    ) -> "TextPipeline":
        """Load a Self-Forcing / LongLive preset (checkpoint folder, or seeded random weights).

        Raises:
            InputError: a bad precision/device/dtype, denoising steps outside the 1000-row table, a
                checkpoint preset without a folder.
            CheckpointError: missing files (one line) or a state dict with missing / extra keys.
        """
        from ..model.selfforcing.world import load_selfforcing_world

        check_speed(rope_precision, compile_mode)
        if not all(1 <= t <= 1000 for t in preset.denoising_steps):
            raise InputError(f"preset {preset.name}: denoising_steps {list(preset.denoising_steps)}: each in [1, 1000]")
        pipe = cls._loaded(preset, lambda dev, dt: load_selfforcing_world(preset, checkpoint, random_weights,
                                                                          weights_seed, dev, dt, hash_checkpoint),
                           device, dtype, rope_precision, compile_mode, key)
        if key is not None and key.backend != "native":  # --backend diffusers: the row's drop-in for the loaded DiT
            pipe.world.dit = preset.backbone.load_backend(key.backend)(pipe.world.dit)
        return pipe

    @torch.no_grad()
    def condition(self, request: RunConditioning) -> TextConditioned:
        """Encode each chunk's prompt known now (``request.prompts``: one string per chunk, the first
        ``request.num_chunks``; none for a live session, which brings each chunk's with its request and
        has it encoded then: ``TextConditioned.encode``). A prompt over 512 tokens is truncated to 512 with
        a warning. ``request.switch``: what a prompt switch does to the cache.

        Raises:
            InputError: an image, fewer prompts than chunks, an unknown ``switch``.
        """
        from .recache import SWITCH_MODES

        switch, prompts, num_chunks = request.switch, list(request.prompts or []), request.num_chunks
        if switch not in SWITCH_MODES:
            raise InputError(f"--prompt-switch: must be one of {', '.join(SWITCH_MODES)}, got {switch!r}")
        if request.image is not None:
            raise InputError(f"preset {self.preset.name}: a text-to-video model takes no start image")
        if prompts and len(prompts) < num_chunks:
            raise InputError(f"preset {self.preset.name}: {num_chunks} chunks need a prompt each, got {len(prompts)}")
        contexts, truncated = encode_prompts(self, prompts[:num_chunks])
        known = dict(zip(prompts, contexts))

        def encode(prompt: str) -> torch.Tensor:
            if prompt not in known:
                (rows,), cut = encode_prompts(self, [prompt])
                known[prompt] = rows
                truncated.extend(cut)
            return known[prompt]

        return TextConditioned(list(prompts[:num_chunks]), contexts, truncated, switch, encode)

    def plan_conditioning(self, text_rows: int = 512) -> TextConditioned:
        """What :meth:`condition` returns, at the run's shapes and without computing it (the memory plan
        builds it under FakeTensorMode): one prompt's ``text_rows`` umT5 rows, named ``plan``."""
        return TextConditioned(["plan"], [torch.empty(text_rows, 4096)], [], "recache")

    def rollout(self, writer, conditioned: TextConditioned, keyboard=None, mouse=None, seed: int = 0, noise=None,
                on_step=None, rows: int | None = None):
        """A fresh :class:`~worldtrace_cli.engine.text_rollout.TextRollout` through ``writer`` (reset): it
        feeds itself the conditioned prompts, or takes each chunk's with its request (``step(request)``).

        Args:
            keyboard, mouse, rows: ignored (a text plan's rows are empty: [1, R, 0] and None).
            seed: noise seed (chunk c draws from ``chunk_generator(seed, c)``).
        """
        from .text_rollout import TextRollout

        contexts = conditioned.contexts or None
        return TextRollout(self.world.dit, writer, contexts, seed, self.device, self.latent_hw,
                           self.frames_per_chunk, self.window - 1, schedule_of(self.preset), noise=noise,
                           on_step=on_step, switch=conditioned.switch, recache_window=self.window,
                           prompts=conditioned.prompts if contexts else None, encode=conditioned.encode)

    def latent_poses(self, keyboard=None, mouse=None):
        """None: a text-to-video run has no camera poses (writers that need them refuse it)."""
        return None


__all__ = ["TextConditioned", "TextPipeline", "encode_prompts", "schedule_of", "token_count"]
