"""LoopBench for prompts: A -> B -> A prompt loops for the text-to-video presets (docs/selfforcing.md).

A prompt loop is a route of prompt labels with a length in chunks each: a scene (A), a detour to
others (B, C), the first prompt again. A *scene* is one set of prompts for the labels; a sweep runs
every loop x writer x scene x seed, as the action LoopBench does with images. PAC pairs the return's
chunks with the first A segment's (:func:`~worldtrace_cli.metrics.revisit.pairs_from_prompts`);
TempSSIM and Scene Drift are scored as for every run. Torch-free.

``--prompts FILE`` gives scenes as YAML: a mapping of scene names to ``{A: ..., B: ..., C: ...}``
(C only for loops that visit it).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import InputError
from ..trajectory.prompts import check_prompt

# loop -> ((label, chunks), ...): A a scene, B / C detours, A again (3 latent frames per chunk)
PROMPT_LOOPS: dict[str, tuple[tuple[str, int], ...]] = {
    "prompt_aba": (("A", 4), ("B", 4), ("A", 4)),
    "prompt_abca": (("A", 4), ("B", 3), ("C", 3), ("A", 4)),
    "prompt_aba_long": (("A", 8), ("B", 16), ("A", 8)),
}
QUICK_LOOPS = ("prompt_aba", "prompt_abca")
# the built-in scenes: places a video model draws in detail, detours unlike them
PROMPT_SCENES: dict[str, dict[str, str]] = {
    "lighthouse": {"A": "a red lighthouse on a rocky cliff above a calm sea, morning light",
                   "B": "a busy market street with colourful awnings at noon",
                   "C": "a dense pine forest in fog"},
    "kitchen": {"A": "a sunlit kitchen with a blue kettle on a wooden table",
                "B": "a snowy mountain pass at dusk",
                "C": "a neon-lit city street at night in the rain"},
}
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def load_prompt_scenes(path: str | Path) -> dict[str, dict[str, str]]:
    """Scenes of a ``--prompts`` YAML file: ``{name: {A: prompt, B: prompt, ...}}``.

    Raises:
        InputError: an unreadable file, not a mapping, a scene name that cannot be a folder name, a
            label other than one capital letter, an empty prompt (one line naming the file and scene).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--prompts {path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--prompts {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not data:
        raise InputError(f"--prompts {path}: expected a mapping of scene names to {{A: prompt, B: prompt}}")
    scenes = {}
    for name, prompts in data.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise InputError(f"--prompts {path}: scene name {name!r}: letters, digits, _ . - (a folder name)")
        if not isinstance(prompts, dict) or not all(isinstance(k, str) and re.fullmatch("[A-Z]", k) for k in prompts):
            raise InputError(f"--prompts {path}: {name}: expected {{A: prompt, B: prompt, ...}} (one capital letter each)")
        try:
            scenes[name] = {k: check_prompt(v if isinstance(v, str) else "", f"{name}.{k}") for k, v in prompts.items()}
        except ValueError as exc:
            raise InputError(f"--prompts {path}: {exc}") from None
    return scenes


def prompt_loop_document(loop: str, prompts: dict[str, str], seed: int | None = None) -> dict:
    """The trajectory (mode ``text``) of loop ``loop`` with a scene's ``prompts``: one labelled
    segment per leg.

    Raises:
        InputError: an unknown loop, or a label the scene has no prompt for.
    """
    if loop not in PROMPT_LOOPS:
        raise InputError(f"--configs: unknown prompt loop {loop!r} (choose from {', '.join(PROMPT_LOOPS)})")
    missing = sorted({label for label, _ in PROMPT_LOOPS[loop]} - set(prompts))
    if missing:
        raise InputError(f"--prompts: loop {loop} visits {', '.join(missing)}, a scene has no prompt for it")
    return {"mode": "text", "segments": [{"label": label, "prompt": prompts[label], "chunks": chunks}
                                         for label, chunks in PROMPT_LOOPS[loop]]}


def write_prompt_loop(loop: str, scene: str, prompts: dict[str, str], folder: Path) -> Path:
    """Write ``folder/<loop>-<scene>.yaml`` (the sweep's scratch folder) and return it; the same
    text each time, so a resumed sweep finds its trajectory unchanged."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{loop}-{scene}.yaml"
    text = (f"# LoopBench for prompts: loop {loop}, scene {scene} (worldtrace_cli/loopbench/prompts.py)\n"
            + yaml.safe_dump(prompt_loop_document(loop, prompts), sort_keys=False, width=120, allow_unicode=True))
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


__all__ = ["PROMPT_LOOPS", "PROMPT_SCENES", "QUICK_LOOPS", "load_prompt_scenes", "prompt_loop_document",
           "write_prompt_loop"]
