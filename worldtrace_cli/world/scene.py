"""A seeded procedural world: a plaza of open ground ringed by textured buildings on a grid.

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


@functools.lru_cache(maxsize=64)
def make_world(seed: int, cells: int = WORLD_CELLS) -> World:
    """Build the world of ``seed`` (deterministic; about 20 ms; the last 64 are cached, so treat the
    returned arrays as read-only).

    Regions get hues spread around the colour wheel in a shuffled order, so neighbouring regions
    differ; each building draws its colours near its region's hue (a darker and a lighter tone, or
    a contrasting accent), a pattern and a frequency.

    Args:
        seed: any integer >= 0.
        cells: grid side in cells (even; default :data:`WORLD_CELLS`).
    Raises:
        ValueError: a negative seed or an odd/too small ``cells``.
    """
    if seed < 0:
        raise ValueError(f"world seed must be >= 0, got {seed}")
    if cells < 2 * REGION_UNITS or cells % 2:
        raise ValueError(f"cells must be even and >= {2 * REGION_UNITS}, got {cells}")
    rng = np.random.default_rng([seed, 0x5EED])
    regions = -(-cells // REGION_UNITS)
    hues = (rng.permutation(regions * regions) / (regions * regions) * 7.0 + rng.random()) % 1.0
    hues = hues.reshape(regions, regions)
    r = rng.random((4, regions, regions))
    floor_a = _hsv(hues, 0.25 + 0.3 * r[0], 0.30 + 0.15 * r[1])
    floor_b = _hsv(hues + 0.05, 0.20 + 0.3 * r[2], 0.45 + 0.2 * r[3])

    half = cells / 2.0
    centres = np.arange(cells) - half + 0.5
    cx, cy = np.meshgrid(centres, centres, indexing="ij")
    solid = rng.random((cells, cells)) < BUILDING_DENSITY
    solid &= np.hypot(cx, cy) > PLAZA_RADIUS
    corridor = (np.abs(cx) < CORRIDOR_HALF_WIDTH) & (cy > CORRIDOR_Y[0]) & (cy < CORRIDOR_Y[1])
    solid &= ~corridor
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


__all__ = ["EYE_HEIGHT", "PATTERNS", "REGION_UNITS", "WALL_HEIGHT", "WORLD_CELLS", "World", "make_world"]
