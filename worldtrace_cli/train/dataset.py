"""Encoded training clips of the procedural world for the DiT: render, encode once, train many times.

Encoding is the expensive part (the VAE costs ~6x a DiT training step per clip), so
``worldtrace train encode`` writes clips to shard files that ``worldtrace train dit`` reads (and
re-reads as more appear, so both can run side by side on two cores).

A clip is 3 chunks = 9 latent frames of a rollout at absolute latent frames ``a .. a + 8``:

- ``early`` (a = 0): the rollout's first chunks. Pixel frame 0 is the start image; the
  conditioning latents are :func:`~worldtrace_cli.model.vae.encode_conditioning_latents` of it,
  exactly as inference computes them.
- ``late`` (a = :data:`LATE_START`): chunks far into a rollout, where MG2's conditioning channels
  have become the constant encoding of blank frames (:func:`late_conditioning`) and the start image
  (the view at the origin facing +y, as in inference) reaches the model only through CLIP.
  Rendered with 8 lead-in action rows, and encoded from 37 pixel frames of which the first latent
  (a lone causal first frame, never seen mid-rollout) is dropped.

Most clips are loops (look away and back: :func:`~worldtrace_cli.train.data.loop_actions`) placed
so that the pose at the first frame of the second chunk is reached again at the clip's last pixel
frame (or, with ``ClipMix.vary_return``, a pose of an earlier chunk at a random later latent frame);
the rest are random walks.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .common import save_safetensors_atomic
from .rendering import (CLIP_CHUNKS, LATE_START, LATE_WARMUP_FRAMES, RenderedClip, render_clip_frames,
                        render_shard_clips, rendered_in_workers)

SHARD_CLIPS = 32


@dataclass
class EncodedClip:
    """One training clip as the DiT trainer reads it.

    Attributes:
        latents: float32 [16, 9, h, w] normalised latents of absolute latent frames a .. a + 8 (3 chunks;
            [16, 3 n, h, w] for a clip of n chunks).
        frame_start: a (0 or :data:`LATE_START`).
        keyboard, mouse: float32 [R, 4] / [R, 2] action rows from absolute row ``rows_start``
            (``max(0, 4a - 12)``: the first row latent frame a reads) to the clip's end.
        rows_start: absolute row index of ``keyboard[0]``.
        image_latents: float32 conditioning latents of the same frames (early: they start at frame 0)
            or None (late: the constant of :func:`late_conditioning`).
        clip_tokens: float32 [257, clip_dim] CLIP conditioning tokens of the start image.
        return_latent: index (0..8) of the latent frame whose last pixel frame returns to the loop's
            first pose, or -1 (walk).
        world_seed: the world it shows.
    """

    latents: torch.Tensor
    frame_start: int
    keyboard: torch.Tensor
    mouse: torch.Tensor
    rows_start: int
    image_latents: torch.Tensor | None
    clip_tokens: torch.Tensor
    return_latent: int
    world_seed: int

    def action_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keyboard [1, R_abs, 4] and mouse [1, R_abs, 2] indexed by absolute row (zeros before
        ``rows_start``, which no latent frame of the clip reads), on the rows' device."""
        pad = self.rows_start
        kb = torch.cat([self.keyboard.new_zeros(pad, 4), self.keyboard])[None]
        ms = torch.cat([self.mouse.new_zeros(pad, 2), self.mouse])[None]
        return kb, ms

    def to(self, device: torch.device | str) -> "EncodedClip":
        """A copy with every tensor on ``device`` (the clip itself when they already are)."""
        if self.latents.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return EncodedClip(move(self.latents), self.frame_start, move(self.keyboard), move(self.mouse), self.rows_start,
                           move(self.image_latents), move(self.clip_tokens), self.return_latent, self.world_seed)


@torch.no_grad()
def late_conditioning(vae) -> torch.Tensor:
    """The conditioning latents of any late frame: float32 [1, 16, 1, h, w], the normalised encoding
    of a blank frame past the encoder's receptive field (equal for every start image)."""
    from ..model.vae import CONDITIONING_ENCODE_LATENT_FRAMES, encode_conditioning_latents

    p = next(vae.parameters())
    h, w = vae_frame_shape(vae)
    image = torch.zeros(1, 3, h, w, dtype=p.dtype)
    lat = encode_conditioning_latents(vae, image, CONDITIONING_ENCODE_LATENT_FRAMES)
    return lat[:, :, -1:].float().cpu().contiguous()


LATE_CONDITIONING_FILE = "late_conditioning.safetensors"


def store_late_conditioning(folder: Path, vae) -> Path:
    """``folder/late_conditioning.safetensors`` (:func:`late_conditioning` of ``vae`` under the key
    ``latents``), written atomically when the folder has none yet; returns its path."""
    path = Path(folder) / LATE_CONDITIONING_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_safetensors_atomic({"latents": late_conditioning(vae)}, path)
    return path


def vae_frame_shape(vae) -> tuple[int, int]:
    """(height, width) in pixels the trainer renders at (attached by :func:`make_encoder`)."""
    return vae._loopworld_frame_shape


def make_encoder(vae_weights, clip_seed: int, height: int, width: int):
    """(vae, clip_tower) on the CPU in float32 for encoding clips: the trained loopworld VAE and the
    tiny frozen CLIP tower of seed ``clip_seed`` (what the loopworld preset ships)."""
    from ..model.image_encoder import build_clip_tower
    from ..model.vae import build_wan_vae

    vae = build_wan_vae("loopworld", vae_weights)
    vae._loopworld_frame_shape = (height, width)
    return vae, build_clip_tower("tiny", None, seed=clip_seed)


def _to_video(frames: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """uint8 [T, H, W, 3] -> float32 [1, 3, T, H, W] in [-1, 1] on ``device`` (moved there as uint8:
    a quarter of float32's bytes, and the conversion runs there)."""
    video = torch.from_numpy(frames).to(device)
    return video.permute(3, 0, 1, 2).float().div(127.5).sub(1.0)[None]


@torch.no_grad()
def encode_frames(vae, frames: np.ndarray) -> torch.Tensor:
    """The VAE's normalised latents of a video, as training clips are encoded: the posterior's mode
    of uint8 frames [1 + 4 k, H, W, 3] (encoded where the VAE is), normalised with Wan's per-channel
    mean and std (MG2 spec §14; :func:`~worldtrace_cli.model.vae.encode_video`): float32
    [1, 16, 1 + k, H / 8, W / 8] on the CPU."""
    from ..model.vae import encode_video

    return encode_video(vae, _to_video(frames, next(vae.parameters()).device)).cpu()


@torch.no_grad()
def make_clip(rng: np.random.Generator, vae, clip_tower, late: bool, loop: bool,
              max_angle_deg: float = 90.0, chunks: int = CLIP_CHUNKS, vary_return: bool = False,
              world: str = "procedural") -> EncodedClip:
    """Render and encode one clip (see the module docstring) of ``chunks`` chunks (3 for training;
    longer for the drift test): :func:`~worldtrace_cli.train.rendering.render_clip_frames` (where the
    loop's return is placed) then :func:`encode_rendered`. Deterministic given ``rng``'s state."""
    rendered = render_clip_frames(rng, late, loop, *vae_frame_shape(vae), max_angle_deg, chunks, vary_return, world)
    return encode_rendered(vae, clip_tower, [rendered])[0]


@torch.no_grad()
def encode_rendered(vae, clip_tower, rendered: list[RenderedClip], max_batch: int = 1) -> list[EncodedClip]:
    """Encode rendered clips where the VAE and the CLIP tower are, up to ``max_batch`` clips of the same
    length per VAE call (batches change only float rounding; on a GPU they save kernel launches,
    on a CPU memory is better spent on one clip at a time).

    Per clip: :func:`encode_frames` of its frames, less its first ``drop_latents`` latent frames
    (float32 [16, 3 C, h, w], h, w = H/8, W/8: [16, 9, h, w] for a training clip); for an early clip,
    MG2's conditioning latents of its start image
    (:func:`~worldtrace_cli.model.vae.encode_conditioning_latents`, float32 [16, 3 C, h, w]); CLIP's
    conditioning tokens of the start image (float32 [257, clip_dim]). Returns the
    :class:`EncodedClip` s in the order given, every tensor float32 on the CPU, each its own storage.

    Raises:
        ValueError: ``max_batch`` < 1.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    from ..model.vae import encode_conditioning_latents, encode_video

    p = next(vae.parameters())
    latents: list = [None] * len(rendered)
    image_latents: list = [None] * len(rendered)
    tokens: list = [None] * len(rendered)

    def batches(key):  # indices of clips that share key(clip), in groups of at most max_batch
        groups: dict = {}
        for i, r in enumerate(rendered):
            groups.setdefault(key(r), []).append(i)
        for k, idx in groups.items():
            for s in range(0, len(idx), max_batch):
                yield k, idx[s:s + max_batch]

    for _, idx in batches(lambda r: r.frames.shape):
        z = encode_video(vae, torch.cat([_to_video(rendered[i].frames, p.device) for i in idx]).to(p.dtype)).cpu()
        for b, i in enumerate(idx):
            latents[i] = z[b, :, rendered[i].drop_latents:].clone()
    images = lambda idx: torch.cat([_to_video(rendered[i].start_image[None])[:, :, 0] for i in idx])  # noqa: E731
    for n, idx in batches(lambda r: r.conditioning_frames):
        if n:
            lat = encode_conditioning_latents(vae, images(idx), n).cpu()
            for b, i in enumerate(idx):
                image_latents[i] = lat[b].clone()
    for _, idx in batches(lambda r: 0):
        t = clip_tower.conditioning_tokens(images(idx)).float().cpu()
        for b, i in enumerate(idx):
            tokens[i] = t[b].clone()
    return [EncodedClip(latents[i], r.frame_start, torch.as_tensor(r.keyboard).float(),
                        torch.as_tensor(r.mouse).float(), r.rows_start, image_latents[i], tokens[i],
                        r.return_latent, r.world_seed)
            for i, r in enumerate(rendered)]


def write_shard(path: Path, clips: list[EncodedClip], metadata: dict[str, str] | None = None) -> None:
    """Write clips to one safetensors file (float16 latents and tokens, float32 actions), atomically;
    ``metadata``: more string entries of the file's header (:func:`shard_metadata`)."""
    tensors, meta = {}, []
    for i, c in enumerate(clips):
        tensors[f"{i}.latents"] = c.latents.half()
        tensors[f"{i}.keyboard"] = c.keyboard
        tensors[f"{i}.mouse"] = c.mouse
        tensors[f"{i}.clip_tokens"] = c.clip_tokens.half()
        if c.image_latents is not None:
            tensors[f"{i}.image_latents"] = c.image_latents.half()
        meta.append({"frame_start": c.frame_start, "rows_start": c.rows_start, "return_latent": c.return_latent,
                     "world_seed": c.world_seed})
    save_safetensors_atomic(tensors, path, metadata={**(metadata or {}), "clips": json.dumps(meta)})


def shard_metadata(path: Path) -> dict[str, str]:
    """The header entries of a shard (:func:`write_shard`), ``clips`` included."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        return dict(fh.metadata() or {})


def read_shard(path: Path) -> list[EncodedClip]:
    """Clips of a shard written by :func:`write_shard` (float32 tensors)."""
    from safetensors import safe_open

    out = []
    with safe_open(str(path), "pt") as fh:
        meta = json.loads(fh.metadata()["clips"])
        names = set(fh.keys())
        for i, m in enumerate(meta):
            get = lambda k: fh.get_tensor(f"{i}.{k}").float()  # noqa: E731
            image = get("image_latents") if f"{i}.image_latents" in names else None
            out.append(EncodedClip(get("latents"), m["frame_start"], get("keyboard"), get("mouse"), m["rows_start"],
                                   image, get("clip_tokens"), m["return_latent"], m["world_seed"]))
    return out


def shard_paths(folder: Path) -> list[Path]:
    """Finished shards of a data folder, in order."""
    return sorted(Path(folder).glob("clips-*.safetensors"))


@dataclass(frozen=True)
class ClipMix:
    """Proportions of clip kinds: ``late`` (vs early) and ``loop`` (vs walk); loops turn up to
    ``max_angle_deg`` degrees and come back at the clip's last latent frame or, with ``vary_return``,
    anywhere from chunk 1's last latent frame on (:func:`make_clip`); ``world``: the style of the
    worlds rendered (:data:`~worldtrace_cli.world.scene.STYLES`)."""

    late: float = 0.7
    loop: float = 0.85
    max_angle_deg: float = 90.0
    vary_return: bool = False
    world: str = "procedural"


def _with_defaults(settings: dict) -> dict:
    """A data.json's settings with ClipMix fields added since it was written at their defaults."""
    if isinstance(settings.get("mix"), dict):
        settings["mix"] = {**asdict(ClipMix()), **settings["mix"]}
    return settings


def encode_clips(folder: Path, vae_weights, shards: int, seed: int = 0, mix: ClipMix = ClipMix(),
                 height: int = 96, width: int = 176, clip_seed: int = 2, threads: int = 1,
                 progress: bool = True, stop=lambda: False, shard_clips: int = SHARD_CLIPS, device: str = "cpu",
                 workers: int = 0) -> dict:
    """Write shards ``folder/clips-NNNNN.safetensors`` of ``shard_clips`` clips each, until
    ``shards`` exist (existing ones are kept: rerun to continue). Shard i draws from
    ``default_rng([seed, i])``, so the data do not depend on how often the command was stopped.

    Also writes ``folder/late_conditioning.safetensors`` (:func:`late_conditioning`) and
    ``folder/data.json`` (settings). ``device``: where the VAE and the CLIP tower encode (rendering
    stays on the CPU; not a setting: a folder may be continued on another device). ``workers`` > 0:
    that many processes render the shards (2 x ``workers`` shards ahead at most, ~90 MB each) while
    this one encodes each shard's clips in batches on ``device`` (off the CPU, one VAE call per clip
    length of a shard, one for the conditioning latents, one for CLIP; a stop is noticed as each
    shard arrives rather than between clips): the same clips,
    up to float rounding; for a GPU, whose single CUDA context then shares the card with a trainer
    (on CPUs only, separate ``train encode`` processes of other seeds are faster). Returns
    ``{"shards": n, "clips": n * shard_clips}``.
    Raises:
        InputError: the folder holds shards made with other settings or another VAE file (a folder
            without shards takes the new settings).
        CheckpointError: ``vae_weights`` cannot be read as the VAE (raised before ``folder`` is made).
    """
    from tqdm import tqdm

    from ..errors import InputError, Interrupted
    from ..model.checkpoint import file_identity

    torch.set_num_threads(threads)
    folder = Path(folder)
    settings = {"seed": seed, "mix": asdict(mix), "height": height,
                "width": width, "clip_seed": clip_seed, "vae": file_identity(vae_weights)["sha256_first_mib"],
                "late_start": LATE_START, "late_warmup_frames": LATE_WARMUP_FRAMES, "clip_chunks": CLIP_CHUNKS,
                "shard_clips": shard_clips}
    info = folder / "data.json"
    # only shards bind a folder to its settings: a data.json left by a run that wrote none (a VAE file
    # that failed to load, a stop during the first shard) is replaced
    done = len(shard_paths(folder)) if folder.is_dir() else 0
    if done and info.exists() and _with_defaults(json.loads(info.read_text())) != settings:
        raise InputError(f"{folder}: holds clips made with other settings or another VAE; use another folder")
    vae, tower = make_encoder(vae_weights, clip_seed, height, width)  # before the folder: a bad file makes none
    folder.mkdir(parents=True, exist_ok=True)
    if not done:  # its late conditioning may be another VAE's or size's: made anew below
        (folder / LATE_CONDITIONING_FILE).unlink(missing_ok=True)
    vae.to(device)
    tower.to(device)
    store_late_conditioning(folder, vae)
    info.write_text(json.dumps(settings, indent=2) + "\n")  # once the VAE has loaded and encoded
    args = lambda i: (seed, i, shard_clips, height, width, mix.late, mix.loop, mix.max_angle_deg,  # noqa: E731
                      mix.vary_return, mix.world)
    stopped = lambda i: Interrupted(f"encoding stopped with {i} shards; run the same command to continue")  # noqa: E731
    bar = tqdm(total=shards, initial=done, disable=not progress, unit="shard", dynamic_ncols=True)
    if workers:
        for i, rendered in rendered_in_workers(workers, args, range(done, shards), stop, stopped):
            write_shard(folder / f"clips-{i:05d}.safetensors",
                        encode_rendered(vae, tower, rendered, 1 if str(device) == "cpu" else shard_clips))
            bar.update(1)
    else:
        for i in range(done, shards):
            clips = []
            for rendered in render_shard_clips(*args(i)):
                if stop():
                    raise stopped(i)
                clips += encode_rendered(vae, tower, [rendered])
            write_shard(folder / f"clips-{i:05d}.safetensors", clips)
            bar.update(1)
    bar.close()
    return {"shards": shards, "clips": shards * shard_clips}
