"""MIND's format both ways: read a MIND clip as a prefix + trajectory, write MIND's submission layout and
its per-video result file (MIND: CSU-JPG/MIND, arXiv 2602.08025; the format as its repository's README
and ``src/process.py`` / ``src/utils/utils.py`` define it at commit 8f9c59c; docs/continue.md).

A clip folder holds ``video.mp4`` (24 fps) and ``action.json``::

    {"mark_time": 120, "total_time": 217, "caption": "...",
     "data": [{"time": 0, "ws": 1, "ad": 0, "ud": 0, "lr": 2,
               "actor_pos": {"x": .., "y": .., "z": ..}, "actor_rpy": {"x": roll, "y": pitch, "z": yaw},
               "camera_pos": {...}, "camera_rpy": {...}}, ...]}

``mark_time`` is the pixel frame where the prediction starts; ``total_time`` the ground truth's frames.
The flags are 0 (none), 1, 2: ``ws`` 1 forward / 2 backward, ``ad`` 1 left / 2 right, ``ud`` 1 look up
/ 2 look down, ``lr`` 1 look left / 2 look right (MIND's code; its README's 0/1 wording differs, the
code is what its evaluator reads). ``camera_*`` exist in third-person clips only.

A submission is ``{model}/{1st_data|3rd_data}/{mem_test|action_space_test}/{clip}/video.mp4`` holding
the predicted frames only: its frame 0 is compared with the ground truth's frame ``mark_time``.
MIND's result file is ``{"data": [entry per clip], "video_max_time": null}``; each entry has ``path``,
``perspective``, ``test_type``, ``error``, ``mark_time``, ``total_time``, ``sample_frames`` and the metric
groups. Its ``lcm`` group (per-frame ``mse``, ``psnr``, ``ssim``, ``lpips`` lists, their ``avg_*``,
``length``) is computed here as MIND computes it: frames resized to 1280x720 (a 16:9 frame directly,
else covered and centre-cropped), values in [0, 1], MSE per frame over C x H x W, PSNR and SSIM
(Gaussian 11 / 1.5) with data range 1. LPIPS (AlexNet weights), ``visual_quality`` (MUSIQ, LAION
aesthetics), ``dino`` (DINOv3) and ``action`` (ViPE camera estimation) need models this tool cannot
load: they are named in ``not_computed``, never filled in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InputError

FLAGS = {"ws": ("forward", "back"), "ad": ("left", "right"), "ud": ("camera_up", "camera_down"),
         "lr": ("camera_l", "camera_r")}  # MIND flag 1 / 2 -> the universal mode's action words
PERSPECTIVES = ("1st_data", "3rd_data")
TEST_TYPES = ("mem_test", "action_space_test")
MIND_FPS = 24.0
EVAL_SIZE = (720, 1280)  # (height, width) MIND's evaluator resizes every frame to
NOT_COMPUTED = {"lpips": "needs AlexNet weights (LPIPS, net='alex') this tool does not ship",
                "visual_quality": "needs MUSIQ (pyiqa) and the LAION aesthetic head on CLIP ViT-L/14",
                "dino": "needs DINOv3 ViT-B/16 weights",
                "action": "needs ViPE camera-pose estimation of both videos"}


@dataclass
class MindClip:
    """A MIND clip folder, read and checked.

    Attributes:
        folder, video (``video.mp4``), name (the folder's name); mark_time: the pixel frame the
        prediction starts at; total_time: the ground truth's pixel frames; caption; data: the per-frame
        entries (dicts as in ``action.json``); perspective / test_type: from the folder's path
        (``1st_data`` / ``3rd_data``, ``mem_test`` / ``action_space_test``), None when it does not say.
    """

    folder: Path
    video: Path
    name: str
    mark_time: int
    total_time: int
    caption: str
    data: list
    perspective: str | None
    test_type: str | None

    def actions(self) -> list[str]:
        """Each frame's action words in the universal mode (``forward+camera_r``; ``idle`` for none)."""
        out = []
        for entry in self.data:
            words = [FLAGS[k][entry[k] - 1] for k in ("ws", "ad", "ud", "lr") if entry[k]]
            out.append("+".join(words) or "idle")
        return out


def _int(value, where: str, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low):
        raise InputError(f"{where}: expected an integer{'' if low is None else f' >= {low}'}, got {value!r}")
    return value


def read_mind_clip(folder: str | Path) -> MindClip:
    """Read a MIND clip folder (``video.mp4`` + ``action.json``).

    Raises:
        InputError: a missing file, malformed JSON, or a field that is missing or of the wrong kind, named
            as ``action.json: data[3].ws: ...``; a ``mark_time`` past ``total_time`` or the entries.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"MIND clip {folder}: not a folder (a clip is a folder with video.mp4 and action.json)")
    video, actions = folder / "video.mp4", folder / "action.json"
    for path in (video, actions):
        if not path.is_file():
            raise InputError(f"MIND clip {folder}: no {path.name}")
    try:
        doc = json.loads(actions.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{actions}: not readable JSON ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{actions}: expected an object with mark_time, total_time and data")
    for key in ("mark_time", "data"):
        if key not in doc:
            raise InputError(f"{actions}: {key}: missing")
    mark = _int(doc["mark_time"], f"{actions}: mark_time", 1)
    data = doc["data"]
    if not isinstance(data, list) or not data:
        raise InputError(f"{actions}: data: expected a non-empty list of per-frame entries")
    for i, entry in enumerate(data):
        where = f"{actions}: data[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected an object")
        for key in FLAGS:
            if key not in entry:
                raise InputError(f"{where}.{key}: missing")
            if _int(entry[key], f"{where}.{key}") not in (0, 1, 2):
                raise InputError(f"{where}.{key}: expected 0 (none), 1 or 2, got {entry[key]!r}")
    total = _int(doc.get("total_time", len(data)), f"{actions}: total_time", 1)
    if mark >= total:
        raise InputError(f"{actions}: mark_time {mark} is not before total_time {total}: nothing to predict")
    if mark >= len(data):
        raise InputError(f"{actions}: mark_time {mark}: data has {len(data)} entries")
    parts = folder.resolve().parts
    return MindClip(folder, video, folder.name, mark, total, str(doc.get("caption", "")), data,
                    next((p for p in parts if p in PERSPECTIVES), None), next((p for p in parts if p in TEST_TYPES), None))


def mind_trajectory(clip: MindClip, frames: int | None = None) -> str:
    """A universal-mode trajectory (MG2's keyboard / mouse; trajectories/README.md) of the clip's actions,
    frame for frame: consecutive frames of one action as one ``frames: n`` segment, labelled ``mark`` at
    ``mark_time``. ``frames``: how many entries (default all)."""
    import yaml

    words = clip.actions()[:frames]
    segments, start = [], 0
    for i in range(1, len(words) + 1):
        if i == len(words) or words[i] != words[start] or i == clip.mark_time:
            seg = {"action": words[start], "frames": i - start}
            if start == clip.mark_time:
                seg = {"label": "mark", **seg}
            segments.append(seg)
            start = i
    head = (f"# MIND clip {clip.name}: its action.json frame for frame (mark_time {clip.mark_time}); "
            f"written by worldtrace mind\n")
    return head + yaml.safe_dump({"mode": "universal", "segments": segments}, sort_keys=False)


def mind_poses(clip: MindClip, source: str = "auto") -> np.ndarray:
    """Camera-to-world poses [N, 4, 4] float64 (OpenCV axes: x right, y down, z forward) of every entry, for
    LingBot-World's ``--poses``: from ``camera_pos`` / ``camera_rpy`` (``source`` ``camera``; the default
    where a clip has them, third-person) or ``actor_pos`` / ``actor_rpy`` (``actor``). MIND documents
    neither units nor axes; Unreal Engine's are assumed (left-handed, x forward, y right, z up,
    centimetres; roll / pitch / yaw in degrees): positions become metres. LingBot-World normalises the
    translation over the whole file, so the scale matters little; the axes do.

    Raises:
        InputError: an entry without the poses asked for."""
    use = source
    if use == "auto":
        use = "camera" if all("camera_pos" in e and "camera_rpy" in e for e in clip.data) else "actor"
    out = np.zeros((len(clip.data), 4, 4))
    # Unreal (x forward, y right, z up) -> OpenCV camera (x right, y down, z forward)
    axes = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
    for i, e in enumerate(clip.data):
        try:
            p, r = e[f"{use}_pos"], e[f"{use}_rpy"]
            pos = np.array([p["x"], p["y"], p["z"]], dtype=np.float64) / 100.0
            roll, pitch, yaw = np.radians([r["x"], r["y"], r["z"]])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{clip.folder / 'action.json'}: data[{i}]: no {use}_pos / {use}_rpy with x, y, z") from None
        cy, sy, cp, sp, cr, sr = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch), np.cos(roll), np.sin(roll)
        rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
        ry = np.array([[cp, 0, -sp], [0, 1, 0], [sp, 0, cp]])  # Unreal's pitch: positive looks up
        rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
        body = rz @ ry @ rx  # the camera's axes (forward, right, up) in the world, Unreal's order
        out[i, :3, :3] = axes @ body @ axes.T
        out[i, :3, 3] = axes @ pos
        out[i, 3, 3] = 1.0
    return out


def prefix_chunks_for(mark_time: int, frames_per_chunk: int) -> int:
    """The whole chunks of real frames before ``mark_time`` (the prefix committed): the largest K with
    ``4 F K - 3 <= mark_time``.

    Raises:
        InputError: ``mark_time`` shorter than one chunk."""
    from ..trajectory.actions import frames_for_chunks

    k = (mark_time + 3) // (4 * frames_per_chunk)
    if k < 1:
        raise InputError(f"mark_time {mark_time}: fewer real frames than one chunk ({frames_for_chunks(1, frames_per_chunk)})")
    return k


# --------------------------------------------------------------------------- the result file


def _resize_eval(frames: np.ndarray, size: tuple[int, int] = EVAL_SIZE) -> np.ndarray:
    """uint8 [T, H, W, 3] -> float32 [T, 3, h, w] in [0, 1] at MIND's evaluation size: a frame of the same
    aspect resized directly, else scaled to cover and centre-cropped (bilinear)."""
    import torch
    import torch.nn.functional as F

    h, w = size
    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0
    fh, fw = x.shape[2:]
    if abs(fh / fw - h / w) > 1e-3:
        scale = max(h / fh, w / fw)
        x = F.interpolate(x, size=(max(h, round(fh * scale)), max(w, round(fw * scale))), mode="bilinear",
                          align_corners=False, antialias=True)
        top, left = (x.shape[2] - h) // 2, (x.shape[3] - w) // 2
        return x[:, :, top:top + h, left:left + w].clamp(0, 1)
    return F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True).clamp(0, 1)


def lcm_scores(pred: np.ndarray, truth: np.ndarray, size: tuple[int, int] = EVAL_SIZE, batch: int = 8) -> dict:
    """MIND's ``lcm`` group of predicted frames against the ground truth's frames from ``mark_time`` on:
    per-frame ``mse`` / ``psnr`` (dB) / ``ssim`` lists over the first ``min(len)`` frames, their
    ``avg_*``, ``length``; ``lpips`` and ``avg_lpips`` are None (not computed: :data:`NOT_COMPUTED`).

    Args:
        pred, truth: uint8 [T, H, W, 3] (any sizes: both are brought to ``size``, (height, width)).
    """
    import torch
    from pytorch_msssim import ssim

    n = min(len(pred), len(truth))
    mse, psnr, ss = [], [], []
    for i in range(0, n, batch):
        a, b = _resize_eval(pred[i:i + batch], size), _resize_eval(truth[i:i + batch], size)
        m = (a - b).pow(2).flatten(1).mean(1).double()
        mse += m.tolist()
        psnr += torch.where(m > 0, 10 * torch.log10(1.0 / m.clamp_min(1e-12)), torch.tensor(100.0, dtype=torch.float64)).tolist()
        with torch.no_grad():
            ss += ssim(a, b, data_range=1.0, size_average=False).double().tolist()
    avg = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    return {"length": n, "mse": mse, "avg_mse": avg(mse), "psnr": psnr, "avg_psnr": avg(psnr), "ssim": ss,
            "avg_ssim": avg(ss), "lpips": None, "avg_lpips": None}


def result_entry(video: Path, clip: MindClip, perspective: str, test_type: str, size: tuple[int, int] = EVAL_SIZE,
                 sample_frames: int | None = None) -> dict:
    """One clip's entry of MIND's result file for a submitted ``video`` (predicted frames only), with the
    ``lcm`` group computed (:func:`lcm_scores`) and the groups this tool cannot compute named in
    ``not_computed``. A video that cannot be read is an entry with ``error`` set, as MIND records it."""
    from ..errors import OutputError
    from ..outputs import read_video_frames

    entry = {"path": str(video), "perspective": perspective, "test_type": test_type, "error": None,
             "mark_time": clip.mark_time, "total_time": clip.total_time, "sample_frames": None,
             "not_computed": dict(NOT_COMPUTED)}
    try:
        pred = read_video_frames(video)
        count = clip.total_time - clip.mark_time
        n = min(count, len(pred), sample_frames or len(pred))
        truth = read_video_frames(clip.video, indices=range(clip.mark_time, clip.mark_time + n))
    except OutputError as exc:
        entry["error"] = " ".join(str(exc).split())[:300]
        return entry
    entry["sample_frames"] = int(n)
    entry["lcm"] = lcm_scores(pred[:n], truth, size)
    return entry


def write_result(path: Path, entries: list[dict]) -> Path:
    """MIND's result file: ``{"data": entries, "video_max_time": null}`` (indent 2), written atomically."""
    from ..outputs import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps({"data": entries, "video_max_time": None}, indent=2), encoding="utf-8")
    return path


def read_result(path: str | Path) -> dict:
    """A MIND result file (ours or MIND's own evaluator's): ``{"data": [...], ...}``.

    Raises:
        InputError: not readable JSON, or no ``data`` list of objects with ``path``."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: not a readable MIND result file ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise InputError(f"{path}: data: expected the list of per-video entries of a MIND result file")
    for i, e in enumerate(doc["data"]):
        if not isinstance(e, dict) or "path" not in e:
            raise InputError(f"{path}: data[{i}]: expected an object with path")
    return doc


def result_table(doc: dict) -> list[dict]:
    """One row per entry of a result file: path, perspective, test_type, error, and the ``lcm`` averages."""
    rows = []
    for e in doc["data"]:
        lcm = e.get("lcm") or {}
        rows.append({"path": e["path"], "perspective": e.get("perspective"), "test_type": e.get("test_type"),
                     "error": e.get("error"), "frames": lcm.get("length"),
                     **{k: lcm.get(f"avg_{k}") for k in ("psnr", "ssim", "mse", "lpips")}})
    return rows


# --------------------------------------------------------------------------- a clip made here


def write_loopworld_clip(folder: Path, world_seed: int, trajectory: Path, mark_chunks: int, chunks: int | None = None,
                         preset_name: str = "loopworld", fps: float = MIND_FPS) -> MindClip:
    """A MIND clip rendered from loopworld's true render along ``trajectory`` (universal mode, its actions
    being MIND's flags: forward / back, left / right, camera_up / down, camera_l / r, one per axis at a
    time at the macros' magnitude), ``mark_time`` at the end of its first ``mark_chunks`` chunks:
    ``video.mp4`` (the truth, losslessly coded) and ``action.json`` with ``actor_pos`` (x, y on the ground
    plane, z = 0) and ``actor_rpy`` (roll 0, pitch, yaw in degrees) of every frame.

    Raises:
        InputError: a trajectory of another mode, or an action MIND's flags cannot say (two keys on one
            axis, a mouse magnitude other than the macros')."""
    from ..config import load_preset
    from ..outputs import VideoStreamWriter
    from ..trajectory import load_trajectory, plan_actions
    from ..trajectory.actions import CAMERA_STEP, frames_for_chunks
    from ..world.motion import plan_frame_poses
    from ..world.truth import GroundTruth

    preset = load_preset(preset_name)
    traj = load_trajectory(trajectory)
    if traj.mode != "universal":
        raise InputError(f"{trajectory}: mode {traj.mode!r}: a MIND clip is walked in universal mode")
    plan = plan_actions(traj, chunks, preset.frames_per_chunk)
    kb, mouse = plan.keyboard.numpy(), plan.mouse.numpy()
    data = []
    poses = plan_frame_poses(plan).numpy()
    for i in range(plan.num_frames):
        entry = {"time": i}
        for axis, (a, b), value in (("ws", (0, 1), None), ("ad", (2, 3), None)):
            entry[axis] = 1 if kb[i, a] > 0 else 2 if kb[i, b] > 0 else 0
        for axis, col in (("ud", 0), ("lr", 1)):
            v = float(mouse[i, col])
            if v and abs(abs(v) - CAMERA_STEP) > 1e-6:
                raise InputError(f"{trajectory}: row {i}: mouse {v}: MIND's flags carry the macros' {CAMERA_STEP} only")
            entry[axis] = 0 if not v else (1 if v > 0 else 2) if axis == "ud" else (1 if v < 0 else 2)
        x, y, yaw, pitch = poses[i]
        entry["actor_pos"] = {"x": float(x), "y": float(y), "z": 0.0}
        entry["actor_rpy"] = {"x": 0.0, "y": float(pitch), "z": float(yaw)}
        data.append(entry)
    mark = frames_for_chunks(mark_chunks, preset.frames_per_chunk)
    if not 1 <= mark < plan.num_frames:
        raise InputError(f"--mark-chunks {mark_chunks}: mark_time {mark} must fall inside the clip's {plan.num_frames} frames")
    folder.mkdir(parents=True, exist_ok=True)
    truth = GroundTruth(world_seed, plan, preset.height, preset.width, preset.world)
    with VideoStreamWriter(folder / "video.mp4", preset.width, preset.height, fps, crf=0) as video:
        for start in range(0, plan.num_frames, 48):
            video.write(truth.frames(start, min(start + 48, plan.num_frames)))
    doc = {"mark_time": mark, "total_time": plan.num_frames,
           "caption": f"loopworld world {world_seed} along {Path(trajectory).name} (rendered by worldtrace)", "data": data}
    (folder / "action.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return read_mind_clip(folder)


__all__ = ["EVAL_SIZE", "FLAGS", "MindClip", "NOT_COMPUTED", "PERSPECTIVES", "TEST_TYPES", "lcm_scores", "mind_poses",
           "mind_trajectory", "prefix_chunks_for", "read_mind_clip", "read_result", "result_entry", "result_table",
           "write_loopworld_clip", "write_result"]
