"""LoopBench loop trajectories (paper App. "LoopBench" gallery, Tab. "loopbench_full", and the ABA
sweep of App. "Scene Consistency Episodic Recall Sweep") as data, and their YAML files.

A loop is a route of waypoint labels and one ``(action, chunks)`` leg per edge; adding a geometry
is one line in :data:`CONFIGS`. ``python -m worldtrace_cli.loopbench.configs [FOLDER]`` writes every
configuration to ``FOLDER`` (default: the repository's ``trajectories/loopbench/``); a test checks
that the committed files equal what this module generates.

Edge lengths follow the paper, with the dead-reckoning calibration of :mod:`worldtrace_cli.metrics`
(OUR assumption: 1 unit per chunk at normalised speed for any key combination, 45 deg of yaw per
chunk at MG2's camera step 0.1). The first chunk has 9 pixel frames instead of 12, so a loop's
first leg is a quarter chunk short and returns land about 0.25 units or 11 deg past the start.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..trajectory import MODES

DEFAULT_FOLDER = Path(__file__).resolve().parents[2] / "trajectories" / "loopbench"


def loop_trajectory(route: Sequence[str], legs: Sequence[tuple[str, int]],
                    mode: str = "universal") -> dict:
    """A trajectory document (the YAML format of ``trajectories/README.md``) walking a loop.

    Args:
        route: waypoint labels in visiting order, e.g. ``"ABCA"`` (a str is one label per
            character) or ``("A", "A90", "A")``; the last one becomes a zero-length end marker.
        legs: ``(action, chunks)`` for each edge ``route[k] -> route[k+1]``; ``action`` is a macro
            of ``mode`` (``"back+left"``), ``chunks`` >= 1.
        mode: the trajectory's mode.

    Returns:
        ``{"mode": mode, "segments": [{"label", "action", "chunks"}, ..., {"label": end}]}``, no
        ``image`` (given per run) and no ``seed``.

    Raises:
        ValueError: ``len(legs) != len(route) - 1``, an unknown mode, or a chunk count < 1.
    """
    route = list(route)
    if len(legs) != len(route) - 1 or not legs:
        raise ValueError(f"route {route} needs {len(route) - 1} legs (one per edge), got {len(legs)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}")
    segments = []
    for label, (action, chunks) in zip(route, legs):
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"leg {label}: chunks must be an integer >= 1, got {chunks!r}")
        segments.append({"label": label, "action": action, "chunks": chunks})
    segments.append({"label": route[-1]})
    return {"mode": mode, "segments": segments}


@dataclass(frozen=True)
class LoopConfig:
    """One LoopBench configuration: ``route``/``legs`` as in :func:`loop_trajectory`, the paper's
    ``tier`` (1..4, or "sweep"), and a one-line ``about`` written into the file's header."""

    route: str | tuple[str, ...]
    legs: tuple[tuple[str, int], ...]
    tier: int | str
    about: str
    mode: str = "universal"

    @property
    def num_chunks(self) -> int:
        """N, the rollout length in chunks (the sum of the legs)."""
        return sum(chunks for _, chunks in self.legs)

    def waypoints(self) -> list[tuple[int, str]]:
        """(chunk, label) of every waypoint, the end marker at chunk N."""
        starts = [0]
        for _, chunks in self.legs:
            starts.append(starts[-1] + chunks)
        return list(zip(starts, self.route))

    def document(self) -> dict:
        return loop_trajectory(self.route, self.legs, self.mode)


def _aba(half: int, tier: int | str, about: str) -> LoopConfig:
    return LoopConfig("ABA", (("forward", half), ("back", half)), tier, about)


_TIER = {1: "Tier 1 (topology)", 2: "Tier 2 (rollout length, ABA)", 3: "Tier 3 (camera orientation)",
         4: "Tier 4 (multi-revisit)", "sweep": "ABA PAC sweep (App. Scene Consistency Episodic Recall)"}

CONFIGS: dict[str, LoopConfig] = {
    # Tier 1: topology.
    "aba": _aba(8, 1, "walk forward to B, walk back to A."),
    "abca": LoopConfig("ABCA", (("forward", 5), ("right", 5), ("back+left", 7)), 1,
                       "forward to B, strafe right to C, back-left diagonal home (5*sqrt(2) ~ 7 "
                       "chunks at normalised speed)."),
    "abcda": LoopConfig("ABCDA", (("forward", 4), ("right", 4), ("back", 4), ("left", 4)), 1,
                        "a square: forward, strafe right, back, strafe left."),
    # Tier 2: rollout length.
    "aba_short": _aba(4, 2, "ABA with 4-chunk edges."),
    "aba_medium": _aba(8, 2, "ABA with 8-chunk edges (same path as aba)."),
    "aba_long": _aba(16, 2, "ABA with 16-chunk edges."),
    # Tier 3: the agent stays at A while the camera pans away and back (45 deg per chunk, assumed).
    "pan_90": LoopConfig(("A", "A90", "A"), (("camera_r", 2), ("camera_l", 2)), 3,
                         "pan right ~90 deg and back, standing at A."),
    "pan_180": LoopConfig(("A", "A180", "A"), (("camera_r", 4), ("camera_l", 4)), 3,
                          "pan right ~180 deg (look back) and back, standing at A."),
    "pan_360": LoopConfig("AA", (("camera_r", 8),), 3, "pan right a full ~360 deg, standing at A."),
    # Tier 4: multi-revisit.
    "ababa": LoopConfig("ABABA", (("forward", 8), ("back", 8), ("forward", 8), ("back", 8)), 4,
                        "ABA twice: A is revisited twice."),
    "abcba": LoopConfig("ABCBA", (("forward", 5), ("right", 5), ("left", 5), ("back", 5)), 4,
                        "palindrome: B is passed twice before the return to A."),
    "abcdba": LoopConfig("ABCDBA", (("forward", 4), ("right", 4), ("back", 4),
                                    ("forward+left", 4), ("back", 4)), 4,
                         "square corners then a D->B diagonal shortcut skipping C; with 4 chunks "
                         "the shortcut covers 4/sqrt(2) ~ 2.8 units per axis of B's 4, so it lands "
                         "near, not on, B (and the final A is as far off)."),
    # Long-horizon ABA sweep.
    **{f"aba_n{n}": _aba(n // 2, "sweep", f"ABA with {n // 2}-chunk edges.")
       for n in (16, 32, 48, 64, 128, 256)},
}


def render(name: str) -> str:
    """The YAML text of ``CONFIGS[name]``: a generated-file header, then the document."""
    cfg = CONFIGS[name]
    points = " ".join(f"{label}@{chunk}" for chunk, label in cfg.waypoints())
    header = [
        "# Generated by `python -m worldtrace_cli.loopbench.configs` from",
        "# worldtrace_cli/loopbench/configs.py: edit CONFIGS there and regenerate, not this file.",
        f"# LoopBench {_TIER[cfg.tier]}: {name}, N={cfg.num_chunks} chunks; waypoints (chunk): {points}.",
        *(f"# {line}" for line in textwrap.wrap(cfg.about, 98)),
        "# No image: give one per run (--image).",
    ]
    body = yaml.safe_dump(cfg.document(), sort_keys=False, default_flow_style=None, width=100)
    return "\n".join(header) + "\n" + body


def write_configs(folder: str | Path = DEFAULT_FOLDER) -> list[Path]:
    """Write every configuration to ``folder/<name>.yaml`` (created if missing); returns the
    paths. Files of configurations no longer in CONFIGS are left alone (the tests flag them)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in CONFIGS:
        path = folder / f"{name}.yaml"
        path.write_text(render(name), encoding="utf-8")
        paths.append(path)
    return paths


def tier_of(config: str) -> int | str:
    """The paper's tier of a configuration (1..4 or ``sweep``); ``prompt`` for a prompt loop
    (:data:`~worldtrace_cli.loopbench.prompts.PROMPT_LOOPS`); ``custom`` for other trajectories."""
    from .prompts import PROMPT_LOOPS

    return CONFIGS[config].tier if config in CONFIGS else "prompt" if config in PROMPT_LOOPS else "custom"


def is_aba(config: str) -> bool:
    """ABA-type configurations (aba, aba_short/medium/long, aba_n*): the PAC-vs-N plot's runs."""
    return config in CONFIGS and "".join(CONFIGS[config].route) == "ABA"


if __name__ == "__main__":
    written = write_configs(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_FOLDER)
    sys.stderr.write(f"wrote {len(written)} LoopBench trajectories to {written[0].parent}\n")
