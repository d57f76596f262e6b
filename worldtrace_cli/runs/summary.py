"""A run's ``summary.json`` document (schemas/summary.schema.json), built in one place for
``worldtrace generate`` and live sessions (:mod:`worldtrace_cli.session`)."""

from __future__ import annotations

from pathlib import Path


def run_summary(status: str, run, warnings: list | None = None) -> dict:
    """The summary of ``run`` (a :class:`~worldtrace_cli.runs.run.Run`: ``generate``'s or a
    session's) after it generated ``len(run.tally.records)`` chunks of ``run.plan``.

    Args:
        status: ``complete`` | ``open`` (a live session that can still step) | ``stopped`` | ``aborted`` |
            ``failed`` (metrics are summarised only for ``complete`` and ``open``: the chunks so far; a
            complete run's totals count ``plan.num_chunks`` chunks).
        run: what it reads: ``cfg``, ``run_dir`` (None without a folder), ``command`` / ``resumed_by``
            (argv of the run and of its resume, or None), ``pipeline``, ``writer``, ``rollout`` (None
            before the first chunk), ``scorer``, ``plan``, ``tally``, ``started`` (``time.time()``,
            seconds), ``image_label``, ``seed`` / ``world_seed`` (resolved), ``resumed_at``, ``cond_s``
            (seconds conditioning), ``account`` (split the wall clock into phases:
            :meth:`~worldtrace_cli.engine.tally.RunTally.totals`).
        warnings: what the run told the user once, with what to do (summary.json's ``warnings``).
    """
    import torch

    from ..engine.pipeline import versions
    from ..metrics import attention_summary
    from ..schemas import SCHEMA_VERSION

    cfg, pipeline, writer, plan, tally = run.cfg, run.pipeline, run.writer, run.plan, run.tally
    device = pipeline.device
    trained = None if run.rollout is None else run.rollout.geometry.trained_offset
    done = plan.num_chunks if status == "complete" else len(tally.records)
    return {
        "schema_version": SCHEMA_VERSION, "status": status, "run_dir": None if run.run_dir is None else str(run.run_dir),
        "command": run.command,
        "resumed_by": run.resumed_by,
        "config": cfg.to_dict(),
        "resolved": {"seed": run.seed, "device": str(device), "dtype": str(pipeline.dtype).replace("torch.", ""),
                     "trajectory": str(Path(cfg.trajectory).resolve()), "waypoints": plan.waypoints,
                     "chunks": plan.num_chunks, "image": run.image_label, "notes": plan.notes,
                     "world_seed": run.world_seed, "resumed_at_chunk": run.resumed_at,
                     "threads": torch.get_num_threads()},
        "checkpoint": pipeline.world.files, "versions": versions(),
        "cache": {**writer.describe(), "kv_bytes": writer.kv_bytes(), "host_bytes": writer.host_bytes(),
                  "trained_offset": trained, "max_offset": tally.max_offset()},
        "prefix": prefix_record(run),
        "metrics": run.scorer.summary(plan) if status in ("complete", "open") else None,
        "attention": attention_summary(tally.records, plan) if cfg.attention_stats else None,
        "warnings": list(warnings or []),
        "totals": tally.totals(done, pipeline.load_seconds, run.cond_s, cfg.overlap_decode, run.started, device,
                               account=run.account),
    }


def prefix_record(run) -> dict | None:
    """``summary.json``'s ``prefix``: the real clip a run continued (source, chunks, pixel frames, the
    reference its continuation is scored against, its sha256, what was changed), or None."""
    prefix = getattr(run, "prefix", None)
    if prefix is None:
        return None
    p = prefix.plan
    return {"source": p.source, "chunks": p.chunks, "pixel_frames": p.frames, "reference": p.reference,
            "reference_frames": p.reference_frames, "sha256": prefix.sha256, "notes": list(prefix.notes)}


__all__ = ["prefix_record", "run_summary"]
