"""A numpy raycaster that draws a :class:`~worldtrace_cli.world.scene.World` from a camera pose.

Classic grid raycasting (one ray per pixel column, DDA through the cells until a building is hit),
then per pixel: building wall (pattern in the building's two colours, darker on x-facing sides),
ground (the region's checker), or sky (a vertical gradient; with a world's ``compass`` its horizon
colour turns with heading, and its ``sun`` is a disc in it), all blended into the world's fog
colour with distance. Pattern contrast fades out where a pattern period becomes smaller than about
two pixels, so distant walls and ground do not alias into moire (which a small codec cannot encode
and a model would learn as noise). Pitch shears the image vertically (the horizon row moves), as
in grid raycasters. The cell holding the camera is never drawn, so a trajectory that walks through
a building sees out of it instead of a blank frame.

Camera: pose (x, y, yaw_deg, pitch_deg) of :mod:`worldtrace_cli.world.motion` (yaw 0 faces +y,
positive yaw turns right towards +x), eye at :data:`~worldtrace_cli.world.scene.EYE_HEIGHT`,
horizontal field of view :data:`FOV_DEG`, square pixels.
"""

from __future__ import annotations

import numpy as np

from .scene import EYE_HEIGHT, WALL_HEIGHT, World

FOV_DEG = 90.0
FOG_UNITS = 28.0   # distance at which everything is fog colour
MAX_STEPS = 96     # DDA cell crossings per ray (beyond FOG_UNITS anyway)
SIDE_SHADE = 0.78  # x-facing walls are darker: a cue for orientation


def _soft_square(phase: np.ndarray) -> np.ndarray:
    """A square wave with soft edges in [0, 1] (less aliasing than a hard one)."""
    return np.clip(0.5 + 1.6 * np.sin(2 * np.pi * phase), 0.0, 1.0)


def _wall_mix(pattern: np.ndarray, u: np.ndarray, v: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """Mix weight of colour b in [0, 1] for wall coordinates u (along the face) and v (height)."""
    out = np.zeros_like(u)
    for pid, fn in enumerate((
        lambda u, v, f: _soft_square(u * f),                                  # vertical stripes
        lambda u, v, f: _soft_square(v * f * 0.8),                            # horizontal bands
        lambda u, v, f: np.abs(_soft_square(u * f * 0.5) - _soft_square(v * f * 0.5)),  # checker
        lambda u, v, f: ((np.abs((u * f) % 1 - 0.5) < 0.28) & (np.abs((v * 1.2) % 1 - 0.5) < 0.22)
                         & (v > 0.3)).astype(u.dtype),                        # windows
        lambda u, v, f: _soft_square((u + v) * f * 0.7),                      # diagonal stripes
        lambda u, v, f: np.clip(v / WALL_HEIGHT, 0, 1) * 0.6,                 # plain gradient
    )):
        sel = pattern == pid
        if sel.any():
            out[sel] = fn(u[sel], v[sel], freq[sel])
    return out


def _fade(footprint: np.ndarray, period: np.ndarray | float) -> np.ndarray:
    """Pattern contrast kept where a period spans more than ~2-4 pixels (footprint = units per pixel)."""
    return np.clip(2.0 - 2.0 * footprint * 2.0 / period, 0.0, 1.0)


def cast_rays(world: World, x: float, y: float, yaw_deg: float, width: int, focal: float):
    """Cast one ray per column from (x, y) at heading ``yaw_deg``.

    Returns:
        (dist, side, u, ci, cj), each [W]: perpendicular (planar) distance to the first building
        wall in units (inf where none within :data:`MAX_STEPS`), side 0 = x-facing face / 1 =
        y-facing, u = position along the face in [0, 1), and the hit cell's indices (-1: no hit);
        plus the ray directions (dx, dy) [W] (unit forward component).
    """
    yaw = np.deg2rad(yaw_deg)
    fx, fy = np.sin(yaw), np.cos(yaw)
    rx, ry = np.cos(yaw), -np.sin(yaw)
    s = (np.arange(width) + 0.5 - width / 2) / focal
    dx, dy = fx + s * rx, fy + s * ry
    half, n = world.half, world.cells
    px, py = x + half, y + half
    ci = np.full(width, int(np.floor(px)))
    cj = np.full(width, int(np.floor(py)))
    start = (ci.copy(), cj.copy())
    with np.errstate(divide="ignore"):
        ddx = np.where(dx == 0, np.inf, np.abs(1.0 / dx))
        ddy = np.where(dy == 0, np.inf, np.abs(1.0 / dy))
    step_i = np.where(dx < 0, -1, 1)
    step_j = np.where(dy < 0, -1, 1)
    side_x = np.where(dx < 0, (px - ci) * ddx, (ci + 1.0 - px) * ddx)
    side_y = np.where(dy < 0, (py - cj) * ddy, (cj + 1.0 - py) * ddy)
    dist = np.full(width, np.inf)
    side = np.zeros(width, np.int64)
    hit_i = np.full(width, -1)
    hit_j = np.full(width, -1)
    active = np.ones(width, bool)
    for _ in range(MAX_STEPS):
        take_x = side_x < side_y
        d_now = np.where(take_x, side_x, side_y)
        ci = np.where(active & take_x, ci + step_i, ci)
        cj = np.where(active & ~take_x, cj + step_j, cj)
        side_x = np.where(active & take_x, side_x + ddx, side_x)
        side_y = np.where(active & ~take_x, side_y + ddy, side_y)
        inside = (ci >= 0) & (ci < n) & (cj >= 0) & (cj < n)
        solid = np.zeros(width, bool)
        solid[inside] = world.solid[ci[inside], cj[inside]]
        solid &= ~((ci == start[0]) & (cj == start[1]))
        new = active & (solid | ~inside | (d_now > FOG_UNITS))
        hit = active & solid
        dist[hit] = d_now[hit]
        side[hit] = np.where(take_x, 0, 1)[hit]
        hit_i[hit], hit_j[hit] = ci[hit], cj[hit]
        active &= ~new
        if not active.any():
            break
    hx, hy = px + dist * dx, py + dist * dy
    u = np.where(side == 0, hy, hx)
    u = np.where(np.isfinite(u), u - np.floor(np.where(np.isfinite(u), u, 0)), 0.0)
    return dist, side, u, hit_i, hit_j, dx, dy


def render_view(world: World, pose, height: int, width: int) -> np.ndarray:
    """Render one frame.

    Args:
        world: the scene.
        pose: (x, y, yaw_deg, pitch_deg) in units and degrees (:mod:`~worldtrace_cli.world.motion`).
        height, width: pixels (>= 8).
    Returns:
        uint8 [height, width, 3] RGB.
    Raises:
        ValueError: a non-finite pose or a size below 8 px.
    """
    x, y, yaw, pitch = (float(v) for v in pose)
    if not all(np.isfinite((x, y, yaw, pitch))):
        raise ValueError(f"pose must be finite, got {pose}")
    if height < 8 or width < 8:
        raise ValueError(f"frame size must be at least 8x8, got {height}x{width}")
    focal = (width / 2) / np.tan(np.deg2rad(FOV_DEG / 2))
    dist, side, u, hi, hj, dx, dy = cast_rays(world, x, y, yaw, width, focal)
    horizon = height / 2 + focal * np.tan(np.deg2rad(pitch))
    t = (horizon - (np.arange(height) + 0.5))[:, None] / focal           # [H, 1] slope of each row's ray
    z_wall = EYE_HEIGHT + t * dist[None, :]                                  # [H, W] height hit on the wall
    is_wall = np.isfinite(dist)[None, :] & (z_wall >= 0) & (z_wall <= world.wall_height)
    is_floor = (t < 0) & ~is_wall
    img = np.empty((height, width, 3), np.float32)
    depth = np.full((height, width), np.inf, np.float32)

    # sky: gradient by elevation (towards each column's heading tint with a compass), then the sun
    elev = np.clip(np.arctan(t) / np.deg2rad(60), 0, 1) ** 0.7                # [H, 1]
    img[:] = np.broadcast_to(_sky(world, elev, dx, dy), img.shape)
    if world.sun is not None:
        _draw_sun(img, world.sun, np.rad2deg(np.arctan(t)), dx, dy)

    # walls
    wr, wc = np.nonzero(is_wall)
    if wr.size:
        ci, cj = hi[wc], hj[wc]
        d = dist[wc]
        v = z_wall[wr, wc]
        pat, freq = world.pattern[ci, cj], world.frequency[ci, cj]
        mix = _wall_mix(pat, u[wc], v, freq)
        mix = 0.5 + (mix - 0.5) * _fade(d / focal, 1.0 / freq) if pat.size else mix
        col = world.color_a[ci, cj] * (1 - mix[:, None]) + world.color_b[ci, cj] * mix[:, None]
        col = col * np.where(side[wc] == 0, SIDE_SHADE, 1.0)[:, None]
        img[wr, wc] = col
        depth[wr, wc] = d

    # ground: checker of 1-unit squares in the region's colours
    fr, fc = np.nonzero(is_floor)
    if fr.size:
        d = EYE_HEIGHT / (-t[fr, 0])
        gx, gy = x + d * dx[fc], y + d * dy[fc]
        half = world.half
        ri = np.clip(((gx + half) // 8).astype(np.int64), 0, world.floor_a.shape[0] - 1)
        rj = np.clip(((gy + half) // 8).astype(np.int64), 0, world.floor_a.shape[1] - 1)
        check = ((np.floor(gx) + np.floor(gy)) % 2).astype(np.float32)
        # a ground pixel covers d/focal units across and more along the ray (d^2 / (eye * focal))
        footprint = np.maximum(d / focal, d * d / (EYE_HEIGHT * focal))
        mix = 0.5 + (check - 0.5) * _fade(footprint, 2.0)
        img[fr, fc] = world.floor_a[ri, rj] * (1 - mix[:, None]) + world.floor_b[ri, rj] * mix[:, None]
        depth[fr, fc] = d

    fog = np.clip(depth / FOG_UNITS, 0, 1) ** 1.5
    fog = np.where(np.isfinite(depth), fog, 0.0)[..., None]
    img = img * (1 - fog) + world.fog[None, None] * fog
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def _headings(dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Heading in degrees [0, 360) of each column's ray (yaw convention: 0 = +y, 90 = +x)."""
    return np.rad2deg(np.arctan2(dx, dy)) % 360.0


def _sky(world: World, elev: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """float32 [H, W or 1, 3]: horizon colour (per column from ``world.compass``: the four tints
    blended with cos^2 weights of the angle to +y, +x, -y, -x) towards ``sky_top`` with ``elev``
    [H, 1] in [0, 1]."""
    if world.compass is None:
        horizon = world.sky_horizon[None, None]
    else:
        ang = np.deg2rad(_headings(dx, dy))[:, None] - np.deg2rad([0.0, 90.0, 180.0, 270.0])[None]
        w = np.clip(np.cos(ang), 0, None) ** 2                                 # [W, 4], sums to 1
        horizon = ((w / w.sum(1, keepdims=True)) @ world.compass)[None].astype(np.float32)
    return horizon * (1 - elev[..., None]) + world.sky_top[None, None] * elev[..., None]


def _draw_sun(img: np.ndarray, sun, row_elev_deg: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> None:
    """Paint the sun (yaw_deg, elevation_deg, radius_deg) into the sky ``img`` [H, W, 3] in place, a
    pale warm disc with a one-degree soft edge (walls and ground are drawn over it)."""
    yaw, elevation, radius = sun
    daz = (_headings(dx, dy) - yaw + 180.0) % 360.0 - 180.0                      # [W]
    off = np.hypot(daz[None, :], row_elev_deg - elevation)                      # [H, W] degrees
    a = np.clip(radius + 0.5 - off, 0, 1)[..., None]
    img[:] = img * (1 - a) + np.array([1.0, 0.93, 0.7], np.float32) * a


def render_frames(world: World, poses, height: int, width: int) -> np.ndarray:
    """Render a pose sequence: poses [N, 4] (numpy or torch) -> uint8 [N, height, width, 3]."""
    poses = np.asarray(poses.cpu() if hasattr(poses, "cpu") else poses, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 4:
        raise ValueError(f"poses must be [N, 4] (x, y, yaw_deg, pitch_deg), got {list(poses.shape)}")
    out = np.empty((poses.shape[0], height, width, 3), np.uint8)
    for i, pose in enumerate(poses):
        out[i] = render_view(world, pose, height, width)
    return out


__all__ = ["FOG_UNITS", "FOV_DEG", "cast_rays", "render_frames", "render_view"]
