"""The backbones: one row per preset ``architecture``, saying what the backbone takes and supports
(torch-free; vLLM's model registry maps an architecture to its class the same way, by name).

Every face of the product (generate, compare, loopbench, bench, parity, sessions, play, the memory
plan) asks a preset's row, never the architecture's name: a new backbone is its model folder, one
pipeline class (:class:`~worldtrace_cli.engine.base.PipelineBase`), its presets and one row here
(:func:`register_backbone`; docs/architecture.md, "A new backbone").
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

DEFAULT_ARCHITECTURE = "mg2"  # presets and run folders written before the ``architecture`` key are MG2's
CHUNK_INPUTS = ("actions", "camera", "prompt")  # what one chunk takes, as the trajectory format writes it


@dataclass(frozen=True)
class Backbone:
    """What a backbone takes and supports.

    Attributes:
        architecture: the presets' ``architecture`` key (``mg2``, ``lingbot``, ``selfforcing``).
        title: its name for people (``Matrix-Game-2.0``).
        pipeline: ``module:Class`` of its :class:`~worldtrace_cli.engine.base.PipelineBase` (imported when
            a model loads: :func:`load_object`).
        dit_config: ``module:Class`` of the DiT config a preset's ``dit:`` mapping builds.
        dit: ``module:Class`` of its DiT (the memory plan builds it under FakeTensorMode).
        chunk_input: what a chunk takes: ``actions`` (keyboard/mouse rows drive the model), ``camera``
            (the actions, or explicit poses, drive a camera the model reads) or ``prompt`` (a text
            prompt per chunk, prompt segments).
        modes: the trajectory modes its presets may run.
        start_image: conditioned on a start image (``--image``, a trajectory's ``image:``).
        run_prompt: takes one text prompt for the whole run (``--prompt``, a trajectory's ``prompt:``).
        camera_files: takes camera files (``--poses`` / ``--intrinsics``).
        camera: every latent frame has a camera pose, so writers that retrieve by pose run.
        text_encoder: prompts are encoded by umT5 (a checkpoint folder then holds folders too).
        clip_conditioning: its DiT reads CLIP image tokens of the start image (MG2); otherwise a CLIP
            tower, when the preset names one, serves only ``--metrics all``.
        live: runs chunk by chunk from the caller (sessions, ``worldtrace play``).
        official_cache: ``preset -> MemoryConfig keywords`` of the cache the model was run with
            officially (the default ``--cache``).
        checkpoint_folder: what ``--checkpoint`` names, for messages.
        global_window: the latent frames a preset with a global cache (``local_attn_size`` -1) was
            trained to attend over (LingBot-World 18, Self-Forcing 21; 0: it has no global cache).
        preset_sampler: a preset chooses the sampler (``sampler``, ``context_noise``: MG2); otherwise
            the model has its own and presets may not set them.
        dit_model_type: the ``model_type`` its presets' DiT must have (``i2v``, ``t2v``), or None.
        chunk_frames: latent frames per chunk its presets must use, or 0 (any).
        dit_backends: ``(name, "module:function")`` pairs: the DiT implementations besides ``native`` that
            ``generate --backend NAME`` runs, each function turning the loaded DiT into that
            implementation's drop-in (:meth:`load_backend`; Self-Forcing / LongLive: ``diffusers``).
    """

    architecture: str
    title: str
    pipeline: str
    dit_config: str
    dit: str
    chunk_input: str
    modes: tuple[str, ...]
    start_image: bool
    run_prompt: bool
    camera_files: bool
    camera: bool
    text_encoder: bool
    clip_conditioning: bool
    live: bool
    official_cache: Callable = field(compare=False)
    checkpoint_folder: str = "its checkpoint folder"
    global_window: int = 0
    preset_sampler: bool = False
    dit_model_type: str | None = None
    chunk_frames: int = 0
    dit_backends: tuple[tuple[str, str], ...] = ()

    @property
    def takes_actions(self) -> bool:
        """A chunk takes the trajectory format's actions (keys and mouse)."""
        return self.chunk_input in ("actions", "camera")

    @property
    def takes_prompts(self) -> bool:
        """A chunk takes a text prompt (prompt segments; a prompt switch re-caches)."""
        return self.chunk_input == "prompt"

    def load(self, what: str = "pipeline"):
        """The class named by ``what`` (``pipeline``, ``dit_config``, ``dit``), imported now."""
        return load_object(getattr(self, what))

    @property
    def backends(self) -> tuple[str, ...]:
        """The ``--backend`` values its presets take: ``native`` (worldtrace's own DiT), then :attr:`dit_backends`'."""
        return ("native", *(name for name, _ in self.dit_backends))

    def load_backend(self, name: str):
        """The function of :attr:`dit_backends` named ``name`` (``loaded DiT -> its drop-in``), imported now.

        Raises:
            KeyError: a backend this row does not have."""
        return load_object(dict(self.dit_backends)[name])


def load_object(path: str):
    """``module:attribute`` imported (the registry names classes without importing torch)."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _own_window(preset) -> dict:
    """MG2's own cache: the newest frames of its window, verbatim."""
    return {"cache": "sliding"}


def _official_memory(preset) -> dict:
    """The release's cache: a sink of ``sink_size`` frames in a window of ``local_attn_size`` latent frames
    at true offsets, or the global cache (:func:`~worldtrace_cli.model.lingbot.config.official_memory`)."""
    from ..model.lingbot.config import official_memory

    return official_memory(preset.dit.local_attn_size, preset.dit.sink_size, preset.frames_per_chunk)


BACKBONES: dict[str, Backbone] = {}


def register_backbone(row: Backbone) -> Backbone:
    """Add ``row`` to :data:`BACKBONES` (its ``architecture`` then loads in presets and every face asks it).

    Raises:
        ValueError: an ``architecture`` already registered, or an unknown ``chunk_input``.
    """
    if row.architecture in BACKBONES:
        raise ValueError(f"backbone {row.architecture!r} is registered already")
    if row.chunk_input not in CHUNK_INPUTS:
        raise ValueError(f"backbone {row.architecture!r}: chunk_input must be one of {', '.join(CHUNK_INPUTS)}")
    BACKBONES[row.architecture] = row
    return row


for _row in (
    Backbone("mg2", "Matrix-Game-2.0", "worldtrace_cli.engine.mg2:MG2Pipeline", "worldtrace_cli.model.config:DiTConfig",
             "worldtrace_cli.model.dit:CausalWanDiT", "actions", ("universal", "gta_drive", "templerun"),
             start_image=True, run_prompt=False, camera_files=False, camera=True, text_encoder=False,
             clip_conditioning=True, live=True, official_cache=_own_window,
             checkpoint_folder="the official Matrix-Game-2.0 folder", preset_sampler=True),
    Backbone("lingbot", "LingBot-World", "worldtrace_cli.engine.lingbot:LingbotPipeline",
             "worldtrace_cli.model.lingbot.config:LingbotConfig", "worldtrace_cli.model.lingbot.dit:LingbotDiT",
             "camera", ("universal",), start_image=True, run_prompt=True, camera_files=True, camera=True,
             text_encoder=True, clip_conditioning=False, live=True, official_cache=_official_memory,
             checkpoint_folder="a LingBot-World causal-fast folder", dit_model_type="i2v", global_window=18),
    Backbone("selfforcing", "Self-Forcing / LongLive", "worldtrace_cli.engine.text:TextPipeline",
             "worldtrace_cli.model.lingbot.config:LingbotConfig", "worldtrace_cli.model.lingbot.dit:LingbotDiT",
             "prompt", ("text",), start_image=False, run_prompt=True, camera_files=False, camera=False,
             text_encoder=True, clip_conditioning=False, live=True, official_cache=_official_memory,
             checkpoint_folder="the Self-Forcing or LongLive repository root, or a diffusers Wan T2V folder",
             global_window=21,
             dit_model_type="t2v", chunk_frames=3,
             dit_backends=(("diffusers", "worldtrace_cli.integrations.diffusers_backend:diffusers_dit_from"),)),
):
    register_backbone(_row)


def titles_where(capability: Callable[[Backbone], bool]) -> str:
    """The titles of the registered backbones with ``capability(row)``, joined by "and" ("no" when none):
    who takes a flag, for the refusals of the backbones that do not."""
    return " and ".join(r.title for r in BACKBONES.values() if capability(r)) or "no"


ENTRY_POINTS = "worldtrace.backbones"  # the entry-point group of backbones installed from other packages
_plugins_loaded = False


_broken: list[str] = []  # the refusals of the plugins that failed to load (one line each)


def load_plugins(strict: bool = True) -> list[str]:
    """Register the backbones other installed packages declare, once per process: each entry point of
    the group ``worldtrace.backbones`` names a :class:`Backbone` row, or a function returning one or a
    list of them (``[project.entry-points."worldtrace.backbones"] echo = "my_pkg.rows:ROW"``). Called
    when a preset names an architecture no built-in row has, so a broken plugin only affects its own
    presets. A plugin that raises *anything* while it loads (``SystemExit`` and ``KeyboardInterrupt``
    included: a ``sys.exit(0)`` in a plugin must not end a run as a success) is a one-line refusal
    naming it; the other plugins still load.

    Args:
        strict: raise the first broken plugin's refusal (a run that needs a plugin's row); False: return
            the refusals and register the rest (``worldtrace presets --backbones``).
    Returns:
        the broken plugins' one-line refusals (empty when every plugin loaded).
    Raises:
        InputError: with ``strict``, a plugin that does not load, or that gives something other than
            Backbone rows (one line naming the entry point).
    """
    global _plugins_loaded
    from ..errors import InputError

    if not _plugins_loaded:
        _plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINTS):
            try:
                found = ep.load()
                rows = found() if callable(found) and not isinstance(found, Backbone) else found
                rows = [rows] if isinstance(rows, Backbone) else list(rows)
                bad = next((row for row in rows if not isinstance(row, Backbone)), None)
                if bad is not None:
                    _broken.append(f"backbone plugin {ep.name} ({ep.value}): gives {type(bad).__name__}, not a Backbone row")
                    continue
            except BaseException as exc:  # noqa: BLE001  (SystemExit / KeyboardInterrupt in a plugin's import too)
                said = " ".join(str(exc).split()) or "(no message)"
                _broken.append(f"backbone plugin {ep.name} ({ep.value}): {type(exc).__name__}: {said}"[:300])
                continue
            for row in rows:
                if BACKBONES.get(row.architecture) is not row:
                    register_backbone(row)
    if strict and _broken:
        raise InputError(_broken[0])
    return list(_broken)


def backbone_table() -> str:
    """The registered backbones and what each takes, as a Markdown table (``worldtrace presets --backbones``;
    docs/presets.md holds it, kept equal by a test)."""
    def yes(flag: bool) -> str:
        return "yes" if flag else "-"

    lines = ["| architecture | backbone | a chunk takes | modes | start image | run prompt | camera files "
             "| camera (pose writers) | live |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in BACKBONES.values():
        lines.append(f"| `{row.architecture}` | {row.title} | {row.chunk_input} | {', '.join(row.modes)} "
                     f"| {yes(row.start_image)} | {yes(row.run_prompt)} | {yes(row.camera_files)} | {yes(row.camera)} "
                     f"| {yes(row.live)} |")
    return "\n".join(lines)


def backbone(architecture: str) -> Backbone:
    """The row of ``architecture`` (the installed plugins' rows too: :func:`load_plugins`).

    Raises:
        KeyError: an architecture no row names (presets are checked at load: :func:`~worldtrace_cli.config.load_preset`).
    """
    if architecture not in BACKBONES:
        load_plugins(strict=False)
    return BACKBONES[architecture]


__all__ = ["BACKBONES", "Backbone", "CHUNK_INPUTS", "DEFAULT_ARCHITECTURE", "ENTRY_POINTS", "backbone", "backbone_table",
           "load_object", "load_plugins", "register_backbone", "titles_where"]
