"""A user's own causal chunk loop on diffusers' WanTransformer3DModel, with WorldTrace's memory added.

The loop is Self-Forcing's (chunks of 3 latent frames, 4 denoising steps, then a context pass on the
clean chunk at t = 0 that fills the KV cache); the only WorldTrace lines are marked ``# WorldTrace``.
The transformer here is a tiny random one (2 blocks of width 256, head dim 128 like Wan 2.1-1.3B), so the
script runs on a CPU in seconds; with real weights build it with ``WanTransformer3DModel.from_pretrained``
(or ``worldtrace_cli.integrations.wan_transformer_from_original`` for an original-format Self-Forcing
checkpoint) and encode the prompt with umT5.

    python examples/diffusers_chunk_loop.py --cache landmark --chunks 8
"""

from __future__ import annotations

import argparse

import torch
from diffusers import WanTransformer3DModel

from worldtrace_cli.integrations import (WorldTraceKVCacheConfig, apply_worldtrace_kv_cache,  # WorldTrace
                                         commit_chunk, get_worldtrace_kv_state)


def tiny_transformer(seed: int = 0) -> WanTransformer3DModel:
    """A random Wan 2.1 t2v transformer: 2 blocks, width 256, 2 heads of 128 channels."""
    torch.manual_seed(seed)
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=128, in_channels=16,
                                 out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=512, num_layers=2).eval()


def self_forcing_sigmas(shift: float = 5.0) -> list[float]:
    """Self-Forcing's 4 steps (timesteps 1000, 750, 500, 250 warped at shift 5): sigma = t / 1000."""
    sigma = torch.tensor([1.0, 0.75, 0.5, 0.25])
    return (shift * sigma / (1 + (shift - 1) * sigma)).tolist()


@torch.no_grad()
def generate(transformer, text: torch.Tensor, chunks: int, latent_hw=(8, 8), seed: int = 0) -> torch.Tensor:
    """Latents [1, 16, 3 * chunks, h, w], one chunk per loop turn, each reading the cache of the chunks before."""
    gen = torch.Generator().manual_seed(seed)
    sigmas = self_forcing_sigmas()
    video = []
    for _ in range(chunks):
        x = torch.randn(1, 16, 3, *latent_hw, generator=gen)
        for step, sigma in enumerate(sigmas):
            flow = transformer(x, torch.tensor([1000.0 * sigma]), text, return_dict=False)[0]
            x0 = x - sigma * flow
            if step + 1 < len(sigmas):
                nxt = sigmas[step + 1]
                x = (1 - nxt) * x0 + nxt * torch.randn(x0.shape, generator=gen)
        with commit_chunk(transformer):  # WorldTrace: this call (t = 0, clean chunk) commits the chunk's K/V
            transformer(x0, torch.zeros(1), text, return_dict=False)
        video.append(x0)
    return torch.cat(video, dim=2)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default="landmark", help="a WorldTrace writer spec (sliding, sink, field, ...)")
    parser.add_argument("--chunks", type=int, default=6)
    parser.add_argument("--window", type=int, default=6, help="latent frames the model attends over")
    args = parser.parse_args(argv)
    transformer = tiny_transformer()
    text = torch.randn(1, 512, 4096, generator=torch.Generator().manual_seed(1))  # umT5 rows, zero-padded to 512
    state = apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(  # WorldTrace
        cache=args.cache, frames_per_chunk=3, window=args.window, attention_stats=True))
    latents = generate(transformer, text, args.chunks)
    state = get_worldtrace_kv_state(transformer)
    last = [(s["kind"], s["frames"], s["position"], round(s["share"], 3)) for s in state.slot_attention()[:-1]]
    print(f"{args.cache}: {state.chunks} chunks committed, latents {list(latents.shape)}")
    print(f"the last chunk read (kind, frames, position, attention share): {last}")
    return {"latents": latents, "state": state}


if __name__ == "__main__":
    main()
