"""A run's GPU memory plan, computed by running the real modules at the real shapes without memory
(issue 45): PyTorch's ``FakeTensorMode`` (tensors with shapes, dtypes and devices but no storage) and
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

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

PHASES = ("load", "text", "denoise", "context", "decode")
OFFLOADS = ("none", "text", "blocks")  # what --offload may name besides auto (jobs/inputs.py)
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


def _module_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) + \
        sum(b.numel() * b.element_size() for b in module.buffers())


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
        if preset.clip and not preset.is_text:
            from transformers import CLIPVisionModelWithProjection

            from ..model.image_encoder import clip_config

            from ..model.image_encoder import CLIPImageTower

            clip = CLIPImageTower(CLIPVisionModelWithProjection(clip_config(preset.clip)))
        text = None
        if preset.architecture != "mg2":
            from transformers import UMT5Config, UMT5EncoderModel

            from ..model.lingbot.text import tiny_umt5

            text = UMT5EncoderModel(UMT5Config(**UMT5_XXL)) if checkpoint_text else tiny_umt5()
    return tuple(None if m is None else m.eval().requires_grad_(False) for m in (dit, vae, clip, text))


def _dit_class(preset):
    if preset.architecture == "mg2":
        from ..model.dit import CausalWanDiT

        return CausalWanDiT
    from ..model.lingbot.dit import LingbotDiT

    return LingbotDiT


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
    total = _module_bytes(dit)
    if offload != "blocks":
        return total, cast
    blocks = [_module_bytes(b) for b in dit.blocks]
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
    Takes seconds on a CPU for the tiny presets, about half a minute for the 14B LingBot DiT.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
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
               "text_encoder": None if preset.architecture == "mg2" else ("umt5-xxl" if checkpoint_text else "tiny")}
    plan = MemoryPlan(options)
    with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
        dit, vae, clip, text = _fake_networks(preset, dtype, checkpoint_text)
        dit_bytes, cast = stored_dit_bytes(preset, dtype, weights_dtype, offload)
        parts = {"dit": dit_bytes, "dit_total": _module_bytes(dit), "vae": _module_bytes(vae),
                 "clip": 0 if clip is None else _module_bytes(clip), "text_encoder": 0 if text is None else _module_bytes(text)}
        resident = dit_bytes + parts["vae"] + parts["clip"] + (parts["text_encoder"] if offload == "none" else 0)
        # the fake DiT runs in the compute dtype, all of it tracked: the phases that hold it count dit_bytes
        # instead, and with fp8 storage one layer's weight cast to the compute dtype for its call
        dit_off = parts["dit_total"] - dit_bytes - cast
        plan.phases["load"] = resident
        plan.phases["text"] = _text_phase(preset, vae, clip, text, resident, offload, chunks)
        plan.parts = parts
        _chunk_phases(plan, preset, memory, dit, vae, clip, parts["text_encoder"] * (offload == "none"), dit_off, dtype,
                      chunks,
                      unset_fake_temporarily)
    return plan


def peak_tracker():
    """A ``MemTracker`` kept to live bytes and their peak: its per-module statistics are off (they refuse
    a module called twice in one block, which the VAE's frame loop and the denoising steps do, and they
    hook gradients the planned runs never make). Modules are tracked with ``track_external``."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs) -> None:
            pass

        def _post_fw_hook(self, module, inputs, outputs) -> None:
            pass

    return PeakTracker()


def _peak(tracker) -> int:
    return max((snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()), default=0)


def _current(tracker) -> int:
    return sum(snap["Total"] for snap in tracker.get_tracker_snapshot("current").values())


def _text_phase(preset, vae, clip, text, resident: int, offload: str, chunks: int) -> int:
    """Peak of the conditioning: umT5 on a 512-token prompt, MG2's CLIP tower and the VAE encoding the
    start image (their own code paths: :func:`~worldtrace_cli.model.vae.encode_conditioning_latents`)."""
    from ..model.vae import encode_conditioning_latents

    tracker = peak_tracker()
    peak = 0
    if text is not None:
        tracker.track_external(text)
        with tracker:
            text(input_ids=torch.zeros(1, 512, dtype=torch.long), attention_mask=torch.ones(1, 512, dtype=torch.long))
        # the encoder visits the GPU for the call (offload text / blocks) or lives there (none, in resident)
        peak = _peak(tracker) + resident - _module_bytes(text) * (offload == "none")
    if preset.is_text:
        return peak
    image = torch.empty(1, 3, preset.height, preset.width)
    tracker = peak_tracker()
    tracker.track_external(vae, *([clip] if clip is not None else []))
    with tracker:
        encode_conditioning_latents(vae, image.to(next(vae.parameters()).dtype), chunks * preset.frames_per_chunk)
        if clip is not None:
                    clip.conditioning_tokens(image.to(next(clip.parameters()).dtype))
    own = _module_bytes(vae) + (0 if clip is None else _module_bytes(clip))
    return max(peak, _peak(tracker) - own + resident)


def _conditioned(pipe, preset, text_rows: int = 512):
    """Fake conditioning of the backbone's rollout at the run's shapes (what ``pipe.condition`` returns)."""
    from ..model.conditioning import ConditioningLatents, CONDITIONING_ENCODE_LATENT_FRAMES

    lh, lw = pipe.latent_hw
    dtype = pipe.dtype
    if preset.is_text:
        from .text import TextConditioned

        return TextConditioned(["plan"], [torch.empty(text_rows, 4096)], [], "recache")
    latents = ConditioningLatents(torch.empty(1, 16, CONDITIONING_ENCODE_LATENT_FRAMES, lh, lw))
    if preset.is_lingbot:
        from ..model.lingbot.inputs import LingbotInputs
        from .lingbot import LingbotConditioned

        return LingbotConditioned(latents, torch.empty(text_rows, 4096), LingbotInputs())
    from .mg2 import Conditioned

    return Conditioned(latents, torch.empty(1, 257, pipe.world.clip.hidden_size, dtype=torch.float32).to(dtype))


class _PlanPast:
    """The rollouts' :class:`~worldtrace_cli.engine.rollout.WriterPast` (each layer read from the writer
    when the DiT reaches it) with real positions of the same count: the DiT reads positions as Python
    numbers (one angle table per chunk). A compressed writer's per-slot token counts are values too
    (WorldKV): its slots are planned whole."""

    def __init__(self, writer, num_layers: int, unset_fake):
        self.writer, self.num_layers, self.unset_fake = writer, num_layers, unset_fake
        self._tokens = len(writer.slots()) * writer.geometry.tokens_per_frame

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, layer: int):
        from dataclasses import replace

        from ..model.chunk import LayerPast

        p = LayerPast(*self.writer.read(layer))
        with self.unset_fake():
            return replace(p, positions=torch.arange(-len(p.positions), 0, dtype=torch.float64))

    def tokens(self, layer: int) -> int:
        return self._tokens


def _fill(rollout, writer, chunks: int, dtype, tracker) -> None:
    """Commit fake chunks of canonical K/V until the writer's slots and bytes stop growing (or ``chunks``
    - 1 are in): the writer's own commit and eviction code at the run's shapes."""
    g = rollout.geometry
    f = rollout.frames_per_chunk
    before = None
    for c in range(chunks - 1):  # the planned chunk is the last
        writer.begin_chunk(c * f)
        now = (len(writer.slots()), _current(tracker))
        if now == before:
            break
        before = now
        shape = (1, f * g.tokens_per_frame, g.heads, g.head_dim)
        writer.commit([(torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)) for _ in range(g.num_layers)],
                      list(range(c * f, c * f + f)))
        rollout.chunk = c + 1
        rollout.finish_chunk(torch.empty(1, rollout.latent_channels, f, *rollout.latent_hw))  # what it keeps


def _chunk_phases(plan: MemoryPlan, preset, memory, dit, vae, clip, text_resident: int, dit_off: int, dtype, chunks: int,
                  unset_fake) -> None:
    """Fill the cache, then time one chunk's denoising call, context pass and decode in MemTracker."""
    from dataclasses import replace

    from ..config import memory_config
    from ..model.checkpoint import WorldModel
    from ..model.chunk import LayerPast
    from ..trajectory import MODES, frames_for_chunks
    from .pipeline import pipeline_class
    from ..model.lingbot.inputs import LingbotInputs
    from .rollout import CacheRead

    world = WorldModel(dit, vae, clip, [])
    pipe = pipeline_class(preset)(preset, world, torch.device("cpu"), dtype, "float32", "none")
    spec = MODES[preset.mode]
    with unset_fake():  # the actions and the camera track: host arrays, as in a run
        rows = frames_for_chunks(chunks, preset.frames_per_chunk)
        keyboard = torch.zeros(1, rows, spec.keyboard_dim)
        mouse = torch.zeros(1, rows, 2) if spec.mouse else None
        if preset.is_lingbot:
            track = pipe.camera(keyboard, mouse, LingbotInputs())
            pipe.camera = lambda k, m, i: track
        else:
            poses = pipe.latent_poses(keyboard, mouse)
            pipe.latent_poses = lambda k, m: poses
    tracker = peak_tracker()
    tracker.track_external(dit, vae, *([clip] if clip is not None else []))

    def build(mem):
        writer = pipe.build_writer(mem)
        rollout = pipe.rollout(writer, conditioned, keyboard, mouse, 0)
        return writer, rollout

    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    with tracker:
        conditioned = _conditioned(pipe, preset)  # held for the whole run, as pipe.condition's output is
        writer, rollout = build(memory)
        try:
            _fill(rollout, writer, chunks, dtype, tracker)
        except (DataDependentOutputException, DynamicOutputShapeException):  # the writer reads its own values (see the module docstring)
            slots = len(writer.slots())
            del writer, rollout
            plan.cache_model = "slots"
            writer, rollout = build(memory_config(preset=preset, cache="sliding", budget=max(slots, writer_capacity(memory, pipe))))
            _fill(rollout, writer, chunks, dtype, tracker)
    f = preset.frames_per_chunk
    start = rollout.chunk * f
    writer.begin_chunk(start)
    slots = writer.slots()
    plan.slots = len(slots)
    with unset_fake():
        positions = torch.arange(-plan.slots, 0, dtype=torch.float64)
    past = _PlanPast(writer, rollout.geometry.num_layers, unset_fake)
    read = CacheRead(slots, positions, None, 0, past, writer.temporal_frequency_scale())
    host = writer.host_bytes()
    cache = _current(tracker) - _module_bytes(dit) - _module_bytes(vae) - (0 if clip is None else _module_bytes(clip))
    plan.parts["cache"] = cache - host
    plan.parts["host_store"] = host
    lh, lw = pipe.latent_hw
    x = torch.empty(1, rollout.latent_channels, f, lh, lw)
    with tracker:  # the decoder's feature cache (made by the previous chunk's decode) lives across chunks
        decoder = pipe.decoder()
        decoder.decode(torch.empty(1, rollout.latent_channels, f, lh, lw))
    inputs, cond = rollout.chunk_inputs(read, start, f)
    # the tracker holds the whole DiT and the host store; the GPU holds the resident DiT, not the host store,
    # and umT5 when it stays (offload none)
    base = text_resident - dit_off - host
    with tracker:
        flow = rollout.flow(x, 0, inputs, cond)
    plan.phases["denoise"] = _peak(tracker) + base
    with tracker:
        x0 = rollout.to_x0(x, flow, 0)
        committed = rollout.context(x0, inputs, cond)
        writer.commit(committed, list(range(start, start + f)))  # the writer's copies while the chunk's are alive
    plan.phases["context"] = _peak(tracker) + base
    del committed, inputs, cond, flow, read
    with tracker:
        decoder.decode(x0)
    plan.phases["decode"] = _peak(tracker) + base


def writer_capacity(memory, pipe) -> int:
    """Past latent-frame slots the writer ``memory`` names holds on the device: its budget (default:
    the model's own), the summary slots included."""
    writer = pipe.build_writer(memory)
    return int(writer.budget)
