"""A seeded procedural world: a plaza of open ground ringed by buildings on a grid, in one of two
styles (:data:`STYLES`, a preset's ``world:``): ``procedural``, the textured city below, and
``towers``, drawn for what a small model can draw (:func:`make_world`, docs/loopworld.md).

The world is a square grid of 1-unit cells centred on the origin (the motion model's start,
:mod:`worldtrace_cli.world.motion`). Cells are empty ground or solid buildings of one wall height.
It is divided into square *regions* (``REGION_UNITS`` wide); each region has its own hue, so its
buildings (colour pair, one of six wall patterns, pattern frequency) and its floor checker differ
from every other region's and a returning camera has something specific to recall. A clear plaza
around the start, and a corridor along +y (where the long ABA loops walk), keep the standard
LoopBench trajectories in the open. Everything is drawn from ``numpy.random.default_rng(seed)``,
so a seed is a world: the same seed gives the same arrays on every machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

WORLD_CELLS = 112        # grid side in 1-unit cells (the world spans [-56, 56) units on both axes)
REGION_UNITS = 8         # side of a colour region in units
PLAZA_RADIUS = 5.5       # no building within this distance of the start
CORRIDOR_HALF_WIDTH = 1.5  # no building with |x| < this for y in the corridor range (long ABA walks)
CORRIDOR_Y = (-6.0, 50.0)
BUILDING_DENSITY = 0.3   # probability that a cell outside the plaza and corridor is a building
WALL_HEIGHT = 2.5        # units
EYE_HEIGHT = 0.9         # units above the ground
PATTERNS = ("vertical_stripes", "horizontal_bands", "checker", "windows", "diagonal", "plain")
STYLES = ("procedural", "towers")
TOWER_HEIGHT = 4.0       # units: the towers style's walls
TOWER_DENSITY = 0.15     # probability that a 2x2-cell block outside the plaza and corridor is a tower
TOWER_VALUES = (0.45, 0.70, 0.95)  # HSV values of the towers' solid colours


@dataclass(frozen=True)
class World:
    """A procedural world (arrays are read-only by convention).

    Attributes:
        seed: the seed it was built from.
        solid: bool [N, N]; cell (i, j) covers x in [i - N/2, i - N/2 + 1), y in [j - N/2, j - N/2 + 1).
        color_a, color_b: float32 [N, N, 3] in [0, 1]: the two colours of each building's pattern.
        pattern: int8 [N, N], index into :data:`PATTERNS`; frequency: float32 [N, N], pattern
            periods per unit of wall.
        floor_a, floor_b: float32 [R, R, 3]: the floor checker colours of each region (R regions a side).
        sky_top, sky_horizon, fog: float32 [3] colours.
        style: one of :data:`STYLES`.
        wall_height: units.
        compass: None, or float32 [4, 3]: the sky's colour at the horizon looking +y, +x, -y, -x
            (yaw 0, 90, 180, 270 degrees), blended between them: a cue of heading (towers).
        sun: None, or (yaw_deg, elevation_deg, radius_deg): a sun disc in the sky (towers).
    """

    seed: int
    solid: np.ndarray
    color_a: np.ndarray
    color_b: np.ndarray
    pattern: np.ndarray
    frequency: np.ndarray
    floor_a: np.ndarray
    floor_b: np.ndarray
    sky_top: np.ndarray
    sky_horizon: np.ndarray
    fog: np.ndarray
    style: str = "procedural"
    wall_height: float = WALL_HEIGHT
    compass: np.ndarray | None = None
    sun: tuple[float, float, float] | None = None

    @property
    def cells(self) -> int:
        """N, cells per side."""
        return self.solid.shape[0]

    @property
    def half(self) -> float:
        """Half the side in units: the world spans [-half, half) on both axes."""
        return self.cells / 2.0

    def cell_of(self, x: float, y: float) -> tuple[int, int]:
        """Grid index (i, j) of the cell containing world point (x, y) (may lie outside the grid)."""
        return int(np.floor(x + self.half)), int(np.floor(y + self.half))


def _hsv(h, s, v) -> np.ndarray:
    """HSV -> RGB for arrays (or scalars) of equal shape: float32 [..., 3] in [0, 1] (hue wraps)."""
    h, s, v = (np.asarray(a, np.float64) for a in (h, s, v))
    h, s, v = np.broadcast_arrays(h % 1.0, np.clip(s, 0, 1), np.clip(v, 0, 1))
    i = np.floor(h * 6.0).astype(np.int64) % 6
    f = h * 6.0 - np.floor(h * 6.0)
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    table = np.stack([np.stack(c, -1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])
    return np.take_along_axis(table, i[None, ..., None].repeat(3, -1), 0)[0].astype(np.float32)


def _region_hues(rng: np.random.Generator, cells: int) -> tuple[int, np.ndarray]:
    """(R regions a side, their hues float64 [R, R] in [0, 1)): spread around the colour wheel in a
    shuffled order, so neighbouring regions differ (two draws from ``rng``)."""
    regions = -(-cells // REGION_UNITS)
    hues = (rng.permutation(regions * regions) / (regions * regions) * 7.0 + rng.random()) % 1.0
    return regions, hues.reshape(regions, regions)


@functools.lru_cache(maxsize=64)
def make_world(seed: int, cells: int = WORLD_CELLS, style: str = "procedural") -> World:
    """Build the world of ``seed`` in ``style`` (deterministic; about 20 ms; the last 64 are cached,
    so treat the returned arrays as read-only).

    ``procedural``: regions get hues spread around the colour wheel in a shuffled order, so
    neighbouring regions differ; each building draws its colours near its region's hue (a darker
    and a lighter tone, or a contrasting accent), a pattern and a frequency. ``towers``: see
    :func:`_towers`.

    Args:
        seed: any integer >= 0.
        cells: grid side in cells (even; default :data:`WORLD_CELLS`).
        style: one of :data:`STYLES`.
    Raises:
        ValueError: a negative seed, an odd/too small ``cells`` or an unknown style.
    """
    if seed < 0:
        raise ValueError(f"world seed must be >= 0, got {seed}")
    if cells < 2 * REGION_UNITS or cells % 2:
        raise ValueError(f"cells must be even and >= {2 * REGION_UNITS}, got {cells}")
    if style not in STYLES:
        raise ValueError(f"world style must be one of {', '.join(STYLES)}, got {style!r}")
    if style == "towers":
        return _towers(seed, cells)
    rng = np.random.default_rng([seed, 0x5EED])
    regions, hues = _region_hues(rng, cells)
    r = rng.random((4, regions, regions))
    floor_a = _hsv(hues, 0.25 + 0.3 * r[0], 0.30 + 0.15 * r[1])
    floor_b = _hsv(hues + 0.05, 0.20 + 0.3 * r[2], 0.45 + 0.2 * r[3])

    solid = (rng.random((cells, cells)) < BUILDING_DENSITY) & ~_open_ground(cells)
    solid[0, :] = solid[-1, :] = solid[:, 0] = solid[:, -1] = True  # a closed outer wall

    region_of = np.arange(cells) // REGION_UNITS
    pattern = rng.integers(0, len(PATTERNS), (cells, cells)).astype(np.int8)
    frequency = (1.0 + rng.integers(0, 3, (cells, cells))).astype(np.float32)
    jitter = rng.random((4, cells, cells))
    h = hues[region_of[:, None], region_of[None, :]] + 0.08 * (jitter[0] - 0.5)
    sat = 0.45 + 0.5 * jitter[1]
    accent = np.where(jitter[3] < 0.3, 0.5, 0.0)  # some buildings carry a complementary accent
    color_a = _hsv(h, sat, 0.35 + 0.25 * jitter[2])
    color_b = _hsv(h + accent, sat * 0.8, 0.75 + 0.2 * jitter[2])
    sky_h = rng.random()
    return World(seed=int(seed), solid=solid, color_a=color_a, color_b=color_b, pattern=pattern,
                 frequency=frequency, floor_a=floor_a, floor_b=floor_b,
                 sky_top=_hsv(sky_h, 0.5, 0.75), sky_horizon=_hsv(sky_h + 0.05, 0.15, 0.95),
                 fog=_hsv(sky_h + 0.05, 0.12, 0.8))


def _open_ground(cells: int) -> np.ndarray:
    """bool [cells, cells]: the cells kept free of buildings, the plaza around the start and the
    corridor along +y (the standard trajectories walk there)."""
    centres = np.arange(cells) - cells / 2.0 + 0.5
    cx, cy = np.meshgrid(centres, centres, indexing="ij")
    corridor = (np.abs(cx) < CORRIDOR_HALF_WIDTH) & (cy > CORRIDOR_Y[0]) & (cy < CORRIDOR_Y[1])
    return (np.hypot(cx, cy) <= PLAZA_RADIUS) | corridor


def _towers(seed: int, cells: int) -> World:
    """The ``towers`` style (docs/loopworld.md), drawn for 96x176 frames and a 2x2-patch latent (one token
    covers 16x16 pixels): fewer, larger objects, solid colours, and cues of heading.

    - Towers of 2x2 cells (2 units a side), :data:`TOWER_HEIGHT` high, on about 14-15 % of the cells
      (the city: 1x1 cells, 2.5 high, 30 %); a block touching the plaza or corridor is left out whole.
    - Every tower one solid colour near its region's hue (saturation 0.65-0.95, value one of
      :data:`TOWER_VALUES`); x-facing sides darker (the renderer's side shade); plain ground in the
      region's colour. No stripes or checkers: nothing finer than a tower's face.
    - The sky's horizon colour turns with heading (four tints, one per compass direction), and a
      sun disc stands at a seeded heading 20 degrees up, 5 degrees wide: "where am I looking" can
      be read from the sky alone.

    Drawn from ``numpy.random.default_rng([seed, 0x70E5])``, so a seed is a world here too (not
    the same world as the city of that seed).
    """
    rng = np.random.default_rng([seed, 0x70E5])
    regions, hues = _region_hues(rng, cells)
    r = rng.random((2, regions, regions))
    floor = _hsv(hues, 0.25 + 0.25 * r[0], 0.35 + 0.2 * r[1])

    blocks = cells // 2
    free = _open_ground(cells).reshape(blocks, 2, blocks, 2).any(axis=(1, 3))
    towers = (rng.random((blocks, blocks)) < TOWER_DENSITY) & ~free
    solid = np.kron(towers, np.ones((2, 2), bool))
    solid[0, :] = solid[-1, :] = solid[:, 0] = solid[:, -1] = True  # a closed outer wall

    region_of = np.arange(blocks) * 2 // REGION_UNITS
    jitter = rng.random((3, blocks, blocks))
    hue = hues[region_of[:, None], region_of[None, :]] + 0.06 * (jitter[0] - 0.5)
    value = np.asarray(TOWER_VALUES, np.float64)[rng.integers(0, len(TOWER_VALUES), (blocks, blocks))]
    colour = _hsv(hue, 0.65 + 0.3 * jitter[1], value)
    colour = np.repeat(np.repeat(colour, 2, axis=0), 2, axis=1)
    sky_h = rng.random()
    compass = _hsv(sky_h + np.arange(4) * 0.25 + 0.1 * rng.random(4), 0.4, 0.95)
    return World(seed=int(seed), solid=solid, color_a=colour, color_b=colour,
                 pattern=np.full((cells, cells), PATTERNS.index("plain"), np.int8),
                 frequency=np.ones((cells, cells), np.float32), floor_a=floor, floor_b=floor,
                 sky_top=_hsv(sky_h, 0.55, 0.7), sky_horizon=_hsv(sky_h, 0.15, 0.95),
                 fog=_hsv(sky_h, 0.1, 0.85), style="towers", wall_height=TOWER_HEIGHT, compass=compass,
                 sun=(float(rng.uniform(0, 360)), 20.0, 5.0))


__all__ = ["EYE_HEIGHT", "PATTERNS", "REGION_UNITS", "STYLES", "TOWER_HEIGHT", "WALL_HEIGHT", "WORLD_CELLS", "World",
           "make_world"]
