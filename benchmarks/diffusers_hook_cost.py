"""What the WorldTrace diffusers hook costs: a Self-Forcing-style chunk loop on diffusers' WanTransformer3DModel
with each writer through ``apply_worldtrace_kv_cache``, against the same loop with a plain sliding window.

The baseline ("plain sliding") is what a user writes without WorldTrace: an ``attn1`` processor of their own
(``set_processor``) that keeps the newest ``budget`` latent frames' keys rotated at their absolute frames (as
Self-Forcing's official cache stores them) and reads the chunk at rows ``frame_start ..`` of the model's RoPE
table. "no cache" is the bare transformer (no past at all): the floor. Every loop runs the same chunks (4
denoising calls + the context pass at t = 0 each), the configurations interleaved ``--repeats`` times; the
figure is the median CPU seconds per chunk (this process; wall seconds beside it), and each writer's ratio is its
median over the baseline's (and the ratio of the fastest runs). The hook's
``sliding`` equals the baseline's outputs (the largest difference is printed).

    OMP_NUM_THREADS=1 python benchmarks/diffusers_hook_cost.py -o benchmarks/results/diffusers-hook/
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from worldtrace_cli.integrations import WorldTraceKVCacheConfig
from worldtrace_cli.integrations.diffusers import apply_worldtrace_kv_cache, commit_chunk, remove_worldtrace_kv_cache

SIZES = {  # name: (layers, width, heads, latent h, latent w); head dim 128 as Wan 2.1
    "tiny": (2, 256, 2, 4, 8),
    "small": (4, 512, 4, 16, 16),
    "1.3b": (30, 1536, 12, 60, 104),  # Wan2.1-T2V-1.3B at 480x832 (the GPU runbook's; too slow for a CPU)
}


class PlainSlidingWindow:
    """A user's own sliding-window KV cache (no WorldTrace): per layer the newest ``budget`` frames' rotated
    keys and values; ``commit`` set around the context pass."""

    def __init__(self, transformer, budget: int, frames: int):
        self.budget, self.frames, self.commit, self.frame_start = budget, frames, False, 0
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.table = (transformer.rope.freqs_cos, transformer.rope.freqs_sin, transformer.rope.t_dim)
        self._abs = None

    def absolute(self, cos, sin):
        """The call's rotary tables with the temporal columns at the chunk's absolute frames."""
        if self._abs is None:
            full_cos, full_sin, t = self.table
            per_frame = cos.shape[1] // self.frames
            rows = torch.arange(self.frame_start, self.frame_start + self.frames).repeat_interleave(per_frame)
            c, s = cos.clone(), sin.clone()
            c[0, :, 0, :t], s[0, :, 0, :t] = full_cos[rows, :t], full_sin[rows, :t]
            self._abs = (c, s)
        return self._abs

    def end_chunk(self):
        self.frame_start += self.frames
        self._abs = None


class PlainSlidingProcessor:
    """WanAttnProcessor's self-attention with the plain cache's past prepended."""

    def __init__(self, cache: PlainSlidingWindow, layer: int):
        self.cache, self.layer = cache, layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        from worldtrace_cli.integrations.diffusers import _rotary

        q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        q = attn.norm_q(q).unflatten(2, (attn.heads, -1))
        k = attn.norm_k(k).unflatten(2, (attn.heads, -1))
        v = v.unflatten(2, (attn.heads, -1))
        cos, sin = self.cache.absolute(*rotary_emb)
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        past_k, past_v = self.cache.k.get(self.layer), self.cache.v.get(self.layer)
        keys = k if past_k is None else torch.cat([past_k, k], 1)
        values = v if past_v is None else torch.cat([past_v, v], 1)
        if self.cache.commit:
            keep = self.cache.budget * (k.shape[1] // self.cache.frames)
            self.cache.k[self.layer], self.cache.v[self.layer] = keys[:, -keep:].clone(), values[:, -keep:].clone()
        out = dispatch_attention_fn(q, keys, values, attn_mask=None, dropout_p=0.0, is_causal=False)
        return attn.to_out[1](attn.to_out[0](out.flatten(2, 3).type_as(q)))


def build(size: str, device: str = "cpu", dtype: torch.dtype = torch.float32
          ) -> tuple[WanTransformer3DModel, tuple[int, int]]:
    layers, width, heads, h, w = SIZES[size]
    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=width // heads,
                                  in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                                  ffn_dim=(8960 if size == "1.3b" else 2 * width), num_layers=layers).eval()
    return model.to(device=device, dtype=dtype), (h, w)


@torch.no_grad()
def run_loop(transformer, text, chunks: int, hw, mark) -> tuple[tuple[float, float], list[torch.Tensor]]:
    """((wall, CPU) seconds per chunk, latents) of the Self-Forcing loop; ``mark(call)`` wraps the context pass.
    CPU seconds (this process, one thread) are what a shared machine's other load disturbs least."""
    sigmas = [1.0, 0.9375, 0.8333333, 0.625]
    gen = torch.Generator().manual_seed(0)
    device, dtype = text.device, text.dtype
    out = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(chunks):
        x = torch.randn(1, 16, 3, *hw, generator=gen).to(device, dtype)
        for step, sigma in enumerate(sigmas):
            flow = transformer(x, torch.tensor([1000.0 * sigma], device=device), text, return_dict=False)[0]
            x0 = x - sigma * flow
            if step + 1 < len(sigmas):
                x = (1 - sigmas[step + 1]) * x0 + sigmas[step + 1] * torch.randn(x0.shape, generator=gen).to(device, dtype)
        mark(lambda: transformer(x0, torch.zeros(1, device=device), text, return_dict=False))
        out.append(x0.float().cpu())
    sync()
    return ((time.perf_counter() - start) / chunks, (time.process_time() - cpu) / chunks), out


def measure(size: str, writers: list[str], chunks: int, repeats: int, window: int, device: str = "cpu",
            dtype: torch.dtype = torch.float32) -> dict:
    """Seconds per chunk of every loop, interleaved ``repeats`` times; on CUDA the ratios are of wall seconds
    (synchronised at each loop's ends), on a CPU of this process's CPU seconds."""
    transformer, hw = build(size, device, dtype)
    text = torch.randn(1, 512, 4096, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    budget = window - 3
    blocks = list(transformer.blocks)

    def plain(cache_on: bool):
        if not cache_on:
            return run_loop(transformer, text, chunks, hw, lambda call: call())
        cache = PlainSlidingWindow(transformer, budget, 3)
        for i, block in enumerate(blocks):
            block.attn1.set_processor(PlainSlidingProcessor(cache, i))

        def mark(call):
            cache.commit = True
            call()
            cache.commit = False
            cache.end_chunk()

        try:
            return run_loop(transformer, text, chunks, hw, mark)
        finally:
            for block in blocks:
                block.attn1.set_processor(WanAttnProcessor())

    def hooked(spec: str):
        apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(cache=spec, window=window))

        def mark(call):
            with commit_chunk(transformer):
                call()

        try:
            return run_loop(transformer, text, chunks, hw, mark)
        finally:
            remove_worldtrace_kv_cache(transformer)

    configs = {"no cache": lambda: plain(False), "plain sliding": lambda: plain(True)}
    configs.update({f"hook {w}": (lambda w=w: hooked(w)) for w in writers})
    times: dict[str, list[float]] = {name: [] for name in configs}
    walls: dict[str, list[float]] = {name: [] for name in configs}
    outputs = {}
    configs["plain sliding"]()  # warm-up (allocator, first-call costs)
    for _ in range(repeats):
        for name, fn in configs.items():
            (wall, cpu), latents = fn()
            times[name].append(cpu)
            walls[name].append(wall)
            outputs[name] = latents
    cpus = times
    if device != "cpu":  # a GPU's figure is its wall time: the CPU only launches kernels
        times = walls
    base = statistics.median(times["plain sliding"])
    same = max((a - b).abs().max().item() for a, b in zip(outputs["plain sliding"], outputs["hook sliding"])) \
        if "hook sliding" in outputs else None
    layers, width, heads, h, w = SIZES[size]
    return {"size": size, "device": device, "dtype": str(dtype).replace("torch.", ""),
            "timer": "CPU s" if device == "cpu" else "wall s (synchronised)", "layers": layers, "width": width, "heads": heads, "latent": [h, w],
            "tokens_per_frame": (h // 2) * (w // 2), "chunks": chunks, "repeats": repeats, "window": window,
            "budget_sliding": budget, "hook_sliding_vs_plain_max_abs_diff": same,
            "rows": [{"config": name, "s_per_chunk": statistics.median(ts), "min_s_per_chunk": min(ts),
                      "cpu_s_per_chunk": statistics.median(cpus[name]), "all_cpu_s_per_chunk": cpus[name],
                      "wall_s_per_chunk": statistics.median(walls[name]),
                      "ratio_vs_plain_sliding": statistics.median(ts) / base,
                      "min_ratio_vs_plain_sliding": min(ts) / min(times["plain sliding"])}
                     for name, ts in times.items()]}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def markdown(result: dict) -> str:
    lines = [f"### {result['size']}: {result['layers']} blocks of width {result['width']} ({result['heads']} heads of "
             f"128), latent {result['latent'][0]}x{result['latent'][1]} = {result['tokens_per_frame']} tokens per frame, "
             f"text 512 rows, {result['chunks']} chunks x 5 calls, window {result['window']}, {result['repeats']} "
             f"interleaved repeats", "",
             f"| loop | {result.get('timer', 'CPU s')} / chunk (median) | x plain sliding (median) | x plain sliding (min) "
             f"| wall s / chunk |",
             "| --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        lines.append(f"| {row['config']} | {row.get('s_per_chunk', row['cpu_s_per_chunk']):.4f} | {row['ratio_vs_plain_sliding']:.3f} | "
                     f"{row['min_ratio_vs_plain_sliding']:.3f} | {row['wall_s_per_chunk']:.4f} |")
    if result["hook_sliding_vs_plain_max_abs_diff"] is not None:
        lines += ["", f"hook `sliding` vs plain sliding, latents: max |diff| = "
                      f"{result['hook_sliding_vs_plain_max_abs_diff']:.2e} (relative vs absolute RoPE positions)"]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--writers", default="sliding,sink,field,landmark,full")
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=int, default=6)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU runbook's: wall seconds, bf16)")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                        help="auto = bfloat16 on cuda, float32 on a CPU")
    parser.add_argument("-o", "--output", type=Path, default=None, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else (
        torch.float32 if args.device == "cpu" else torch.bfloat16)
    results = [measure(s, args.writers.split(","), args.chunks, args.repeats, args.window, args.device, dtype)
               for s in args.sizes.split(",")]
    import diffusers

    where = (f"CPU: {cpu_name()}, {torch.get_num_threads()} torch thread(s)" if args.device == "cpu"
             else f"GPU: {torch.cuda.get_device_name(torch.device(args.device))}")
    meta = {"device": where, "torch": torch.__version__,
            "diffusers": diffusers.__version__, "python": platform.python_version(),
            "command": "OMP_NUM_THREADS=1 python benchmarks/diffusers_hook_cost.py "
            + " ".join(sys.argv[1:] if argv is None else argv)}
    text = "\n\n".join(markdown(r) for r in results)
    print(text)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
        (args.output / "results.md").write_text(f"Device: {meta['device']}; torch {meta['torch']}, diffusers "
                                                f"{meta['diffusers']}\n\n{text}\n")
    return results


if __name__ == "__main__":
    main()
