"""How much of a chunk's self-attention each KV-cache slot receives: the memory being *read*.

For one DiT call, each self-attention layer's queries q [B, n, H, d] attend over the key buffer
``[past slots rotated to their virtual positions | the current chunk]`` [B, N, H, d] that
:meth:`~worldtrace_cli.model.dit.SelfAttention.attend` hands to SDPA. The buffer falls into
*segments*: one per past slot (its tokens in this layer) and the chunk itself. A segment's *share*
is its softmax mass ``sum_{j in segment} softmax(q k^T / sqrt(d))_j`` averaged over the query tokens
and heads (and the batch): the shares of one layer sum to 1 over the slots and the chunk.

Exact and without the attention matrix: :func:`segment_shares` computes the logits of a block of
queries at a time in float32, their log-sum-exp over all keys and over each segment's keys, and
adds ``exp(lse_segment - lse_all)``; a block's logits are at most ``block_bytes``. What SDPA
computes in bf16 on a GPU differs from these float32 shares only by its own rounding.

:class:`AttentionProbe` collects them for every layer of one DiT call (the rollout hands it to the
chunk's :class:`~worldtrace_cli.model.chunk.CacheView` for the call it measures: the last denoising
step, :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.step`); a ``CacheView`` without a probe
costs one attribute test per layer.
"""

from __future__ import annotations

import math

import torch

BLOCK_BYTES = 256 * 2**20  # float32 logits of one block of queries: 256 MiB


def segment_shares(q: torch.Tensor, k: torch.Tensor, segments: list[int], queries: torch.Tensor | None = None,
                   block_bytes: int = BLOCK_BYTES) -> torch.Tensor:
    """The softmax mass of ``q``'s attention over ``k`` that falls on each segment of ``k``.

    Args:
        q: queries [B, n, H, d] (any float dtype; rotated as SDPA reads them).
        k: keys [B, N, H, d] (rotated; the buffer SDPA reads).
        segments: token counts of consecutive segments of ``k`` (>= 0 each), summing to N.
        queries: optional int64 [m] indices of the query tokens to average over (a sample); None: all n.
        block_bytes: the most bytes of float32 logits one block of queries may hold.
    Returns:
        float64 [len(segments)] on the CPU: each segment's softmax mass, averaged over the batch, the
        (selected) query tokens and the heads; sums to 1 (an empty segment gets 0). Scale 1/sqrt(d),
        SDPA's default.
    Raises:
        ValueError: segments that do not sum to N, or a negative count.
    """
    b, n, h, d = q.shape
    total = k.shape[1]
    if any(s < 0 for s in segments) or sum(segments) != total:
        raise ValueError(f"segments {segments} must be >= 0 and sum to the {total} keys")
    qf = q.transpose(1, 2).float()  # [B, H, n, d]
    if queries is not None:
        qf = qf[:, :, queries.to(q.device)]
    kt = k.transpose(1, 2).float().transpose(-1, -2)  # [B, H, d, N]
    m = qf.shape[2]
    bounds = [0]
    for s in segments:
        bounds.append(bounds[-1] + s)
    sums = torch.zeros(len(segments), dtype=torch.float64, device=q.device)
    rows = max(1, block_bytes // max(1, b * h * total * 4))
    scale = 1.0 / math.sqrt(d)
    for start in range(0, m, rows):
        logits = (qf[:, :, start:start + rows] @ kt) * scale  # [B, H, r, N]
        lse = torch.logsumexp(logits, dim=-1)
        for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if hi > lo:
                sums[g] += (torch.logsumexp(logits[..., lo:hi], dim=-1) - lse).exp().double().sum()
    return (sums / (b * h * m)).cpu()


def query_sample(count: int, tokens: int, seed: int, chunk: int) -> torch.Tensor | None:
    """A seeded sample of ``count`` of a call's ``tokens`` query tokens (sorted int64 indices), the
    same for every layer of the chunk; None when ``count`` is 0 or covers them all. Depends only on
    (seed, chunk, tokens): a resumed run or a fork samples the same tokens."""
    if not count or count >= tokens:
        return None
    gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(chunk)) % (2**63))
    return torch.randperm(tokens, generator=gen)[:count].sort().values


class AttentionProbe:
    """Every layer's slot shares of one DiT call of one chunk (:func:`segment_shares`).

    Args:
        tokens: int64 [L, S]: the past tokens of each slot in each layer (the chunk's
            :class:`~worldtrace_cli.engine.rollout.CacheRead` ``tokens``); the chunk's own keys
            form segment S.
        queries: query tokens sampled per layer (:func:`query_sample`), 0 = all.
        seed, chunk: the sample's seed and the chunk index.
        head_group: under ``--split-heads`` the process group the heads are split over: each
            process measures its heads and the layer's shares are averaged over the processes
            (equal head counts); None: every head is here.
    """

    def __init__(self, tokens: torch.Tensor, queries: int = 0, seed: int = 0, chunk: int = 0, head_group=None):
        self.tokens = tokens.to(torch.int64).cpu()
        self.queries, self.seed, self.chunk, self.head_group = int(queries), int(seed), int(chunk), head_group
        self.layers: dict[int, torch.Tensor] = {}
        self.query_tokens: int | None = None  # the call's query tokens per layer, once observed

    def observe(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, current_tokens: int) -> None:
        """Measure layer ``layer``'s call: q [B, n, H, d] and the key buffer k [B, N, H, d] that SDPA
        reads (past slots then ``current_tokens`` of the chunk itself; ``v`` is not read here).

        Raises:
            ValueError: a buffer whose length is not the layer's past tokens + ``current_tokens``.
        """
        past = self.tokens[layer].tolist() if self.tokens.numel() else []
        if sum(past) + current_tokens != k.shape[1]:
            raise ValueError(f"layer {layer}: key buffer of {k.shape[1]} tokens, expected {sum(past)} past + "
                             f"{current_tokens} current")
        self.query_tokens = q.shape[1]
        sample = query_sample(self.queries, q.shape[1], self.seed, self.chunk)
        shares = segment_shares(q, k, past + [current_tokens], sample)
        if self.head_group is not None:
            import torch.distributed as dist

            shares = shares.to(q.device)
            dist.all_reduce(shares, group=self.head_group)
            shares = (shares / dist.get_world_size(self.head_group)).cpu()
        self.layers[layer] = shares

    def shares(self) -> torch.Tensor:
        """float64 [L, S + 1]: per layer (in layer order) the share of each past slot, then of the chunk itself.

        Raises:
            RuntimeError: a layer was not observed (the probe was not handed to every layer's call)."""
        missing = [i for i in range(self.tokens.shape[0]) if i not in self.layers]
        if missing:
            raise RuntimeError(f"attention probe: layers {missing} were not measured")
        return torch.stack([self.layers[i] for i in range(self.tokens.shape[0])])

    def sampled(self) -> dict | None:
        """``{"sampled": m, "of": n, "seed": seed}`` when a sample of the query tokens was measured, else None."""
        n = self.query_tokens
        if n is None or not self.queries or self.queries >= n:
            return None
        return {"sampled": self.queries, "of": n, "seed": self.seed}


__all__ = ["AttentionProbe", "BLOCK_BYTES", "query_sample", "segment_shares"]
