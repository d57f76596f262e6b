"""Video metrics of a rollout and the pairing of revisited places (paper §5.1 "Metrics", §5.4).

Coherence: :func:`temp_ssim` (TempSSIM, up), :func:`scene_drift` (Local Scene Drift, down) and
:func:`latent_diff` (LatentDiff, down; the paper uses it in §5.4 without defining it, so the
definition here is ours, see ``docs/metrics.md``). Recall: :func:`pac` (Position-Aligned CLIP, up)
over the frame pairs that :func:`revisit_pairs` finds from a trajectory's waypoint labels or from
poses dead-reckoned out of its actions (:func:`dead_reckon`).

The per-frame metrics are in :mod:`worldtrace_cli.metrics.scores` and the pairing in
:mod:`worldtrace_cli.metrics.revisit` (both re-exported here); this module scores whole runs: a finished
run folder (:func:`summarise_run`) or a rollout as it goes (:class:`OnlineMetrics`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..trajectory.actions import chunk_rows, chunks_for_frames
from ..errors import InputError
from .revisit import dead_reckon, first_visit_frames, pairs_from_poses, pairs_from_waypoints, revisit_pairs
from .scores import (PSNR_CAP_DB, SSIM_BATCH_BYTES, SSIM_WINDOW, _frames_tensor, _mean, clip_embeddings, detail_ratio,
                     gt_scores, gt_summary, latent_diff, pac, scene_drift, temp_ssim)


# --------------------------------------------------------------------------- run folders


def summarise_run(run_dir: str | Path, tower=None, level: str = "fast",
                  trajectory: str | Path | None = None) -> dict:
    """Metrics of a finished or partial run folder (``video.mp4``, ``chunks.jsonl``, and
    ``summary.json`` when the run finished).

    ``level="fast"``: TempSSIM (and LatentDiff when latents are stored; run folders hold none
    today, so it is skipped with a note). ``level="all"`` adds Local Scene Drift and, when the
    trajectory revisits, PAC; it needs ``tower`` (see :func:`clip_embeddings`). The trajectory
    (for revisit pairing) is ``trajectory`` if given, else ``summary.json``'s ``config.trajectory``
    laid out over ``resolved.chunks``; without either, PAC is skipped with a note. Metrics cover
    the frames the video holds (a killed run's last chunk may be partial).

    A run of a procedural-world preset (``summary.json`` names its world seed) also gets ``gt``:
    GT-PSNR / GT-SSIM / GT detail of the video's frames against the world rendered at the same poses, per chunk,
    overall and on the return chunks (:func:`gt_summary`); from the lossy MP4, so a little below the
    values ``generate`` records on the decoded frames. The poses are the run's own trajectory's
    (``config.trajectory``); ``trajectory`` stands in for it only when that file is gone (noted).

    Returns a JSON-able dict: run_dir, level, status ("complete" | "partial"), chunks (records in
    chunks.jsonl), pixel_frames, temp_ssim, latent_diff, scene_drift, pac, revisit, gt, notes, and
    ``attention`` (:func:`attention_summary`) for a run made with ``--attention-stats``.
    Raises:
        InputError: a procedural-world run whose trajectory file is gone and no ``trajectory`` given,
            or a ``trajectory`` standing in for it that is not in universal mode.
        ValueError: an unknown ``level``, or ``"all"`` without ``tower``.
    """
    from ..outputs import read_jsonl, read_video_frames
    from ..trajectory import load_trajectory, plan_actions

    if level not in ("fast", "all"):
        raise ValueError(f"level must be 'fast' or 'all', got {level!r}")
    if level == "all" and tower is None:
        raise ValueError("level 'all' needs a CLIP tower for Scene Drift and PAC")
    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / "chunks.jsonl") if (run_dir / "chunks.jsonl").exists() else []
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    frames = read_video_frames(run_dir / "video.mp4")
    t_frames = int(frames.shape[0])
    fpc = ((summary or {}).get("config") or {}).get("preset", {}).get("frames_per_chunk", 3)  # LingBot: 4
    num_chunks = chunks_for_frames(t_frames, fpc) if t_frames else 0
    notes = []
    ldiff = [r.get("metrics", {}).get("latent_diff") for r in records]
    if any(v is not None for v in ldiff):  # LatentDiff needs latents: generate records it per chunk
        # the mean over frame pairs, as summary.json's: chunk 0 owns fpc - 1 pairs, every later chunk fpc
        # (the pair across its boundary included)
        pairs = [(v, fpc - 1 if r.get("chunk", k) == 0 else fpc) for k, (r, v) in enumerate(zip(records, ldiff))
                 if v is not None]
        latent = {"per_chunk": ldiff, "mean": sum(v * n for v, n in pairs) / max(sum(n for _, n in pairs), 1),
                  "source": "chunks.jsonl (per-chunk means, weighted by the latent-frame pairs each chunk owns)"}
    else:
        latent = None
        notes.append("LatentDiff skipped: the run folder stores no latents (generate with --metrics fast)")
    out = {"run_dir": str(run_dir), "level": level,
           "status": "complete" if summary and summary.get("status") == "complete" else "partial",
           "chunks": len(records), "pixel_frames": t_frames,
           "temp_ssim": temp_ssim(frames, frames_per_chunk=fpc), "latent_diff": latent,
           "scene_drift": None, "pac": None, "revisit": None, "gt": None, "notes": notes}
    world_seed = (summary or {}).get("resolved", {}).get("world_seed")
    if world_seed is not None and t_frames:  # a procedural-world run: score the video against the truth
        from ..world.truth import GroundTruth

        cfg = summary["config"]
        # the truth is rendered along the run's own trajectory (the actions it was generated with);
        # ``trajectory`` only when that file is gone (``trajectory`` is otherwise for revisit pairing)
        own = cfg.get("trajectory")
        gt_trajectory = own if own and Path(own).is_file() else trajectory
        if gt_trajectory is None:
            raise InputError(f"{run_dir}: the run's trajectory {own} is gone: pass --trajectory to score it "
                             f"against the ground truth")
        if gt_trajectory != own:
            notes.append(f"GT scored along {gt_trajectory}: the run's own trajectory {own} is gone")
        elif trajectory is not None and Path(trajectory).resolve() != Path(own).resolve():
            notes.append(f"GT scored along the run's own trajectory {own}; {trajectory} pairs revisits only")
        plan = plan_actions(load_trajectory(gt_trajectory), summary["resolved"]["chunks"], fpc)
        if plan.mode != "universal":
            raise InputError(f"{gt_trajectory}: mode {plan.mode!r}, but the procedural world is walked in "
                             f"universal mode (the run's own trajectory is {own})")
        style = (summary.get("config") or {}).get("preset", {}).get("world")  # the run's world style
        truth = GroundTruth(world_seed, plan, frames.shape[1], frames.shape[2], style)
        psnr, ssim_, detail = [], [], []
        for c in range(num_chunks):
            start, end = chunk_rows(c, fpc)
            end = min(end, t_frames)
            scores = gt_scores(frames[start:end], truth.frames(start, end))
            psnr.append(_mean(scores["psnr"]))
            ssim_.append(_mean(scores["ssim"]))
            detail.append((sum(scores["detail"]), sum(scores["detail_true"])))
        out["gt"] = {"world_seed": world_seed, "source": "video.mp4 (lossy H.264)",
                     **gt_summary(psnr, ssim_, plan, detail),
                     "per_chunk": {"psnr": psnr, "ssim": ssim_, "detail": [detail_ratio([d]) for d in detail]}}
    if any("attention" in r.get("cache", {}) for r in records):  # --attention-stats: recall on the return legs
        from ..trajectory import load_trajectory as _load, plan_actions as _plan

        own = ((summary or {}).get("config") or {}).get("trajectory")
        source = trajectory or (own if own and Path(own).is_file() else None)
        planned = (summary or {}).get("resolved", {}).get("chunks") or len(records)
        out["attention"] = attention_summary(records, None if source is None else
                                             _plan(_load(source), planned, fpc))
    if level == "fast" or not t_frames:
        return out

    embeds = clip_embeddings(tower, frames)
    out["scene_drift"] = scene_drift(embeds, num_chunks, fpc)
    if trajectory is None and summary is not None:
        trajectory = summary.get("config", {}).get("trajectory")
    if trajectory is None:
        notes.append("PAC skipped: no trajectory (partial run without summary.json; pass one)")
        return out
    planned = summary.get("resolved", {}).get("chunks") if summary else None
    plan = plan_actions(load_trajectory(trajectory), planned or max(num_chunks, len(records)), fpc)
    revisit = revisit_pairs(plan)
    frame_pairs = [(a, b) for a, b in revisit["frame_pairs"] if b < t_frames]
    out["revisit"] = {"source": revisit["source"], "trajectory": str(trajectory),
                      "chunk_pairs": [p for p in revisit["chunk_pairs"] if chunk_rows(p[1], fpc)[0] < t_frames]}
    if frame_pairs:
        out["pac"] = pac(embeds, frame_pairs)
    else:
        notes.append("PAC skipped: the trajectory revisits no place within the generated frames")
    return out


def attention_summary(records: list[dict], plan) -> dict | None:
    """A run's attention per cache slot, from its ``chunks.jsonl`` records made with ``--attention-stats``
    (``summary.json``'s ``attention``; None when no record has shares).

    Returns ``{"pass", "queries", "chunks", "self", "summary", "recent", "recall"}``: the measured
    pass and query sample (as the records say), the chunks measured, the mean over them of the
    chunk's own share and of its summary and recent slots' shares, and ``recall``: on the return
    chunks of ``plan``'s revisits (:func:`revisit_pairs`, the pairing PAC and the return-leg GT
    metrics use), the share of attention on the slots holding latent frames taken at the revisited
    place before (:func:`first_visit_frames`: by camera pose; a prompt loop's first visit is the whole
    first segment of its prompt; :func:`~worldtrace_cli.outputs.records.recall_attention`), or None
    without a return chunk.
    """
    from ..outputs.records import recall_attention

    measured = [r for r in records if "attention" in r.get("cache", {})]
    if not measured:
        return None
    first = measured[0]["cache"]["attention"]

    def mean(key):
        return round(sum(r["cache"]["attention"][key] for r in measured) / len(measured), 6)

    recall = None
    if plan is not None:
        pairs = revisit_pairs(plan)["chunk_pairs"]
        recall = recall_attention(measured, first_visit_frames(plan, pairs))
    return {"pass": first["pass"], "queries": first["queries"], "chunks": len(measured), "self": mean("self"),
            "summary": mean("summary"), "recent": mean("recent"), "recall": recall}


def continuation_summary(per_chunk: list, prefix_chunks: int) -> dict:
    """A continued clip's scores against what followed it: ``prefix_chunks``, ``scored_chunks`` (chunks
    after the prefix with reference frames), ``frames`` (pixel frames scored), frame-weighted means
    ``psnr`` (dB) / ``ssim`` / ``mse`` ([0, 1] pixels), and ``per_chunk`` lists (None for the prefix
    and for chunks past the reference's end). ``per_chunk``: :class:`OnlineMetrics`' entries."""
    scored = [r for r in per_chunk if r is not None]
    n = sum(r["frames"] for r in scored)
    mean = (lambda k: sum(r[k] * r["frames"] for r in scored) / n) if n else (lambda k: None)
    return {"prefix_chunks": prefix_chunks, "scored_chunks": len(scored), "frames": n,
            "psnr": mean("psnr"), "ssim": mean("ssim"), "mse": mean("mse"),
            "per_chunk": {k: [None if r is None else r[k] for r in per_chunk] for k in ("psnr", "ssim", "mse")},
            "lpips": None, "not_computed": ["lpips: needs AlexNet weights this tool does not ship"]}


class OnlineMetrics:
    """Per-chunk metrics computed while a run generates (``worldtrace generate --metrics``).

    ``level``: ``none`` (nothing), ``fast`` (TempSSIM and LatentDiff, including the pair across
    each chunk boundary, and GT-PSNR/GT-SSIM/GT detail per chunk when ``truth``, a
    :class:`~worldtrace_cli.world.truth.GroundTruth`, is given) or ``all`` (also Local Scene Drift, and PAC over the trajectory's revisit
    pairs at the end; needs the CLIP ``tower``, one forward per pixel frame). State is the previous
    chunk's last pixel frame, last latent frame and mean CLIP embedding, plus the per-frame CLIP
    embeddings for PAC ([T, P] float32: 12 MB at 256 chunks).

    A continued clip (``--prefix``) gives ``reference`` (:mod:`worldtrace_cli.continuation`: the real
    frames after the prefix) and ``prefix_chunks``: every chunk after the prefix is scored against the
    reference frames at its pixel rows (``ref_psnr`` dB, ``ref_ssim``, ``ref_mse`` on [0, 1] pixels:
    MIND's "lcm" group without LPIPS, :func:`~worldtrace_cli.continuation.reference_scores`), and the
    summary's ``continuation`` gives their means over the scored chunks.
    """

    def __init__(self, level: str = "fast", tower=None, truth=None, reference=None, prefix_chunks: int = 0,
                 frames_per_chunk: int = 3):
        if level not in ("none", "fast", "all"):
            raise ValueError(f"metrics level must be none, fast or all, got {level!r}")
        if level == "all" and tower is None:
            raise ValueError("metrics level 'all' needs a CLIP tower")
        self.level, self.tower, self.truth = level, tower, truth
        self.reference, self.prefix_chunks, self.frames_per_chunk = reference, prefix_chunks, frames_per_chunk
        self._ref: list[dict | None] = []  # per chunk: the reference scores (means, frames), None where none
        self._gt_psnr: list[float] = []
        self._gt_ssim: list[float] = []
        self._gt_detail: list[list[float] | None] = []  # per chunk [generated, true] sums of detail()
        self._last_frame = self._last_latent = self._last_embed = None
        self._embeds: list[torch.Tensor] = []
        self._ssim: list[float] = []
        self._ldiff: list[float] = []
        self._drift: list[float] = []

    def add_chunk(self, latents: torch.Tensor, frames) -> dict:
        """Score one chunk: latents [1, 16, F, h, w], frames uint8 [T, H, W, 3]. Returns the
        chunk's record entries (``temp_ssim``, ``latent_diff``, ``scene_drift``; with ground truth
        ``gt_psnr`` in dB, ``gt_ssim`` and ``gt_detail``, :func:`gt_scores`; None where undefined)."""
        if self.level == "none":
            return {}
        frames = _frames_tensor(frames)
        rec: dict = {}
        if self.reference is not None:
            from .reference import chunk_reference, reference_scores

            c = len(self._ref)
            scores = None if c < self.prefix_chunks else reference_scores(
                frames.numpy(), chunk_reference(self.reference, c, self.frames_per_chunk))
            self._ref.append(None if scores is None else {k: _mean(v) for k, v in scores.items()} | {
                "frames": len(scores["psnr"])})
            for k in ("psnr", "ssim", "mse"):
                rec[f"ref_{k}"] = None if scores is None else self._ref[-1][k]
        if self.truth is not None:
            start, end = chunk_rows(len(self._gt_psnr))
            scores = gt_scores(frames, self.truth.frames(start, end))
            self._gt_psnr.append(_mean(scores["psnr"]))
            self._gt_ssim.append(_mean(scores["ssim"]))
            self._gt_detail.append([sum(scores["detail"]), sum(scores["detail_true"])])
            rec["gt_psnr"], rec["gt_ssim"] = self._gt_psnr[-1], self._gt_ssim[-1]
            rec["gt_detail"] = detail_ratio(self._gt_detail[-1:])
        seq = frames if self._last_frame is None else torch.cat([self._last_frame[None], frames])
        pairs = temp_ssim(seq)["pairs"]
        self._ssim += pairs
        rec["temp_ssim"] = _mean(pairs)
        z = latents.detach().float().cpu()
        zseq = z if self._last_latent is None else torch.cat([self._last_latent, z], dim=2)
        diffs = latent_diff(zseq)["pairs"]
        self._ldiff += diffs
        rec["latent_diff"] = _mean(diffs)
        self._last_frame, self._last_latent = frames[-1].clone(), z[:, :, -1:].clone()
        if self.level == "all":
            emb = clip_embeddings(self.tower, frames)
            self._embeds.append(emb)
            mean = torch.nn.functional.normalize(emb.mean(0), dim=0)
            drift = None if self._last_embed is None else float(1 - mean @ self._last_embed)
            if drift is not None:
                self._drift.append(drift)
            rec["scene_drift"] = drift
            self._last_embed = mean
        return rec

    _STATE = ("gt_psnr", "gt_ssim", "last_frame", "last_latent", "last_embed", "embeds", "ssim", "ldiff", "drift")
    # entries added after resume states existed, and what an older state stands for
    _ADDED_STATE = {"gt_detail": lambda state: [None] * len(state["gt_psnr"]), "ref": lambda state: []}

    def state_dict(self) -> dict:
        """The accumulators (lists of floats, tensors or None; CPU tensors) for a resume state."""
        return {"level": self.level, **{k: getattr(self, "_" + k) for k in (*self._STATE, *self._ADDED_STATE)}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into an accumulator of the same level.

        A state saved before an entry of :attr:`_ADDED_STATE` existed restores it as unknown (None per
        chunk so far: the run's GT detail then covers the chunks generated after the resume).

        Raises:
            ValueError: a state of another level, or missing entries.
        """
        if state.get("level") != self.level or any(k not in state for k in self._STATE):
            raise ValueError(f"metrics state of level {state.get('level')!r} cannot restore level {self.level!r}")
        for k in self._STATE:
            setattr(self, "_" + k, state[k])
        for k, implied in self._ADDED_STATE.items():
            setattr(self, "_" + k, state[k] if k in state else implied(state))

    def summary(self, plan=None) -> dict:
        """Run-level means (and PAC over ``plan``'s revisit pairs with level ``all``)."""
        if self.level == "none":
            return {"level": "none"}
        out = {"level": self.level, "temp_ssim": _mean(self._ssim), "latent_diff": _mean(self._ldiff)}
        # null without ground truth (--image, a checkpoint, a random preset), as in `worldtrace metrics`
        out["gt"] = None if self.truth is None else {
            "world_seed": self.truth.world_seed, **gt_summary(self._gt_psnr, self._gt_ssim, plan, self._gt_detail)}
        if self.reference is not None:
            out["continuation"] = continuation_summary(self._ref, self.prefix_chunks)
        if self.level == "all":
            out["scene_drift"] = _mean(self._drift)
            out["pac"] = None
            if plan is not None and self._embeds:
                embeds = torch.cat(self._embeds)
                revisit = revisit_pairs(plan)
                pairs = [(a, b) for a, b in revisit["frame_pairs"] if b < embeds.shape[0]]
                out["revisit"] = {"source": revisit["source"], "chunk_pairs": revisit["chunk_pairs"]}
                if pairs:
                    out["pac"] = pac(embeds, pairs)
        return out


__all__ = ["PSNR_CAP_DB", "attention_summary", "continuation_summary", "SSIM_BATCH_BYTES", "SSIM_WINDOW", "OnlineMetrics", "clip_embeddings", "dead_reckon", "gt_scores", "gt_summary", "latent_diff", "pac", "pairs_from_poses",
           "pairs_from_waypoints", "revisit_pairs", "scene_drift", "summarise_run", "temp_ssim"]
