"""The pipeline a run needs: a preset's networks loaded once, with fixed speed settings (design.md §2).

``generate``, ``compare``, ``loopbench run`` and ``bench speed`` build one pipeline with
:meth:`Pipeline.from_config` / :meth:`Pipeline.from_preset` and pass it to every run they make;
nothing is cached per process, and no run changes a pipeline's settings (a run that needs other
settings gets its own pipeline, see ``serves``). The preset's ``architecture`` picks the class:
:class:`~worldtrace_cli.engine.mg2.MG2Pipeline` or
:class:`~worldtrace_cli.engine.lingbot.LingbotPipeline`, both
:class:`~worldtrace_cli.engine.base.PipelineBase`. Imports go strictly downward: this module imports
the pipelines, they import :mod:`worldtrace_cli.engine.base`, never this module. ``architecture:
selfforcing`` (Self-Forcing / LongLive) gets :class:`~worldtrace_cli.engine.text.TextPipeline`.
"""

from __future__ import annotations

from .lingbot import LingbotPipeline
from .mg2 import Conditioned, MG2Pipeline
from .text import TextPipeline
from .base import ModelKey, PipelineBase, resolve_device, resolve_dtype, versions


class Pipeline:
    """Factory of the architecture's pipeline (not instantiated)."""

    @staticmethod
    def from_preset(preset, *args, **kwargs) -> PipelineBase:
        """:meth:`MG2Pipeline.from_preset` or, for ``architecture: lingbot``,
        :meth:`LingbotPipeline.from_preset` (same arguments).

        Raises:
            InputError: bad device/dtype/precision/compile mode, a checkpoint preset without a folder.
            CheckpointError: missing or mismatched checkpoint files.
        """
        return pipeline_class(preset).from_preset(preset, *args, **kwargs)

    @staticmethod
    def from_config(cfg) -> PipelineBase:
        """The pipeline a :class:`~worldtrace_cli.config.RunConfig` asks for."""
        return pipeline_class(cfg.preset).from_config(cfg)


def pipeline_class(preset) -> type:
    """The pipeline class of ``preset``'s architecture (mg2, lingbot, selfforcing)."""
    return LingbotPipeline if preset.is_lingbot else TextPipeline if preset.is_text else MG2Pipeline


__all__ = ["Conditioned", "LingbotPipeline", "MG2Pipeline", "ModelKey", "Pipeline", "PipelineBase", "TextPipeline",
           "pipeline_class", "resolve_device", "resolve_dtype", "versions"]
