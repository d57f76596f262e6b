"""A run's ``summary.json`` document (schemas/summary.schema.json), built in one place for
``worldtrace generate`` and live sessions (:mod:`worldtrace_cli.session`)."""

from __future__ import annotations

from pathlib import Path


def run_summary(status: str, cfg, run_dir, command: list[str], resumed_by, pipeline, writer, rollout, scorer, plan,
                tally, started: float, *, image_label: str, seed: int, world_seed: int | None,
                resumed_at: int | None = None, cond_s: float = 0.0, account: bool = False,
                warnings: list | None = None) -> dict:
    """The summary of a run that generated ``len(tally.records)`` chunks of ``plan``.

    Args:
        status: ``complete`` | ``stopped`` | ``aborted`` | ``failed`` (metrics are summarised only
            for ``complete``; a complete run's totals count ``plan.num_chunks`` chunks).
        cfg: the :class:`~worldtrace_cli.config.RunConfig`; run_dir: the folder (str/Path) or None.
        command / resumed_by: argv of the run and of its resume (or None).
        pipeline, writer, rollout, scorer: the run's loaded model, cache writer, Rollout (None
            before the first chunk) and OnlineMetrics; plan: its ActionPlan; tally: what it made
            (:class:`~worldtrace_cli.engine.tally.RunTally`, or the RunSinks of its folder).
        started: ``time.time()`` at the run's start (seconds); image_label: the image path or
            ``world:N``; seed / world_seed: resolved; resumed_at: the chunk a resume started at.
        cond_s: seconds spent conditioning; account: split the wall clock into phases
            (:meth:`~worldtrace_cli.engine.tally.RunTally.totals`); warnings: what the run told the
            user once, with what to do (summary.json's ``warnings``).
    """
    import torch

    from ..engine.pipeline import versions
    from ..metrics import attention_summary
    from ..schemas import SCHEMA_VERSION

    device = pipeline.device
    trained = None if rollout is None else rollout.geometry.trained_offset
    done = plan.num_chunks if status == "complete" else len(tally.records)
    return {
        "schema_version": SCHEMA_VERSION, "status": status, "run_dir": None if run_dir is None else str(run_dir),
        "command": command,
        "resumed_by": resumed_by,
        "config": cfg.to_dict(),
        "resolved": {"seed": seed, "device": str(device), "dtype": str(pipeline.dtype).replace("torch.", ""),
                     "trajectory": str(Path(cfg.trajectory).resolve()), "waypoints": plan.waypoints,
                     "chunks": plan.num_chunks, "image": image_label, "notes": plan.notes,
                     "world_seed": world_seed, "resumed_at_chunk": resumed_at or None,
                     "threads": torch.get_num_threads()},
        "checkpoint": pipeline.world.files, "versions": versions(),
        "cache": {**writer.describe(), "kv_bytes": writer.kv_bytes(), "host_bytes": writer.host_bytes(),
                  "trained_offset": trained, "max_offset": tally.max_offset()},
        "metrics": scorer.summary(plan) if status == "complete" else None,
        "attention": attention_summary(tally.records, plan) if cfg.attention_stats else None,
        "warnings": list(warnings or []),
        "totals": tally.totals(done, pipeline.load_seconds, cond_s, cfg.overlap_decode, started, device,
                               account=account),
    }


__all__ = ["run_summary"]
