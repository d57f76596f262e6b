"""A short rollout's latents, in one process or under torchrun with the DiT's heads split across the
processes (``--split-heads``, engine/shard.py), for tests/test_fsdp.py. Not a test module: a script.

    python tests/split_heads_run.py PRESET CACHES OUT.pt              # one process
    torchrun --nproc-per-node 2 tests/split_heads_run.py PRESET CACHES OUT.pt --split

Builds the run as ``generate`` does (prepare_inputs, Pipeline.from_config, new_run, its conditioning
and rollout, with --attention-stats) for each writer of CACHES (comma-separated: one process start and
one model load for all of them), makes 3 chunks, and process 0 saves, per writer, {"latents":
[3, 16, F, h, w] float32, "slots": per chunk the cache's slot list, "attention": per chunk the slots'
attention shares and the chunk's own, "events": the writer's events, "heads"} to OUT.pt.
"""

import sys
from pathlib import Path

import torch

from worldtrace_cli.config import RunConfig, load_preset, memory_config
from worldtrace_cli.engine import shard
from worldtrace_cli.engine.pipeline import Pipeline
from worldtrace_cli.jobs.generate import new_run
from worldtrace_cli.jobs.inputs import prepare_inputs

ROOT = Path(__file__).resolve().parent.parent


def main(preset_name: str, caches: str, out: str, split: bool) -> None:
    torch.set_num_threads(1)
    preset = load_preset(preset_name)
    if split:
        shard.start(torch.device("cpu"), "heads")
    try:
        pipeline, made = None, {}
        names = caches.split(",")
        for i, cache in enumerate(names):
            cfg = RunConfig(preset=preset, trajectory=ROOT / "trajectories/aba.yaml", output=Path(out).parent / "unused",
                            image=ROOT / "assets/images/mg2_universal_0000.png", chunks=3, metrics="none",
                            progress=False, memory=memory_config(cache=cache, preset=preset), attention_stats=True)
            inputs = prepare_inputs(cfg)
            pipeline = pipeline if pipeline is not None and pipeline.serves(cfg) else Pipeline.from_config(cfg)
            run = new_run(pipeline, cfg, inputs)
            rollout, feed = run.rollout, run.feed
            if shard.rank():  # as generate's other processes: each chunk process 0 makes
                shard.follow(rollout, feed)
                continue
            chunks, gate = [], shard.announcer() if split else None
            for c in range(3):
                if gate is not None:
                    gate()
                chunks.append(rollout.step(None if feed is None else feed.request(c)))
            if split and i < len(names) - 1:  # no chunk follows: the others go on to the next writer
                shard.end_run()  # (after the last one, shard.finish says it)
            made[cache] = {
                "latents": torch.cat([c.latents for c in chunks]),
                "slots": [[{k: v for k, v in s.items() if k != "attention"} for s in c.record["cache"]["slots"]]
                          for c in chunks],
                "attention": [[a for s in c.record["cache"]["slots"] for a in s["attention"]]
                              + [c.record["cache"]["attention"]["self"]] for c in chunks],
                "events": [c.record["cache"]["events"] for c in chunks],
                "heads": rollout.geometry.heads}
        if not shard.rank():
            torch.save(made, out)
    finally:
        if split:
            shard.finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], "--split" in sys.argv[4:])
    if "--split" in sys.argv[4:]:  # as generate's sharded processes end (engine/shard.py: joined)
        sys.stdout.flush()
        sys.stderr.flush()
        import os

        os._exit(0)
