"""Benchmarks behind ``worldtrace bench``: the memory mechanism on synthetic scenes.

``mechanism``: synthetic canonical keys with scene structure (each scene a distribution of keys),
a trajectory that leaves scene A and comes back, fed chunk by chunk into every writer; then the
*return query* (a query whose canonical content matches scene A) attends through the real RoPE
code (:class:`~worldtrace_cli.model.rope.MainRope`). Reported per writer x position scheme:

* ``mismatch``: the distribution mismatch ``||alpha_hat P - alpha||_1`` of paper App. B (Prop. 2),
  where ``alpha`` is full attention over every past frame at its actual offset (an unbounded cache)
  and ``alpha_hat P`` maps the compressed cache's slot weights back onto the frames each slot
  summarises (uniform rows for averages, one-hot rows for verbatim slots; EMA slots spread their
  row over the frames they folded with the EMA weights). In [0, 2].
* ``mismatch_content``: the same with temporal RoPE removed from both sides (content only), which
  separates what compression loses from what repositioning changes.
* ``scene_a_mass``: the fraction of the return query's attention (over past slots) that lands on
  scene-A content (each slot weighted by the share of its sources that were in scene A).

Writers that retrieve by camera pose (``worldkv``, ``retrieval``) get one pose per scene (scene i at
x = 10 i, the return chunk back at scene A's): a perfect pose oracle, so their rows measure what
retrieval gives when the pose tells where the camera is, not how well it does with real poses.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from ..memory import SCHEMES, CacheGeometry, MemoryConfig, build_writer, example_specs
from ..model.rope import MainRope
from ..writer_options import settings_for

HEAD_DIM = 128


@dataclass(frozen=True)
class SceneSetup:
    """Synthetic scene structure.

    Attributes:
        tokens: tokens per latent frame (T).
        noise: per-frame key noise relative to the scene mean (unit-norm scale).
        sharpness: scale of the return query (inverse temperature of the softmax).
        queries: number of return-query samples averaged.
    """

    tokens: int = 8
    noise: float = 0.3
    sharpness: float = 4.0
    queries: int = 8
    seed: int = 0


def _scene_keys(setup: SceneSetup, scenes: list[str], gen) -> dict[str, torch.Tensor]:
    return {s: torch.randn(setup.tokens, HEAD_DIM, generator=gen) / math.sqrt(HEAD_DIM) * 4 for s in scenes}


def frame_scenes(route: str, leg_chunks: int, frames_per_chunk: int = 3) -> list[str]:
    """Scene label of every past latent frame for a loop like ``ABA``: each leg but the last lasts
    ``leg_chunks`` chunks; the query chunk is the first one back in the last scene."""
    return [s for s in route[:-1] for _ in range(leg_chunks * frames_per_chunk)]


def _projection(slots, n_frames: int, ema_weights) -> torch.Tensor:
    """P [S, N]: row i = the distribution over frames that slot i summarises."""
    p = torch.zeros(len(slots), n_frames, dtype=torch.float64)
    for i, s in enumerate(slots):
        frames = torch.tensor(s.frames)
        if s.kind == "ema":
            w = ema_weights[i]
            p[i, frames] = w / w.sum()
        else:
            p[i, frames] = 1.0 / len(frames)
    return p


def _ema_row(frames, time: float) -> torch.Tensor:
    # weights of an EMA whose effective time is `time`: alpha from the lag, geometric in age
    lag = max(1e-6, frames[-1] - time)
    alpha = 1.0 / (lag + 1.0)
    ages = torch.tensor([frames[-1] - f for f in frames], dtype=torch.float64)
    return alpha * (1 - alpha) ** ages


def evaluate(writer_name: str, scheme: str, route: str, leg_chunks: int, setup: SceneSetup,
             landmark_threshold: float = 0.1) -> dict:
    """Run one writer x scheme on one loop; return the three measures (see module docstring)."""
    gen = torch.Generator().manual_seed(setup.seed)
    labels = frame_scenes(route, leg_chunks)
    means = _scene_keys(setup, sorted(set(route)), gen)
    keys = torch.stack([means[s] + setup.noise * torch.randn(setup.tokens, HEAD_DIM, generator=gen) * means[s].std()
                        for s in labels])  # [N, T, D] canonical
    geom = CacheGeometry(num_layers=1, heads=1, head_dim=HEAD_DIM, tokens_per_frame=setup.tokens)
    tau = settings_for(writer_name, {"landmark_threshold": landmark_threshold})  # the writers with the detector
    writer = build_writer(MemoryConfig(cache=writer_name, positions=scheme, options=tau), default_budget=3)
    writer.reset(geom)
    n = len(labels)
    if writer.needs_poses:  # each scene a place: scene i at x = 10 i, the return chunk back in its scene
        names = sorted(set(route))
        poses = torch.eye(4, dtype=torch.float64).repeat(n + 3, 1, 1)
        poses[:, 0, 3] = 10.0 * torch.tensor([names.index(s) for s in labels + [route[-1]] * 3], dtype=torch.float64)
        writer.set_poses(poses)
    for start in range(0, n, 3):
        writer.begin_chunk(start)
        k = keys[start:start + 3].reshape(1, -1, 1, HEAD_DIM)
        writer.commit([(k, torch.zeros_like(k))], list(range(start, start + 3)))
    writer.begin_chunk(n)
    k_slots, _, positions = writer.read(0)
    slots = writer.slots()
    counts = writer.slot_tokens()[0]  # tokens per slot (a compressed chunk's frames keep fewer)
    rope = MainRope(HEAD_DIM)
    q = setup.sharpness * (means[route[-1]] + setup.noise * torch.randn(setup.queries, setup.tokens, HEAD_DIM,
                                                                           generator=gen) * means[route[-1]].std())
    q = q.reshape(1, -1, 1, HEAD_DIM)  # queries at offset 0
    in_a = torch.tensor([lbl == route[-1] for lbl in labels], dtype=torch.float64)
    ema = {i: _ema_row(s.frames, s.centroid) for i, s in enumerate(slots) if s.kind == "ema"}
    p = _projection(slots, n, ema)
    out = {}
    for name, rotate in (("mismatch", True), ("mismatch_content", False)):
        full_k = keys.reshape(1, -1, 1, HEAD_DIM)
        qq, kk, ks = q, full_k, k_slots
        if rotate:
            frame_pos = torch.arange(-n, 0, dtype=torch.float64)
            kk = rope.rotate_slots(full_k, frame_pos)
            # the writer's own frequencies (YaRN rescales them); the reference keeps the trained ones
            ks = rope.rotate_slots(k_slots, positions, writer.temporal_frequency_scale(), counts=counts)
        alpha = _token_attention(qq, kk, torch.full((n,), setup.tokens))      # [Q, N]
        alpha_hat = _token_attention(qq, ks, counts)  # [Q, S]
        out[name] = (alpha_hat @ p - alpha).abs().sum(-1).mean().item()
        if rotate:
            out["scene_a_mass"] = (alpha_hat @ (p @ in_a)).mean().item()
    out["slots"] = len(slots)
    return out


def _token_attention(q: torch.Tensor, k: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per query token: softmax over all key tokens, then summed per frame/slot -> [Q*T, S], where
    slot s holds ``counts[s]`` consecutive key tokens (int64 [S])."""
    scores = (q[0, :, 0].double() @ k[0, :, 0].double().T) / math.sqrt(HEAD_DIM)
    w = scores.softmax(-1)
    if len(counts) and bool((counts == counts[0]).all()):
        return w.view(w.shape[0], len(counts), int(counts[0])).sum(-1)
    owner = torch.arange(len(counts)).repeat_interleave(counts)
    return torch.zeros(w.shape[0], len(counts), dtype=w.dtype).index_add_(1, owner, w)


def mechanism_benchmark(writers: list[str] | None = None, schemes: list[str] | None = None,
                        routes: tuple[str, ...] = ("ABA", "ABCA"), legs: tuple[int, ...] = (2, 8, 32),
                        setup: SceneSetup = SceneSetup(), landmark_threshold: float = 0.1) -> list[dict]:
    """Every writer x scheme x route x leg length; returns result rows (dicts)."""
    writers = writers or example_specs()
    schemes = schemes or sorted(SCHEMES)
    rows = []
    for writer, scheme, route, leg in itertools.product(writers, schemes, routes, legs):
        rows.append({"writer": writer, "positions": scheme, "route": route, "leg_chunks": leg,
                     "landmark_threshold": landmark_threshold,
                     **evaluate(writer, scheme, route, leg, setup, landmark_threshold)})
    return rows


def markdown_table(rows: list[dict], route: str, metric: str) -> str:
    """One Markdown table: writer x scheme rows, one column per leg length."""
    legs = sorted({r["leg_chunks"] for r in rows if r["route"] == route})
    pairs = sorted({(r["writer"], r["positions"]) for r in rows if r["route"] == route})
    lines = ["| writer | positions | " + " | ".join(f"leg {leg}" for leg in legs) + " |",
             "| --- | --- | " + " | ".join("---" for _ in legs) + " |"]
    for w, s in pairs:
        vals = {r["leg_chunks"]: r[metric] for r in rows if (r["writer"], r["positions"], r["route"]) == (w, s, route)}
        lines.append(f"| {w} | {s} | " + " | ".join(f"{vals[leg]:.3f}" for leg in legs) + " |")
    return "\n".join(lines)


def write_mechanism_report(rows: list[dict], folder, stem: str = "mechanism",
                           setup: SceneSetup = SceneSetup()) -> list:
    """Write ``<stem>.json`` (rows + the ``setup`` they were made with + versions) and ``<stem>.md``
    (tables) into ``folder``; returns the two paths. Raises OSError when ``folder`` is not writable."""
    import json
    import platform
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "mechanism", "torch": torch.__version__, "python": platform.python_version(),
            "setup": setup.__dict__}
    (folder / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    parts = ["# Mechanism benchmark (synthetic scenes, real RoPE)\n",
             "Produced by `worldtrace bench mechanism`; definitions in `worldtrace_cli/jobs/bench_mechanism.py`.\n"]
    for route in sorted({r["route"] for r in rows}):
        for metric, what in (("scene_a_mass", "return-query attention mass on scene-A content (higher = recall)"),
                             ("mismatch", "distribution mismatch vs full attention at actual offsets (lower = closer)"),
                             ("mismatch_content", "distribution mismatch, temporal RoPE removed (content only)")):
            parts.append(f"\n## {route}: {metric}\n\n{what}; columns: chunks per leg.\n\n"
                         + markdown_table(rows, route, metric) + "\n")
    (folder / f"{stem}.md").write_text("".join(parts))
    return [folder / f"{stem}.json", folder / f"{stem}.md"]


# --------------------------------------------------------------------------- speed and memory
