"""A chunk's conditioning as an argument: :class:`ChunkRequest` (what one chunk takes, in the trajectory
format's terms) and :class:`ConditioningFeed`, which turns a growing
:class:`~worldtrace_cli.trajectory.actions.ActionPlan` into one request per chunk.

``generate`` feeds its trajectory's plan; a live session feeds the plan its actions grow chunk by chunk.
Either way :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.step` receives the chunk's request and the
rollout turns it into its backbone's inputs (MG2: the action rows the chunk reads; LingBot-World: its
camera; Self-Forcing: its prompt). A request holds views of the plan's rows and of the poses so far: a
step costs the same at chunk 500 as at chunk 10.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkRequest:
    """What chunk ``chunk`` is conditioned on.

    Attributes:
        chunk: the chunk's index; its latent frames are ``F * chunk .. F * chunk + F - 1``.
        keyboard: float32 [n, keyboard_dim] action rows (pixel frames) ``first_row .. first_row + n - 1``:
            every row the chunk reads (MG2 reads 12 rows back from each latent frame) up to its last.
        mouse: float32 [n, 2] (pitch, yaw) of the same rows, or None (no mouse in the mode).
        first_row: the absolute pixel-frame index of ``keyboard[0]``.
        poses: float64 [N, 4, 4] camera-to-world pose of every latent frame up to the chunk's last (the
            motion model's, :class:`~worldtrace_cli.world.motion.PoseTrack`), or None (no camera).
        prompt: the chunk's prompt (prompt segments), else None; previous_prompt: the chunk before's
            (:attr:`switches` is the one test of a prompt switch).
    """

    chunk: int
    keyboard: torch.Tensor | None = None
    mouse: torch.Tensor | None = None
    first_row: int = 0
    poses: torch.Tensor | None = None
    prompt: str | None = None
    previous_prompt: str | None = None

    @property
    def switches(self) -> bool:
        """True when the chunk's prompt is not the chunk before's (a prompt switch; never at chunk 0 or
        without prompts)."""
        return self.chunk > 0 and self.prompt is not None and self.prompt != self.previous_prompt


ROWS_BACK = 12  # rows an MG2 latent frame reads before its own (the action module's window, MG2 spec §8)


class ConditioningFeed:
    """One :class:`ChunkRequest` per chunk from an ActionPlan that may grow between calls (a session's).

    The one way a rollout is fed: ``generate``, sessions and ``bench speed`` build one over their plan
    (:meth:`~worldtrace_cli.engine.base.PipelineBase.feed`); a rollout built from a whole run's inputs (a
    fixture replay) holds one made by :meth:`whole`.

    Args:
        plan: the :class:`~worldtrace_cli.trajectory.actions.ActionPlan` (its rows, prompts).
        camera: give each request the latent frames' poses (a backbone with a camera); the poses are
            integrated once per row, as rows arrive.
    """

    def __init__(self, plan, camera: bool = True):
        from ..world.motion import PoseTrack

        self.plan, self._whole = plan, None
        self.track = PoseTrack(plan.mode) if camera and plan.mode != "text" else None

    @classmethod
    def whole(cls, keyboard=None, mouse=None, poses=None, prompts: list | None = None) -> "ConditioningFeed":
        """A feed of a whole run's inputs as given (a fixture replay's): every request holds all the rows
        from row 0 (keyboard float32 [R, kd], mouse [R, 2] or None), all the ``poses`` (float64 [N, 4, 4],
        or None) and chunk c's prompt ``prompts[min(c, len - 1)]`` (or None)."""
        feed = cls.__new__(cls)
        feed.plan, feed.track, feed._whole = None, None, (keyboard, mouse, poses, prompts)
        return feed

    def request(self, chunk: int) -> ChunkRequest:
        """Chunk ``chunk``'s request (the plan must hold its rows).

        Raises:
            ValueError: the plan holds fewer chunks.
        """
        from ..trajectory.actions import chunk_rows

        if self._whole is not None:
            keyboard, mouse, poses, prompts = self._whole
            if prompts is None:
                return ChunkRequest(chunk, keyboard, mouse, 0, poses)
            last = len(prompts) - 1
            return ChunkRequest(chunk, keyboard, mouse, 0, poses, prompts[min(chunk, last)],
                                prompts[min(chunk - 1, last)] if chunk else None)
        plan = self.plan
        if chunk >= plan.num_chunks:
            raise ValueError(f"chunk {chunk}: the plan holds {plan.num_chunks} chunks")
        start, end = chunk_rows(chunk, plan.frames_per_chunk)
        first = max(0, start - ROWS_BACK)
        keyboard = plan.keyboard[first:end] if plan.keyboard is not None else None
        mouse = None if plan.mouse is None else plan.mouse[first:end]
        poses = None
        if self.track is not None:
            self.track.extend_to(plan.keyboard, plan.mouse, end)
            poses = self.track.latent_c2w(plan.frames_per_chunk * (chunk + 1))
        prompts = plan.prompts
        return ChunkRequest(chunk, keyboard, mouse, first, poses,
                            None if prompts is None else prompts[chunk],
                            None if prompts is None or chunk == 0 else prompts[chunk - 1])

    def drop_after(self, rows: int) -> None:
        """Forget the poses past ``rows`` pixel frames (a session's failed chunk was undone)."""
        if self.track is not None:
            self.track.truncate(rows)


__all__ = ["ChunkRequest", "ConditioningFeed", "ROWS_BACK"]
