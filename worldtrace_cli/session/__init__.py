"""Live sessions: a world model driven one chunk at a time from Python (``worldtrace play`` too).

A :class:`Session` is the library face of ``worldtrace generate``: the same pipeline, cache writer,
:class:`~worldtrace_cli.engine.rollout.Rollout`, :class:`~worldtrace_cli.engine.decode.DecodePipeline`, metrics
and run-folder sinks, but the actions arrive chunk by chunk instead of from a trajectory file::

    import worldtrace_cli as wt
    s = wt.open("loopworld", cache="landmark", record="runs/live")
    frames, record = s.step("forward")          # uint8 [9, 96, 176, 3] and its chunks.jsonl record
    frames, record = s.step("forward+camera_l")  # uint8 [12, 96, 176, 3]
    s.close()                                    # runs/live: video.mp4, chunks.jsonl, summary.json, trajectory.yaml

For the same actions, seed and world a session decodes the frames ``generate`` decodes (the same
``frames_sha256`` chunk for chunk): chunk c reads only the action rows up to its own (MG2 spec §11),
the start image's conditioning latents are causal in the frame count (encoded once for the
longest rollout, 31 latent frames), and noise depends only on (seed, chunk). The trajectory a
session wrote (``trajectory.yaml``) replays it with ``worldtrace generate``.

MG2-architecture presets (loopworld, tiny*, mg2-*) and the text-to-video ones run as sessions (a text
session steps on prompts: ``s.step(prompt="a red lighthouse")``, :mod:`.text`); LingBot-World runs
through ``generate``.
"""

from .live import Session, StepResult
from .opening import open


def load(path, pipeline=None) -> Session:
    """A saved session (:meth:`Session.load`)."""
    return Session.load(path, pipeline)


__all__ = ["Session", "StepResult", "load", "open"]
