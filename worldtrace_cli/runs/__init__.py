"""Run folders (:class:`RunFolder`: names, lock, prepare, status, consistency, truncation) and
resume states (:mod:`.resume`)."""

from .folder import RunFolder

__all__ = ["RunFolder"]
