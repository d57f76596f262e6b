"""The CPU half of a training clip: its random layout, actions and rendered frames, before the VAE.

:func:`render_clip_frames` draws everything a clip needs from a numpy ``Generator`` and renders its
pixel frames; :func:`~worldtrace_cli.train.dataset.encode_rendered` encodes them. The two halves are
apart so that ``worldtrace train encode --workers N`` can render in N processes (torch's DataLoader
workers, one core each) while one process encodes their clips in batches on a GPU: one CUDA context
beside the trainer's instead of one per encoding process, and rendering (~0.1 s a clip on one core)
rather than the VAE (~0.4 s a clip on one core) sets the pace. Both paths draw the same numbers in
the same order, so a shard holds the same clips however it was made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch.utils.data import DataLoader, Dataset

from ..trajectory import frames_for_chunks
from .data import loop_actions, random_start_pose, render_clip, walk_actions

LATE_START = 30            # absolute latent frame of a late clip (conditioning constant from ~21 on)
CLIP_CHUNKS = 3
LEAD_ROWS = 8              # action rows before a late clip's first pixel frame (read by its first latents)
LATE_WARMUP_FRAMES = 16    # pixel frames encoded before a late clip and dropped: the codec's causal caches
                           # take ~5 latent frames to reach their steady state, which is what a late frame sees


@dataclass
class RenderedClip:
    """A training clip rendered on the CPU, not yet encoded (see the dataset module's docstring).

    Attributes:
        frames: uint8 [1 + 4 k, H, W, 3], the pixel frames the VAE encodes (33 for an early clip of 3
            chunks; a late clip's 16 warm-up frames, its lone first frame and its 36 frames: 53).
        drop_latents: latent frames dropped from the front of their encoding (late: the lone causal
            first frame and the warm-up's 4; early: 0).
        start_image: uint8 [H, W, 3], the rollout's start image (CLIP's input; early clips also encode
            it as MG2's conditioning latents).
        conditioning_frames: latent frames of conditioning latents to encode from ``start_image``
            (early: 3 C), or 0 (late: the folder's constant late conditioning).
        keyboard, mouse: float32 [R, 4] / [R, 2] action rows from absolute row ``rows_start``.
        rows_start, frame_start, return_latent, world_seed: as in
            :class:`~worldtrace_cli.train.dataset.EncodedClip`.
    """

    frames: np.ndarray
    drop_latents: int
    start_image: np.ndarray
    conditioning_frames: int
    keyboard: np.ndarray
    mouse: np.ndarray
    rows_start: int
    frame_start: int
    return_latent: int
    world_seed: int


def render_clip_frames(rng: np.random.Generator, late: bool, loop: bool, height: int, width: int,
                       max_angle_deg: float = 90.0, chunks: int = CLIP_CHUNKS, vary_return: bool = False,
                       world: str = "procedural") -> RenderedClip:
    """Draw and render one clip of ``chunks`` chunks at ``height`` x ``width`` pixels (deterministic given
    ``rng``'s state; the draws of :func:`~worldtrace_cli.train.dataset.make_clip`).

    A loop comes back at the clip's last latent frame (``return_latent`` 3C - 1) from the first pixel
    frame of chunk 1, or, with ``vary_return``, at a random latent frame from 5 (chunk 1's last) to
    3C - 1 from a random pose of an earlier chunk (at least 12 pixel frames before), and walks on
    after it: the return is then placeable only by reading the actions, not by its place in the clip.
    """
    world_seed = int(rng.integers(2**31))
    origin = rng.random() < 0.5 and not late
    start = (0.0, 0.0, 0.0, 0.0) if origin else random_start_pose(rng)
    lead = LEAD_ROWS if late else 0
    warm = LATE_WARMUP_FRAMES if late else 0
    pixels = frames_for_chunks(chunks) + (4 + lead + warm if late else 0)   # 33, or 8 + 16 + 37 for late
    return_latent = -1
    if loop:
        off = lead + warm + (4 if late else 0)       # latent frame j of the clip ends at pixel frame off + 4j
        if vary_return:
            return_latent = int(rng.integers(5, 3 * chunks))          # chunk 1's last latent .. the clip's last
            end = off + 4 * return_latent
            latest = min(end - 12, off + 4 * (3 * (return_latent // 3) - 1))   # a pose of an earlier chunk
            p_frame = int(rng.integers(off + 1, latest + 1))
        else:
            return_latent = 3 * chunks - 1
            end = pixels - 1
            p_frame = off + 9                        # first pixel frame of the clip's second chunk
        keyboard, mouse, _ = loop_actions(rng, pixels, p_frame, end, max_angle_deg)
    else:
        keyboard, mouse = walk_actions(rng, pixels)
    clip = render_clip(world_seed, keyboard, mouse, height, width, start, world)
    if late:
        from ..world.render import render_view
        from ..world.scene import make_world

        start_image = render_view(make_world(world_seed, style=world), (0.0, 0.0, 0.0, 0.0), height, width)
        # sequence frame k is absolute pixel frame k + 4a - 12 - warm (encoded latent j <-> absolute
        # latent a + j - 1 - warm/4), so absolute latent a reads rows 4a-12 .. 4a-1 = sequence rows
        # warm .. warm+11: the clip keeps its rows from there
        return RenderedClip(clip.frames[lead:], 1 + warm // 4, start_image, 0, keyboard[warm:], mouse[warm:],
                            4 * LATE_START - 12, LATE_START, return_latent, world_seed)
    return RenderedClip(clip.frames, 0, clip.frames[0], 3 * chunks, keyboard, mouse, 0, 0, return_latent, world_seed)


def render_shard_clips(seed: int, index: int, clips: int, height: int, width: int, late: float, loop: float,
                       max_angle_deg: float, vary_return: bool, world: str):
    """The clips of shard ``index`` of a data folder of seed ``seed``, rendered one at a time (a
    generator): each draws "late?" with probability ``late``, then "loop?" with probability ``loop``,
    then its layout, from ``default_rng([seed, index])`` (what ``worldtrace train encode`` writes)."""
    rng = np.random.default_rng([seed, index])
    for _ in range(clips):
        is_late = rng.random() < late
        is_loop = rng.random() < loop
        yield render_clip_frames(rng, is_late, is_loop, height, width, max_angle_deg, vary_return=vary_return,
                                 world=world)


class _ShardRenders(Dataset):
    """Shard renders as a map-style dataset for torch's DataLoader: item k is (i, the rendered clips
    of shard i, a list) for the k-th of ``jobs`` = [(i, :func:`render_shard_clips`'s arguments), ...]
    (plain values, so it pickles where workers are spawned)."""

    def __init__(self, jobs):
        self.jobs = jobs

    def __len__(self):
        return len(self.jobs)

    def __getitem__(self, k):
        i, args = self.jobs[k]
        return i, list(render_shard_clips(*args))


def _as_is(item):
    return item


def _end_with_parent(_worker_id: int) -> None:
    """A render worker's init: end it (``os._exit``) within a second of the encoding process's death.
    The DataLoader's own watch notices only between items and then waits for ever to flush a shard
    (tens of MB) into a pipe nobody reads (seen with SIGKILL). Also: Ctrl-C is the encoding
    process's to handle (it stops the workers), and SIGTERM ends a worker at once (a forked worker
    would otherwise inherit ``train encode``'s stop flag and outlive the first one)."""
    import os
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def rendered_in_workers(workers: int, args, indices, stop, stopped):
    """(i, the clips of :func:`render_shard_clips` of ``args(i)``) for i in ``indices``, in order,
    rendered by ``workers`` processes of torch's DataLoader (at most 2 shards queued each; one torch
    thread each; they end within a second when this process dies; ``train encode --workers``).
    ``stop()`` is asked as each shard arrives (after Ctrl-C: once the caller has encoded the shard it holds and the next
    one is rendered); when it says stop, raises ``stopped(i)`` and the workers are shut down.

    Raises:
        whatever ``stopped(i)`` returns (``Interrupted`` from ``train encode``); a worker's exception
        (re-raised by the DataLoader, naming the worker).
    """
    loader = DataLoader(_ShardRenders([(i, args(i)) for i in indices]), batch_size=None,
                        num_workers=workers, prefetch_factor=2, collate_fn=_as_is,
                        worker_init_fn=_end_with_parent)
    it = iter(loader)
    try:
        for i, rendered in it:
            if stop():
                raise stopped(i)
            yield i, rendered
    finally:
        del it  # its last reference: the DataLoader shuts its workers down now, not at some later collection


__all__ = ["CLIP_CHUNKS", "LATE_START", "RenderedClip", "render_clip_frames", "render_shard_clips",
           "rendered_in_workers"]
