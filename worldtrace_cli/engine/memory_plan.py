"""A run's GPU memory plan, computed by running the real modules at the real shapes without memory
(docs/gpu-memory.md): PyTorch's ``FakeTensorMode`` (tensors with shapes, dtypes and devices but no storage) and
its ``MemTracker`` (``torch.distributed._tools.mem_tracker``: live bytes of parameters and activations,
peak per block).

The preset's networks are built at full size under the fake mode (the DiT of its architecture, the
Wan VAE, MG2's CLIP tower, umT5-XXL for a checkpoint LingBot / Self-Forcing preset), the run's writer
fills its cache through its own ``commit``, and one chunk runs through the backbone's own rollout
hooks (:class:`~worldtrace_cli.engine.rollout.ChunkRollout`: ``chunk_inputs``, ``flow``, ``context``)
and the streaming VAE decoder. A change to the code (a buffer kept longer, a bigger activation)
changes the plan. Phases and what each holds at its peak:

- ``load``: the weights on the GPU (the text encoder not, with ``offload`` ``text`` or ``blocks``).
- ``text``: the conditioning: umT5 on a 512-token prompt (on the GPU for the call), MG2's CLIP tower
  and the VAE encoding the start image.
- ``denoise``: one denoising call with the writer's cache full and the chunk's rotated K/V buffers.
- ``context``: the context pass (the chunk's canonical K/V for the writer on top).
- ``decode``: one chunk through the streaming VAE decoder (the cache still held, the DiT's chunk
  buffers freed).

What the plan does not see: the CUDA caching allocator's rounding and fragmentation, cuBLAS / cuDNN
workspaces and the CUDA context (about 0.5 GB), torch.compile's fusions (compiled runs peak lower),
host memory (the writers' host stores are subtracted: :meth:`~worldtrace_cli.memory.base.CacheWriter.host_bytes`).
A writer whose commit reads its own values (scores, merges: landmark, field, retrieval...) cannot fill
under the fake mode; its device cache is then planned as a window of the same slot count
(``cache_model`` ``"slots"``), which is what those writers hold on the GPU by construction
(N_r + N_s slots, paper §3).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .plan_chunk import chunk_phases, module_bytes, peak_tracker, tracked_peak

PHASES = ("load", "text", "denoise", "context", "decode")
OFFLOADS = ("none", "text", "blocks")  # bench memory's --offload besides auto (generate's: text, blocks)
PREFETCHED_BLOCKS = 2  # blocks on the GPU with block offloading: the running one and the one prefetched
GB = 1e9
# umT5-XXL, the text encoder of LingBot-World / Self-Forcing / LongLive checkpoints (lingbot spec §12)
UMT5_XXL = {"vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64,
            "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0}


@dataclass
class MemoryPlan:
    """Peak GPU bytes of one run's phases (:data:`PHASES`) and the options they assume.

    Attributes:
        options: preset, cache, budget, offload (``none`` | ``text`` | ``blocks``), weights_dtype,
            dtype, chunks.
        phases: peak bytes per phase (everything live at that moment, weights included).
        parts: bytes of the resident parts: ``dit`` (on the GPU, after fp8 / block offloading),
            ``dit_total`` (all of it in the compute dtype), ``vae``, ``clip``, ``text_encoder``, ``cache`` (the writer's
            device K/V when full), ``host_store`` (the writer's host bytes, not in ``phases``).
        slots: past slots the chunk read; cache_model: ``writer`` (the writer's own commits) or
            ``slots`` (a window of the same slot count, see the module docstring).
    """

    options: dict
    phases: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    slots: int = 0
    cache_model: str = "writer"

    @property
    def peak(self) -> int:
        """The largest phase, in bytes."""
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        """The phase of :attr:`peak`."""
        return max(self.phases, key=self.phases.get)

    def to_dict(self) -> dict:
        """JSON-ready: GB (1e9 bytes, 3 decimals) per phase and part, the peak and its phase, the options."""
        def gb(n):
            return round(n / GB, 3)
        return {"options": self.options, "peak_gb": gb(self.peak), "peak_phase": self.peak_phase,
                "phases_gb": {k: gb(v) for k, v in self.phases.items()},
                "parts_gb": {k: gb(v) for k, v in self.parts.items()}, "slots": self.slots,
                "cache_model": self.cache_model}


@contextmanager
def _default_dtype(dtype: torch.dtype):
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _fake_networks(preset, dtype: torch.dtype, checkpoint_text: bool):
    """The preset's networks at full size as fake tensors on the CPU, in eval mode without gradients.
    Returns (dit, vae, clip or None, umT5 or None)."""
    from diffusers import AutoencoderKLWan

    from ..model.vae import vae_config_dir

    with _default_dtype(dtype):
        dit = _dit_class(preset)(preset.dit)
        vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(vae_config_dir(preset.vae))))
        clip = None
        if preset.clip and preset.backbone.start_image:  # MG2's conditioning, LingBot's optional metrics tower
            from transformers import CLIPVisionModelWithProjection

            from ..model.image_encoder import CLIPImageTower, clip_config

            clip = CLIPImageTower(CLIPVisionModelWithProjection(clip_config(preset.clip)))
        text = None
        if preset.backbone.text_encoder:
            from transformers import UMT5Config, UMT5EncoderModel

            from ..model.lingbot.text import tiny_umt5

            text = UMT5EncoderModel(UMT5Config(**UMT5_XXL)) if checkpoint_text else tiny_umt5()
    return tuple(None if m is None else m.eval().requires_grad_(False) for m in (dit, vae, clip, text))


def _dit_class(preset):
    return preset.backbone.load("dit")


def stored_dit_bytes(preset, dtype: torch.dtype, weights_dtype: str, offload: str) -> tuple[int, int]:
    """(DiT bytes on the GPU, the largest weight the layerwise casting makes in ``dtype`` for one
    layer's call) of ``preset``'s DiT stored as a run stores it: built on the meta device in ``dtype``,
    ``weights_dtype`` fp8 applied by :func:`~worldtrace_cli.model.speed.store_weights` itself (diffusers
    decides which layers stay), and with ``offload`` ``blocks`` only the parameters outside the blocks
    and :data:`PREFETCHED_BLOCKS` blocks (diffusers' group offloading at block level with a stream)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ..model.speed import store_weights

    with unset_fake_temporarily(), torch.device("meta"), _default_dtype(dtype):
        dit = _dit_class(preset)(preset.dit)
    cast = 0
    if weights_dtype != "auto":
        store_weights(dit, weights_dtype, dtype)
        cast = max(m.weight.numel() for m in dit.modules() if getattr(m, "weight", None) is not None
                   and m.weight.dtype == torch.float8_e4m3fn) * dtype.itemsize
    total = module_bytes(dit)
    if offload != "blocks":
        return total, cast
    blocks = [module_bytes(b) for b in dit.blocks]
    return total - sum(blocks) + sum(sorted(blocks)[-PREFETCHED_BLOCKS:]), cast


def plan_memory(preset, memory, offload: str = "text", weights_dtype: str = "auto", dtype: torch.dtype = torch.bfloat16,
                chunks: int = 64, checkpoint_text: bool | None = None) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``preset`` with the writer ``memory`` (a MemoryConfig) names.

    Args:
        offload: ``none`` (umT5 kept on the GPU), ``text`` (umT5 on the GPU only while a prompt is
            encoded: what the loaders do, ``UMT5TextEncoder.keep_on_host``), ``blocks`` (also the DiT's
            blocks in host memory, :data:`PREFETCHED_BLOCKS` on the GPU at a time).
        weights_dtype: ``auto`` or ``fp8`` (the DiT's Linear weights in float8, diffusers' layerwise
            casting: :func:`~worldtrace_cli.model.speed.store_weights`).
        dtype: the run's compute dtype. chunks: the run's length (a growing cache, ``full``, is
            planned at this many chunks; a fixed-size one is full long before).
        checkpoint_text: plan umT5-XXL (a checkpoint run) or the tiny random encoder; None = by the
            preset (checkpoint presets: XXL).
    Raises:
        ValueError: an unknown offload or weights dtype, chunks < 1.
    Takes seconds on a CPU for the tiny presets, 10-20 s for the 14B LingBot DiT, the same at any ``chunks``
    (benchmarks/results/memory-plan-time-2026-11-29/).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..model.speed import WEIGHTS_DTYPES

    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {', '.join(OFFLOADS)}, got {offload!r}")
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"weights dtype must be one of {', '.join(WEIGHTS_DTYPES)}, got {weights_dtype!r}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    if checkpoint_text is None:
        checkpoint_text = preset.weights == "checkpoint"
    options = {"preset": preset.name, "cache": memory.cache, "budget": memory.budget, "offload": offload,
               "weights_dtype": weights_dtype, "dtype": str(dtype).removeprefix("torch."), "chunks": chunks,
               "text_encoder": ("umt5-xxl" if checkpoint_text else "tiny") if preset.backbone.text_encoder else None}
    plan = MemoryPlan(options)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        dit, vae, clip, text = _fake_networks(preset, dtype, checkpoint_text)
        dit_bytes, cast = stored_dit_bytes(preset, dtype, weights_dtype, offload)
        parts = {"dit": dit_bytes, "dit_total": module_bytes(dit), "vae": module_bytes(vae),
                 "clip": 0 if clip is None else module_bytes(clip), "text_encoder": 0 if text is None else module_bytes(text)}
        resident = dit_bytes + parts["vae"] + parts["clip"] + (parts["text_encoder"] if offload == "none" else 0)
        # the fake DiT runs in the compute dtype, all of it tracked: the phases that hold it count dit_bytes
        # instead, and with fp8 storage one layer's weight cast to the compute dtype for its call
        dit_off = parts["dit_total"] - dit_bytes - cast
        plan.phases["load"] = resident
        plan.phases["text"] = _text_phase(preset, vae, clip, text, resident, offload, chunks)
        plan.parts = parts
        chunk_phases(plan, preset, memory, (dit, vae, clip), parts["text_encoder"] * (offload == "none") - dit_off,
                     dtype, chunks)
    return plan


# the conditioning's tracked peaks by what they depend on (:func:`_conditioning_peaks`): a pure function of the
# preset's shapes, the networks' sizes and the dtype, measured once per process (bench memory --offload auto,
# generate's --weights-dtype fit and the fit table plan one preset in several modes and writers)
_CONDITIONING_PEAKS: dict[tuple, tuple[int, int]] = {}


def _text_phase(preset, vae, clip, text, resident: int, offload: str, chunks: int) -> int:
    """Peak of the conditioning: umT5 on a 512-token prompt, MG2's CLIP tower and the VAE encoding the
    start image (their own code paths: :func:`~worldtrace_cli.model.vae.encode_conditioning_latents`)."""
    text_peak, image_peak = _conditioning_peaks(preset, vae, clip, text, chunks)
    peak = 0
    if text is not None:
        # the encoder visits the GPU for the call (offload text / blocks) or lives there (none, in resident)
        peak = text_peak + resident - module_bytes(text) * (offload == "none")
    if not preset.backbone.start_image:
        return peak
    own = module_bytes(vae) + (0 if clip is None else module_bytes(clip))
    return max(peak, image_peak - own + resident)


def _conditioning_peaks(preset, vae, clip, text, chunks: int) -> tuple[int, int]:
    """(tracked peak bytes of the text encoder's call, of the start image's encoding: the VAE and MG2's CLIP
    tower), 0 where the preset has no such input; measured under the fake mode once per process for the same
    shapes (:data:`_CONDITIONING_PEAKS`; the bytes do not depend on the writer, the offload or the DiT)."""
    from ..model.vae import CONDITIONING_ENCODE_LATENT_FRAMES, encode_conditioning_latents

    frames = chunks * preset.frames_per_chunk
    sizes = tuple(None if m is None else (type(m).__name__, module_bytes(m), str(next(m.parameters()).dtype))
                  for m in (vae, clip, text))
    key = (preset.height, preset.width, preset.backbone.start_image, min(frames, CONDITIONING_ENCODE_LATENT_FRAMES),
           sizes)
    if key in _CONDITIONING_PEAKS:
        return _CONDITIONING_PEAKS[key]
    text_peak = image_peak = 0
    if text is not None:
        tracker = peak_tracker()
        tracker.track_external(text)
        with tracker:
            text(input_ids=torch.zeros(1, 512, dtype=torch.long), attention_mask=torch.ones(1, 512, dtype=torch.long))
        text_peak = tracked_peak(tracker)
    if preset.backbone.start_image:
        image = torch.empty(1, 3, preset.height, preset.width)
        tracker = peak_tracker()
        tracker.track_external(vae, *([clip] if clip is not None else []))
        with tracker:
            encode_conditioning_latents(vae, image.to(next(vae.parameters()).dtype), frames)
            if clip is not None:
                clip.conditioning_tokens(image.to(next(clip.parameters()).dtype))
        image_peak = tracked_peak(tracker)
    _CONDITIONING_PEAKS[key] = (text_peak, image_peak)
    return text_peak, image_peak


__all__ = ["GB", "MemoryPlan", "OFFLOADS", "PHASES", "PREFETCHED_BLOCKS", "UMT5_XXL", "module_bytes", "peak_tracker",
           "plan_memory", "stored_dit_bytes", "tracked_peak"]
