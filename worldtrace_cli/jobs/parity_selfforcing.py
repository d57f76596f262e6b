"""Replay the Self-Forcing / LongLive golden fixtures through the product's chunk loop
(``worldtrace parity``; the folder's format: ``docs/reference/selfforcing-architecture.md``'s fixtures README).

The fixture folder holds ``tiny_config.json`` (``model_type: t2v``), ``tiny_weights.safetensors``
(bfloat16, upcast to float32 as the fixtures were computed), ``tiny_inputs.safetensors`` (text
context, initial noise ``[1, F, 16, lh, lw]`` frame-major) and one folder per variant with
``run_config.json`` and ``tiny_outputs.safetensors``. Each replayed variant runs its chunks through
:class:`~worldtrace_cli.engine.text_rollout.TextRollout` with the official cache as one of our writers,
the stored noise draws, in float32; every denoising call's x0 and the final latents are compared.

The four official variants: ``sf_global`` (Self-Forcing's global cache = ``full`` at actual positions) and
``sf_la6_sink3`` (window 6 + sink 3 with chunks of 3 keeps the sink frames alone beside the current
chunk: ``sink`` with budget = sink frames = 3, at actual positions) and ``longlive_infinity``
(LongLive's infinity model, window 12 + sink 3: keys kept un-rotated and read at cache-relative
frames = ``sink`` with budget 9 at ``rank`` positions, contiguous with the current chunk) and
``longlive_switch`` (LongLive's standard model: ``sink`` with budget 9 at ``actual`` positions, its LoRA
merged at rank 4 / alpha 8, and the prompt switch before chunk 6 re-caching the window under the second
prompt: :func:`~worldtrace_cli.engine.recache.recache`; the cache is compared right after the
re-cache too). Each variant is replayed from its own ``run_config.json`` (:func:`variant_memory`: window, sink, the
infinity model, chunk count, prompt switch, LoRA), whatever its folder is called and whichever
variants the folder holds; a variant whose settings the replay cannot reproduce is listed as not
replayed (with why), never as passed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import InputError
from ..model.checkpoint import read_state_dict

# what a variant's run_config.json may ask for that the replay reproduces: its pipeline, its model class and
# the keys it reads (any other key, or another value of these, makes the variant "not replayed", never passed)
PIPELINES = ("pipeline.causal_inference.CausalInferencePipeline",
             "pipeline.interactive_causal_inference.InteractiveCausalInferencePipeline")
MODEL_CLASSES = ("wan.modules.causal_model.CausalWanModel", "wan.modules.causal_model_infinity.CausalWanModel")
KNOWN_KEYS = {"repo", "commit", "pipeline", "model_class", "local_attn_size", "sink_size", "num_frame_per_block",
              "num_chunks", "num_output_frames", "frame_seq_length", "kv_cache_tokens", "denoising_step_list",
              "warp_denoising_step", "timestep_shift", "context_noise", "pipeline_seed", "prompts", "call_sequence",
              "infinity", "global_sink", "switch_frame_indices", "lora"}


REQUIRED_KEYS = ("local_attn_size", "num_frame_per_block", "num_chunks")  # what every replay reads


def whole_number(value) -> bool:
    """True for an int that is not a bool (a run_config.json count or size read as JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def variant_memory(cfg: dict) -> tuple[dict | None, str | None]:
    """(the writer of a variant's official cache, as MemoryConfig keywords; None and why when the replay
    cannot reproduce it) from its ``run_config.json``, whatever its folder is called:

    - ``local_attn_size`` -1: Self-Forcing's global cache = ``full`` at actual positions;
    - a window of W latent frames with ``sink_size`` k and chunks of F: the sink frames and the newest
      ``W - F - k`` frames (``sink``, budget W - F; with k = 0 ``sliding``), at actual positions
      (window 6 + sink 3 with chunks of 3 keeps the sink alone beside the current chunk);
    - LongLive's infinity model (``infinity``: keys stored un-rotated, read at cache-relative frames) is
      the same writer at ``rank`` positions.
    """
    unknown = sorted(set(cfg) - KNOWN_KEYS)
    if unknown:
        return None, f"run_config.json key {unknown[0]!r} is not replayed"
    missing = [k for k in REQUIRED_KEYS if k not in cfg]
    if missing:
        return None, f"run_config.json lacks {missing[0]!r}"
    wrong = [k for k in REQUIRED_KEYS + ("sink_size",) if k in cfg and not whole_number(cfg[k])]
    if wrong:
        return None, f"run_config.json {wrong[0]!r} is {cfg[wrong[0]]!r}, not a whole number"
    if int(cfg["local_attn_size"]) < 0 and not all(whole_number(cfg.get(k)) and cfg[k] > 0
                                                   for k in ("kv_cache_tokens", "frame_seq_length")):
        return None, "a global cache without kv_cache_tokens and frame_seq_length"
    switches = cfg.get("switch_frame_indices") or []
    if not isinstance(switches, list) or len(switches) > 1 or not all(whole_number(i) and i >= 0 for i in switches):
        return None, f"switch_frame_indices {switches!r}: this replay reproduces one prompt switch (two prompts)"
    if switches and len(cfg.get("prompts") or [None, None]) != 2:
        return None, f"{len(cfg['prompts'])} prompts: this replay reproduces one switch between two"
    if cfg.get("pipeline") not in PIPELINES or cfg.get("model_class") not in MODEL_CLASSES:
        return None, f"pipeline {cfg.get('pipeline')!r} / model {cfg.get('model_class')!r}"
    if cfg.get("context_noise", 0) or cfg.get("num_frame_per_block") != 3 or list(cfg.get("denoising_step_list", [])) \
            != [1000, 750, 500, 250] or not cfg.get("warp_denoising_step", True) or cfg.get("timestep_shift") != 5.0:
        return None, "a sampler other than the Self-Forcing schedule this replay reads (4 steps, shift 5, chunks of 3)"
    infinity = bool(cfg.get("infinity")) or cfg["model_class"].endswith("causal_model_infinity.CausalWanModel")
    window, sink, f = int(cfg["local_attn_size"]), int(cfg.get("sink_size", 0)), int(cfg["num_frame_per_block"])
    if window < 0:
        if infinity or sink:
            return None, "a global cache with a sink or the infinity model"
        return {"cache": "full", "positions": "actual"}, None
    if window < f + sink:
        return None, f"a window of {window} latent frames cannot hold sink {sink} and a chunk of {f}"
    positions = "rank" if infinity else "actual"
    if sink:
        return {"cache": "sink", "budget": window - f, "sink_frames": sink, "positions": positions}, None
    return {"cache": "sliding", "budget": window - f, "positions": positions}, None


def is_selfforcing_fixture(folder: str | Path) -> bool:
    """True for a Self-Forcing / LongLive fixture folder: its ``tiny_config.json`` is a ``t2v`` model (the
    family read from the fixtures' own files, not from any folder's name)."""
    folder = Path(folder)
    try:
        return json.loads((folder / "tiny_config.json").read_text()).get("model_type") == "t2v"
    except (OSError, ValueError, AttributeError):
        return False


def _need(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: file not found (not a Self-Forcing fixture folder?)")
    return path


def load_fixture_dit(folder: Path, device: str = "cpu"):
    """The fixture's ``t2v`` :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` in float32
    (:func:`~worldtrace_cli.model.lingbot.checkpoint.load_lingbot_dit`: every key of
    ``tiny_weights.safetensors`` strictly, official names; Self-Forcing's state dict is LingBot's less
    the camera modules).

    Raises:
        InputError: a missing file. CheckpointError: a bad config or weights that do not match it.
    """
    from ..model.lingbot.checkpoint import load_lingbot_dit

    return load_lingbot_dit(_need(folder / "tiny_config.json"), weights=_need(folder / "tiny_weights.safetensors"),
                            device=device)


def replay_variant(model, inputs: dict, outputs: dict, memory: dict, chunks: int, trained_offset: int,
                   device: str = "cpu", rollout_out: list | None = None, switch_chunk: int | None = None,
                   on_recache=None, switch: str = "recache") -> tuple[dict, torch.Tensor]:
    """One fixture rollout: (x0 per ``"c{c}_s{s}_x0"`` [1, 16, 3, lh, lw], latents [1, 16, 3N, lh, lw]) on
    the CPU. ``inputs``/``outputs``: the fixture's tensors (frame-major, permuted here to ours).
    ``rollout_out``: a list that receives the finished rollout (its writer, for :func:`cache_diff`).
    ``switch_chunk``: chunks from this one on read ``text_context_2`` (LongLive's re-cache at the
    switch, or as ``switch`` says: :data:`~worldtrace_cli.engine.recache.SWITCH_MODES`);
    ``on_recache(rollout)`` sees the rollout right after the re-cache."""
    from ..engine.text_rollout import TextRollout
    from ..memory import MemoryConfig, build_writer

    noise, draws = inputs["noise"], outputs["add_noise_draws"]

    def stored(c, s, shape):
        return (noise[:, 3 * c:3 * c + 3].permute(0, 2, 1, 3, 4) if s == 0
                else draws[c, s - 1].permute(1, 0, 2, 3)[None])

    x0s: dict = {}
    writer = build_writer(MemoryConfig.of(**memory), 0, trained_offset + 1)
    text, prompts = inputs["text_context"], None
    if switch_chunk is not None:  # the fixture's two prompts, by the names its inputs give them
        prompts = ["text_context"] * switch_chunk + ["text_context_2"] * (chunks - switch_chunk)
        text = [inputs[p] for p in prompts]
    rollout = TextRollout(model, writer, text, 0, torch.device(device), tuple(noise.shape[-2:]),
                          trained_offset=trained_offset, noise=stored, switch=switch, prompts=prompts,
                          on_step=lambda c, s, x0: x0s.__setitem__(f"c{c}_s{s}_x0", x0.cpu()), on_recache=on_recache)
    latents = torch.cat([rollout.step().latents for _ in range(chunks)], dim=2).cpu()
    if rollout_out is not None:
        rollout_out.append(rollout)
    return x0s, latents


def cache_diff(rollout, outputs: dict, chunks: int, sink_frames: int, rotated: bool, snapshot: str | None = None
               ) -> float:
    """Largest |difference| between the official self-attention cache after the last chunk
    (``kv_after_c{N-1}_L{l}_k`` / ``_v`` [1, L_cache, H, d], slots below ``local_end``: the sink frames
    first, then the newest frames in order; ``snapshot``: another snapshot's key prefix, e.g.
    ``kv_after_recache_before_c6``, taken after ``chunks`` chunks) and the same frames in our writer.

    Our writer keeps keys canonical (spatial RoPE applied, temporal not); ``rotated`` (the standard
    models) rotates them to their absolute frames, as the official cache stores them, and compares
    keys and values. The infinity model stores keys with no RoPE at all (spatial included), which
    our cache never holds: with ``rotated`` False only the values are compared. The frames the
    writer holds for the next chunk are compared (after its eviction: a subset of the official
    buffer, which still holds the chunk that will leave)."""
    writer, f = rollout.writer, rollout.frames_per_chunk
    s_tokens = rollout.geometry.tokens_per_frame
    writer.begin_chunk(f * chunks)
    ids = [f for slot in writer.slots() for f in slot.frames]
    worst = 0.0
    prefix = snapshot or f"kv_after_c{chunks - 1}"
    for layer in range(rollout.geometry.num_layers):
        k, v = writer.read(layer)[:2]
        end = int(outputs[f"{prefix}_L{layer}_local_end"]) // s_tokens
        official = list(range(sink_frames)) + list(range(f * chunks - (end - sink_frames), f * chunks))
        rows = torch.cat([torch.arange(official.index(f) * s_tokens, (official.index(f) + 1) * s_tokens) for f in ids])
        want_k = outputs[f"{prefix}_L{layer}_k"][:, rows]
        want_v = outputs[f"{prefix}_L{layer}_v"][:, rows]
        worst = max(worst, (v.float().cpu() - want_v).abs().max().item())
        if rotated:
            k = rollout.dit.rope.rotate_slots(k.float(), torch.tensor(ids, dtype=torch.float64))
            worst = max(worst, (k.float().cpu() - want_k).abs().max().item())
    return worst


def compare_selfforcing(folder: str | Path, device: str = "cpu") -> tuple[dict[str, float], list[str]]:
    """(largest |difference| per replayed variant: ``<variant>/x0`` over every denoising call,
    ``<variant>/latents``, ``<variant>/cache`` (keys and values of the last chunk's cache,
    :func:`cache_diff`; ``cache_values`` for the infinity model); the variants present but not
    replayed yet). Cache entries are held to 2e-4 (the fixtures README), the rest to 1e-4.

    Raises:
        InputError / CheckpointError: an incomplete or unreadable folder.
    """
    from ..model.selfforcing.lora import merge_lora, read_lora

    folder = Path(folder)
    base = load_fixture_dit(folder, device)
    inputs = read_state_dict(_need(folder / "tiny_inputs.safetensors"))
    diffs, skipped, unchecked = {}, [], []
    for sub in sorted(p for p in folder.iterdir() if (p / "run_config.json").is_file()):
        try:
            cfg = json.loads((sub / "run_config.json").read_text())
        except (OSError, ValueError) as exc:
            skipped.append(f"{sub.name} (run_config.json unreadable: {exc})")
            continue
        memory, why = variant_memory(cfg) if isinstance(cfg, dict) else (None, "run_config.json is not an object")
        if memory is None:
            skipped.append(f"{sub.name} ({why})")
            continue
        outputs = read_state_dict(_need(sub / "tiny_outputs.safetensors"))
        n = cfg["num_chunks"]
        window = cfg["local_attn_size"] if cfg["local_attn_size"] > 0 else cfg["kv_cache_tokens"] // cfg["frame_seq_length"]
        model = base
        if cfg.get("lora"):  # LongLive's adapter, merged (rank and alpha as the fixture ran them)
            import copy

            model = copy.deepcopy(base)
            merge_lora(model, read_lora(_need(folder / cfg["lora"]["file"])), cfg["lora"]["alpha"], cfg["lora"]["file"])
        switch, seen = None, {}
        if cfg.get("switch_frame_indices"):  # the switch takes effect at the next chunk boundary (§10.3)
            f = cfg["num_frame_per_block"]
            switch = -(-cfg["switch_frame_indices"][0] // f)
            seen = {"switch": switch}

        def snapshot(rollout, sink=cfg.get("sink_size", 0), at=switch, want=outputs):
            seen["cache_recache"] = cache_diff(rollout, want, at, sink, True, f"kv_after_recache_before_c{at}")
        done: list = []
        x0s, latents = replay_variant(model, inputs, outputs, memory, n, window - 1, device, done,
                                      switch, snapshot if switch is not None else None)
        if switch is not None:
            if "cache_recache" not in seen:
                raise InputError(f"{sub}: the prompt switch before chunk {switch} did not re-cache")
            diffs[f"{sub.name}/cache_after_recache"] = seen["cache_recache"]
        want = {f"c{c}_s{s}_x0": outputs[f"call_c{c}_s{s}_x0"].permute(0, 2, 1, 3, 4) for c in range(n) for s in range(4)}
        diffs[f"{sub.name}/x0"] = max((x0s[k] - v).abs().max().item() for k, v in want.items())
        diffs[f"{sub.name}/latents"] = (latents - outputs["output_latents"].permute(0, 2, 1, 3, 4)).abs().max().item()
        rotated = memory["positions"] == "actual"
        diffs[f"{sub.name}/cache" + ("" if rotated else "_values")] = cache_diff(done[0], outputs, n, cfg.get("sink_size", 0),
                                                                                 rotated)
        layers = done[0].geometry.num_layers
        compared = {"add_noise_draws", "output_latents", *(f"call_{k}" for k in want)}
        for prefix in [f"kv_after_c{n - 1}"] + ([f"kv_after_recache_before_c{switch}"] if switch is not None else []):
            compared |= {f"{prefix}_L{layer}_{part}" for layer in range(layers)
                         for part in (("k", "v", "local_end") if rotated or "recache" in prefix else ("v", "local_end"))}
        unchecked += [f"{sub.name}/{k}" for k in sorted(set(outputs) - compared)]
    from .parity import NOT_CHECKED

    NOT_CHECKED[str(folder)] = unchecked  # named by `parity` as not checked, never counted as passed
    if not diffs:
        raise InputError(f"{folder}: no replayable variant (a folder with run_config.json and tiny_outputs.safetensors"
                         f"{'; not replayed: ' + '; '.join(skipped) if skipped else ''})"[:400])
    return diffs, skipped


def bound(entry: str) -> float:
    """The deviation allowed for a :func:`compare_selfforcing` entry: 2e-4 for the cache's keys and
    values (the fixtures README), 1e-4 for x0 and latents."""
    return 2e-4 if "/cache" in entry else 1e-4


__all__ = ["bound", "cache_diff", "compare_selfforcing", "whole_number", "is_selfforcing_fixture", "load_fixture_dit", "replay_variant",
           "variant_memory"]
