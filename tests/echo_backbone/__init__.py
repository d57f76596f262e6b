"""Echo: a backbone registered from outside worldtrace, the working example of docs/architecture.md's
"A new backbone" and what tests/test_backbones.py runs every face on.

Echo is MG2's networks (the tiny preset's) with the capabilities of another model: it takes no start
image (its pipeline conditions every run on one flat grey frame, :mod:`.pipeline`) and has no camera (pose
writers are refused); it runs live. :data:`STILL` is the same backbone declared not live (sessions and
``play`` refuse it). Nothing in worldtrace names them: a row (torch-free: the pipeline is imported when a
model loads), one pipeline class, and a preset.

Registered in process with ``register_backbone(ROW)``, or by an installed package's entry point::

    [project.entry-points."worldtrace.backbones"]
    echo = "echo_backbone:ROW"
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from worldtrace_cli.config.backbones import Backbone

PRESET = Path(__file__).with_name("echo-tiny.yaml")  # ``--preset`` takes the file


def _own_window(preset) -> dict:
    """Echo's own cache (its default ``--cache``): the newest frames of its window, as MG2's."""
    return {"cache": "sliding"}


ROW = Backbone("echo", "Echo (test backbone)", "echo_backbone.pipeline:EchoPipeline",
               "worldtrace_cli.model.config:DiTConfig", "worldtrace_cli.model.dit:CausalWanDiT", "actions",
               ("universal",), start_image=False, run_prompt=False, camera_files=False, camera=False,
               text_encoder=False, clip_conditioning=True, live=True, official_cache=_own_window,
               checkpoint_folder="no folder (random weights)", preset_sampler=True)
STILL = replace(ROW, architecture="echo-still", title="Echo, not live (test backbone)", live=False)
STILL_PRESET = Path(__file__).with_name("echo-still-tiny.yaml")
