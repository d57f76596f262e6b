"""LingBot-World (causal fast) model room: DiT, camera conditioning, sampler, checkpoint, text encoder.

Written from ``docs/reference/lingbot-architecture.md`` (the LingBot spec; section numbers in docstrings refer to
it). The DiT reads its self-attention memory through the project's cache contract (docs/architecture.md §2):
canonical keys (spatial RoPE applied, temporal not) plus one temporal position per slot.
"""
