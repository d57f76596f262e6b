"""The pipeline a run needs: a preset's networks loaded once, with fixed speed settings (design.md §2).

``generate``, ``compare``, ``loopbench run`` and ``bench speed`` build one pipeline with
:meth:`Pipeline.from_config` / :meth:`Pipeline.from_preset` and pass it to every run they make;
nothing is cached per process, and no run changes a pipeline's settings (a run that needs other
settings gets its own pipeline, see ``serves``). The preset's ``architecture`` picks the class:
:class:`~worldtrace_cli.engine.mg2.MG2Pipeline` or
:class:`~worldtrace_cli.engine.lingbot.LingbotPipeline`, both
:class:`~worldtrace_cli.engine.base.PipelineBase`. Imports go strictly downward: this module imports
both pipelines, they import :mod:`worldtrace_cli.engine.base`, never this module.
"""

from __future__ import annotations

from .lingbot import LingbotPipeline
from .mg2 import Conditioned, MG2Pipeline
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
        cls = LingbotPipeline if preset.is_lingbot else MG2Pipeline
        return cls.from_preset(preset, *args, **kwargs)

    @staticmethod
    def from_config(cfg) -> PipelineBase:
        """The pipeline a :class:`~worldtrace_cli.config.RunConfig` asks for."""
        cls = LingbotPipeline if cfg.preset.is_lingbot else MG2Pipeline
        return cls.from_config(cfg)


__all__ = ["Conditioned", "LingbotPipeline", "MG2Pipeline", "ModelKey", "Pipeline", "PipelineBase", "resolve_device",
           "resolve_dtype", "versions"]
