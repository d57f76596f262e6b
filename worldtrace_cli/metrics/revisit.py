"""Which frames of a rollout show the same place: revisit pairs from a trajectory's waypoint labels
or from poses dead-reckoned out of its actions by the one motion model (paper §5.1, PAC pairing;
``docs/metrics.md``). Re-exported by :mod:`worldtrace_cli.metrics`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..trajectory.actions import chunk_rows
from ..world.motion import dead_reckon

if TYPE_CHECKING:
    from ..trajectory.actions import ActionPlan


# --------------------------------------------------------------------------- dead reckoning


def _wrap_deg(d):
    """Angle difference(s) wrapped to [-180, 180)."""
    return (d + 180.0) % 360.0 - 180.0


def pairs_from_poses(poses: torch.Tensor, num_chunks: int, pos_tol: float = 0.5,
                     angle_tol: float = 15.0, frames_per_chunk: int = 3) -> list[tuple[int, int]]:
    """Revisits found from dead-reckoned poses: ``[(forward_chunk, return_chunk), ...]``.

    A chunk's pose is the mean of its rows' poses. Later chunk j is paired with the EARLIEST
    earlier chunk i such that

    - the poses match: ``|xy_j - xy_i| <= pos_tol`` units, and the yaw (wrapped) and pitch
      differences are each <= ``angle_tol`` degrees; and
    - the path left in between (departure rule): along the per-row path from the centre row of
      chunk i to the centre row of chunk j, the detour ``path length - |displacement|`` is
      >= ``pos_tol`` units, or the angular detour ``sum |d yaw| + |d pitch| - (|wrapped d yaw| +
      |d pitch|)`` is >= ``angle_tol`` degrees. A standing camera, or one that walks on (however
      slowly) or stops, has no detour and makes no pairs; a path that turns back (ABA's turning
      chunks L-1 and L: detour 1 unit) or pans back (pan_90's chunks 1 and 2: 37.5 deg) does.

    Args:
        poses: float64 ``[R, 4]`` from :func:`dead_reckon`, R >= rows of ``num_chunks`` chunks.
        frames_per_chunk: latent frames per chunk of the layout (3 MG2, 4 LingBot).

    Returns:
        ``[(i, j), ...]`` sorted, i < j.
    """
    poses = poses.to(torch.float64)
    spans = [chunk_rows(c, frames_per_chunk) for c in range(num_chunks)]
    means = torch.stack([poses[s:e].mean(0) for s, e in spans])
    centre = [(s + e - 1) // 2 for s, e in spans]
    step = poses[1:] - poses[:-1]
    # Cumulative path lengths so that any detour is two lookups.
    trans = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(step[:, :2].norm(dim=1), 0)])
    turn = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(step[:, 2:].abs().sum(1), 0)])
    pairs = []
    for j in range(1, num_chunks):
        d = means[:j] - means[j]
        close = ((d[:, :2].norm(dim=1) <= pos_tol) & (_wrap_deg(d[:, 2]).abs() <= angle_tol)
                 & (d[:, 3].abs() <= angle_tol))
        for i in torch.nonzero(close).flatten().tolist():
            a, b = centre[i], centre[j]
            move = poses[b] - poses[a]
            t_detour = trans[b] - trans[a] - move[:2].norm()
            a_detour = turn[b] - turn[a] - (_wrap_deg(move[2]).abs() + move[3].abs())
            if t_detour >= pos_tol or a_detour >= angle_tol:
                pairs.append((i, j))
                break
    return sorted(pairs)


# --------------------------------------------------------------------------- waypoint pairing


def pairs_from_waypoints(plan: ActionPlan) -> list[tuple[int, int]]:
    """Revisits found from waypoint labels: ``[(forward_chunk, return_chunk), ...]``, sorted.

    Legs: consecutive waypoints ``(c1, X)``, ``(c2, Y)`` with c2 > c1 make a leg X->Y over chunks
    [c1, c2). A later leg over the same two labels is paired with the EARLIEST such leg, chunk by
    chunk, stretched to the earlier leg's length:

    - traversed back (Y->X over [s2, e2) after X->Y over [s1, e1)): chunk s1+i with
      ``e2 - 1 - round(i * (len2 - 1) / (len1 - 1))`` (reversed: ABA with L chunks each way gives
      exactly (i, 2L-1-i));
    - traversed again in the same direction (ABABA's second A->B): s1+i with
      ``s2 + round(i * (len2 - 1) / (len1 - 1))``.

    Also, for every label reached again, the first chunk at the label is paired with the last
    chunk of the leg that arrives there again (ABCA: (0, 16); pan_360: (0, 7)). A label reached at
    the end (chunk == num_chunks) thus counts. Duplicates are removed; pairs are (earlier, later).
    """
    points = [(c, label) for c, label in plan.waypoints]
    legs = [(c1, c2, x, y) for (c1, x), (c2, y) in zip(points, points[1:]) if c2 > c1]
    pairs: set[tuple[int, int]] = set()
    for k, (s2, e2, x2, y2) in enumerate(legs):
        for s1, e1, x1, y1 in legs[:k]:
            if {x1, y1} != {x2, y2}:
                continue
            reverse = (x1, y1) == (y2, x2) and x1 != y1
            len1, len2 = e1 - s1, e2 - s2
            for i in range(len1):
                offset = 0 if len1 == 1 else round(i * (len2 - 1) / (len1 - 1))
                pairs.add((s1 + i, e2 - 1 - offset if reverse else s2 + offset))
            break
    first: dict[str, int] = {}
    for k, (c, label) in enumerate(points):
        if label not in first:
            first[label] = c
        elif k > 0 and c > points[k - 1][0] and c - 1 > first[label]:
            pairs.add((first[label], c - 1))
    return sorted(p for p in pairs if p[0] < p[1] < plan.num_chunks)


def pairs_from_prompts(prompts: list) -> list[tuple[int, int]]:
    """Revisits of a prompt-segment plan (text-to-video, LoopBench for prompts): ``[(first, return), ...]``.

    The chunks form runs of one prompt. A run whose prompt an earlier run had (another prompt came in
    between: A -> B -> A) is paired with the EARLIEST such run, chunk by chunk from their starts: the
    return's i-th chunk with the first run's i-th chunk, for i below both lengths. A scene, a detour,
    the first prompt again: the return is scored against the first A segment (docs/selfforcing.md).
    """
    runs: list[tuple[int, int, object]] = []  # [start, end) of each run of one prompt
    for c, prompt in enumerate(prompts):
        if runs and runs[-1][2] == prompt:
            runs[-1] = (runs[-1][0], c + 1, prompt)
        else:
            runs.append((c, c + 1, prompt))
    pairs = []
    for k, (s2, e2, prompt) in enumerate(runs):
        first = next(((s1, e1) for s1, e1, p in runs[:k] if p == prompt), None)
        if first is not None:
            pairs += [(first[0] + i, s2 + i) for i in range(min(first[1] - first[0], e2 - s2))]
    return sorted(pairs)


def first_visit_frames(plan: ActionPlan, chunk_pairs, pos_tol: float = 0.5,
                       angle_tol: float = 15.0) -> dict[int, set[int]]:
    """Per return chunk of ``chunk_pairs`` (``(first visit, return)`` chunk pairs of :func:`revisit_pairs`),
    the latent frames taken at the place it returns to: the frames up to the end of the last chunk it
    is paired with whose camera pose (the mean over the pixel frames each decodes to,
    :func:`~worldtrace_cli.world.motion.frame_poses`) matches the return chunk's mean pose within
    ``pos_tol`` units and ``angle_tol`` degrees of yaw and of pitch (:func:`pairs_from_poses`' test),
    and the paired chunks' own frames. For a prompt loop (``plan.prompts``, text-to-video) the frames
    of the whole first segment of the return's prompt (LoopBench's "slots from the first A segment").
    Used for recall attention (:func:`~worldtrace_cli.outputs.records.recall_attention`).

    Returns:
        ``{return chunk: set of latent-frame indices}``.
    """
    from ..outputs.records import latent_pixel_frames
    from ..world.motion import frame_poses

    fpc = plan.frames_per_chunk
    firsts: dict[int, list[int]] = {}
    for first, ret in chunk_pairs:
        firsts.setdefault(int(ret), []).append(int(first))
    out: dict[int, set[int]] = {}
    if plan.prompts is not None:  # the whole first segment of each paired chunk's prompt
        prompts = plan.prompts
        for ret, chunks in firsts.items():
            frames = out.setdefault(ret, set())
            for first in chunks:
                lo = hi = first
                while lo > 0 and prompts[lo - 1] == prompts[first]:
                    lo -= 1
                while hi + 1 < len(prompts) and prompts[hi + 1] == prompts[first]:
                    hi += 1
                frames.update(range(fpc * lo, fpc * (hi + 1)))
        return out
    poses = frame_poses(plan.mode, plan.keyboard, plan.mouse)  # [R, 4] per pixel frame
    for ret, chunks in firsts.items():
        s, e = chunk_rows(ret, fpc)
        target = poses[s:min(e, len(poses))].mean(0)
        frames = {f for c in chunks for f in range(fpc * c, fpc * (c + 1))}
        for f in range(fpc * (max(chunks) + 1)):
            rows = [r for r in latent_pixel_frames(f) if r < len(poses)]
            d = poses[rows].mean(0) - target
            if (float(d[:2].norm()) <= pos_tol and abs(float(_wrap_deg(d[2]))) <= angle_tol
                    and abs(float(d[3])) <= angle_tol):
                frames.add(f)
        out[ret] = frames
    return out


def _frame_pairs(chunk_pairs, frames_per_chunk: int = 3) -> list[tuple[int, int]]:
    """Pixel-frame pairs of chunk pairs: frame k of one with frame k of the other, aligned at the
    chunks' ends (chunk 0 has 9 frames, later chunks 12; LingBot 13 and 16)."""
    out = []
    for a, b in chunk_pairs:
        (sa, ea), (sb, eb) = chunk_rows(a, frames_per_chunk), chunk_rows(b, frames_per_chunk)
        n = min(ea - sa, eb - sb)
        out += [(ea - n + k, eb - n + k) for k in range(n)]
    return out


def revisit_pairs(plan: ActionPlan) -> dict:
    """Revisited chunks and pixel frames of a plan, for :func:`pac`.

    Returns ``{"source": "prompts"|"waypoints"|"poses"|"none", "chunk_pairs": [(fwd, ret), ...],
    "frame_pairs": [(fwd_frame, ret_frame), ...]}``: :func:`pairs_from_prompts` for a prompt-segment
    plan (text-to-video), else :func:`pairs_from_waypoints` when some label occurs twice, else
    :func:`pairs_from_poses` on :func:`dead_reckon`; "none" when none finds a pair. Frame pairs:
    each chunk pair's frames matched index by index, aligned at the ends.
    """
    labels = [label for _, label in plan.waypoints]
    if plan.prompts is not None:
        chunk_pairs, source = pairs_from_prompts(plan.prompts), "prompts"
    elif len(set(labels)) < len(labels):
        chunk_pairs, source = pairs_from_waypoints(plan), "waypoints"
    else:
        chunk_pairs, source = pairs_from_poses(dead_reckon(plan), plan.num_chunks,
                                               frames_per_chunk=plan.frames_per_chunk), "poses"
    if not chunk_pairs:
        source = "none"
    return {"source": source, "chunk_pairs": chunk_pairs,
            "frame_pairs": _frame_pairs(chunk_pairs, plan.frames_per_chunk)}


__all__ = ["first_visit_frames", "pairs_from_poses", "pairs_from_prompts", "pairs_from_waypoints", "revisit_pairs"]
