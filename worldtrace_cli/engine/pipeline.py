"""The pipeline a run needs: a preset's networks loaded once, with fixed speed settings.

``generate``, ``compare``, ``loopbench run`` and ``bench speed`` build one pipeline with
:meth:`Pipeline.from_config` / :meth:`Pipeline.from_preset` and pass it to every run they make;
nothing is cached per process, and no run changes a pipeline's settings (a run that needs other
settings gets its own pipeline, see ``serves``). The preset's backbone row
(:mod:`~worldtrace_cli.config.backbones`) names the class, a
:class:`~worldtrace_cli.engine.base.PipelineBase` imported when the model loads (MG2, LingBot-World,
Self-Forcing / LongLive, or a registered one).
"""

from __future__ import annotations

from .base import ModelKey, PipelineBase, resolve_device, resolve_dtype, versions


class Pipeline:
    """Factory of the architecture's pipeline (not instantiated)."""

    @staticmethod
    def from_preset(preset, *args, **kwargs) -> PipelineBase:
        """The ``from_preset`` of the preset's backbone pipeline (:func:`pipeline_class`; same arguments).

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
    """The pipeline class of ``preset``'s backbone (its registry row: :mod:`~worldtrace_cli.config.backbones`),
    held to the row (:func:`~worldtrace_cli.engine.base.check_row`).

    Raises:
        InputError: a row whose capability flags disagree with its class (one line naming both)."""
    from ..errors import InputError
    from .base import check_row

    cls = preset.backbone.load("pipeline")
    try:
        check_row(preset.backbone, cls)
    except TypeError as exc:
        raise InputError(str(exc)) from None
    return cls


__all__ = ["ModelKey", "Pipeline", "PipelineBase", "pipeline_class", "resolve_device", "resolve_dtype", "versions"]
