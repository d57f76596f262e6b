"""Speed settings of the DiTs (docs/performance.md): the RoPE tables' precision and ``torch.compile`` of
the blocks' pure tensor parts (norms, modulation, projections, RoPE, FFN, cross-attention, MG2's
action branches, LingBot's camera FiLM), leaving the cache buffers, SDPA over them and the action
caches eager. Any DiT with ``blocks`` takes them: a block (and its ``action_model``, if any) names its
pure parts in a ``compile_parts`` class attribute (MG2's :class:`~.dit.Block`, LingBot-World's block).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
TRAIN_RECOMPILE_LIMIT = 64  # variants per compiled part that training may meet (compile_blocks(dynamic=True))
_COMPILED_PARTS: dict[tuple[str, str, str, bool], object] = {}  # (class, part, mode, dynamic)


@contextmanager
def tf32_allowed(allowed: bool):
    """Inside the block, CUDA float32 matrix products and cuDNN convolutions run on TF32 tensor cores
    (10-bit mantissa, float32 range) when ``allowed``, in IEEE float32 when not (PyTorch's own default
    is float32 products but TF32 convolutions); the previous settings are restored on exit. No effect
    on a CPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def compile_blocks(model: torch.nn.Module, mode: str = "default", dynamic: bool = False) -> None:
    """Compile the pure tensor parts of every block of ``model`` with ``torch.compile`` (fused norms,
    modulation, RoPE and projections); the K/V buffer handling, SDPA over it and the action module
    stay eager.

    Each part is one function of (module, tensors) compiled once per process and mode; parameters
    are graph inputs, so the blocks share one Dynamo/Inductor graph per part instead of one per
    layer (which would hit torch's recompile limit and fall back to eager). The parts: an MG2 block's
    ``attention_inputs`` / ``attention_outputs`` / ``feed_forward`` and its action module's
    ``mouse_part`` / ``keyboard_part``; a LingBot block's ``attention_inputs`` / ``block_outputs``. Shapes are static within a run (``dynamic=False``); the
    context pass (``commit``) and the first chunk (empty action caches) are extra specialisations.

    ``dynamic``: compile for symbolic sizes (``train dit --compile``: the batch of a group of clips
    changes every step; with static shapes each new batch size would recompile until torch's limit
    sends the parts back to eager; the recompile limit is raised to :data:`TRAIN_RECOMPILE_LIMIT`
    for training's variants). On the CPU a batch-8 training step of the loopworld DiT compiled this
    way made 23,499 ATen calls instead of 53,913 (benchmarks/gpu/train_step_ops.py).

    ``mode``: ``default`` | ``reduce-overhead`` and ``max-autotune`` (both replay CUDA graphs when
    run on CUDA: each call site is recorded once per path, every DiT call starts a new graph step
    with ``torch.compiler.cudagraph_mark_step_begin``; cache writers and the action caches copy
    what they keep, so nothing kept aliases the graph pool) | ``none`` (back to eager). The first chunk pays the compilation
    (tens of seconds on a CPU). Needs a C++ compiler on CPU.

    Raises:
        ValueError: unknown mode.
    """
    import types

    from torch._inductor import list_mode_options

    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    cudagraphs = mode != "none" and bool(list_mode_options(mode).get("triton.cudagraphs", False))
    if dynamic and mode != "none":  # training meets each part with and without gradients, with and without
        # past action keys, committing or not, and batches of 1: more variants than torch's default 8,
        # after which a part would fall back to eager for every new one
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, TRAIN_RECOMPILE_LIMIT)
    modules = [m for block in model.blocks for m in (block, getattr(block, "action_model", None)) if m is not None]
    for module in modules:
        for name in getattr(type(module), "compile_parts", ()):
            if mode == "none":
                module.__dict__.pop(name, None)
                continue
            key = (type(module).__name__, name, mode, dynamic)
            if key not in _COMPILED_PARTS:
                _COMPILED_PARTS[key] = torch.compile(getattr(type(module), name), mode=mode, dynamic=dynamic)
            module.__dict__[name] = types.MethodType(_COMPILED_PARTS[key], module)
    model.compile_mode = mode
    model.cudagraphs = cudagraphs


ROPE_PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def configure_speed(model: torch.nn.Module, rope_precision: str = "float32", compile_mode: str = "none") -> None:
    """Apply a run's speed settings to ``model`` (a loaded model may be shared by runs in one process,
    so every run sets both): the RoPE precision (``float32`` | ``float64``, see
    :class:`~worldtrace_cli.model.rope.MainRope`) and :func:`compile_blocks` (``none`` = eager).

    Raises:
        ValueError: an unknown precision or compile mode.
    """
    if rope_precision not in ROPE_PRECISIONS:
        raise ValueError(f"RoPE precision must be one of {', '.join(ROPE_PRECISIONS)}, got {rope_precision!r}")
    model.rope.precision = ROPE_PRECISIONS[rope_precision]
    compile_blocks(model, compile_mode)


WEIGHTS_DTYPES = ("auto", "fp8")  # auto: the run's dtype; fp8: float8 e4m3 storage, computed in the run's dtype


def store_weights(model, weights_dtype: str, compute_dtype: torch.dtype) -> int:
    """Keep the DiT's Linear and Conv weights in float8 (e4m3) between calls and cast each layer to
    ``compute_dtype`` for its own forward, through diffusers' layerwise-casting hooks
    (``diffusers.hooks.apply_layerwise_casting``; patch embedding and norms stay as they are,
    diffusers' default skip patterns): the weights take half the memory of bf16 (docs/gpu-memory.md: the 14B
    LingBot DiT's 37 GB -> about 19 GB). ``auto`` changes nothing. Returns the parameters stored in fp8.

    Measured on loopworld (CPU, float32 compute, ABA 16 chunks, sliding): GT-PSNR 13.92 dB in fp8
    storage against 13.96 dB (tests/test_speed.py: loopworld's frames differ, GT-PSNR within 0.5 dB).
    """
    if weights_dtype == "auto":
        return 0
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype)
    return sum(p.numel() for p in model.parameters() if p.dtype == torch.float8_e4m3fn)


def offload_blocks(model, device) -> int:
    """Keep the DiT's blocks in host memory and bring each to ``device`` for its own forward, the next
    one prefetched on a side CUDA stream while the current one runs: diffusers' group offloading at
    block level (``diffusers.hooks.apply_group_offloading``, one block per group, ``use_stream`` on
    CUDA; it needs ``accelerate``). The model's other parameters (patch, time and text embeddings,
    head) form one more group, brought at the model's forward. The model must be in host memory when
    this is called. On a CPU host and device are one: the hooks run and nothing moves (the tests).
    Returns the blocks offloaded.

    docs/gpu-memory.md: LingBot-World's 14B DiT holds about 1.9 GB of weights on the GPU instead of 37 GB (two
    blocks and the rest), planned by ``worldtrace bench memory --offload blocks``; its speed on a GPU
    is not measured yet. A block's weights must be used only inside its forward: the rollout's
    cross-attention K/V are made by each block (:class:`~worldtrace_cli.model.chunk.ContextKV`).
    """
    from diffusers.hooks import apply_group_offloading

    device = torch.device(device)
    stream = device.type == "cuda"
    apply_group_offloading(model, onload_device=device, offload_device=torch.device("cpu"), offload_type="block_level",
                           num_blocks_per_group=1, use_stream=stream, record_stream=stream, non_blocking=stream)
    return len(model.blocks)


__all__ = ["COMPILE_MODES", "ROPE_PRECISIONS", "WEIGHTS_DTYPES", "compile_blocks", "configure_speed",
           "offload_blocks", "store_weights"]
