"""The chunk phases of a memory plan (:func:`~worldtrace_cli.engine.memory_plan.plan_memory`): the
run's writer fills its cache through its own ``commit``, then one chunk runs through the backbone's own
rollout hooks (``chunk_inputs``, ``flow``, ``context``, the writer's ``commit``) and the streaming VAE
decoder, all under the plan's FakeTensorMode, in a MemTracker.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch._subclasses.fake_tensor import unset_fake_temporarily as unset_fake

from .rollout import CacheRead, WriterPast


def module_bytes(module) -> int:
    """Bytes of a module's parameters and buffers as they are stored."""
    return sum(p.numel() * p.element_size() for p in module.parameters()) + \
        sum(b.numel() * b.element_size() for b in module.buffers())


def peak_tracker():
    """A ``MemTracker`` kept to live bytes and their peak: its per-module statistics are off (they refuse
    a module called twice in one block, which the VAE's frame loop and the denoising steps do, and they
    hook gradients the planned runs never make). Modules are tracked with ``track_external``."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _pre_fw_hook(self, module, inputs) -> None:
            pass

        def _post_fw_hook(self, module, inputs, outputs) -> None:
            pass

    return PeakTracker()


def tracked_peak(tracker) -> int:
    """Peak bytes a tracker saw since its last entry (every device together)."""
    return max((snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values()), default=0)


def tracked_now(tracker) -> int:
    """Bytes a tracker sees live now (every device together)."""
    return sum(snap["Total"] for snap in tracker.get_tracker_snapshot("current").values())


class PlanPast(WriterPast):
    """The rollouts' :class:`~worldtrace_cli.engine.rollout.WriterPast` (each layer read from the writer
    when the DiT reaches it) with real positions of the same count: the DiT reads positions as Python
    numbers (one angle table per chunk). A compressed writer's per-slot token counts are values too
    (WorldKV): its slots are planned whole."""

    def __init__(self, writer, num_layers: int, slots: int):
        self.writer, self.num_layers, self.slots = writer, num_layers, slots
        self.counts = [None] * num_layers

    def __getitem__(self, layer: int):
        from dataclasses import replace

        p = super().__getitem__(layer)
        with unset_fake():
            return replace(p, positions=torch.arange(-len(p.positions), 0, dtype=torch.float64))


def fill_limit(preset) -> int:
    """The most chunks a plan commits before its planned chunk: enough for every fixed-size cache to
    settle (its window twice over, in chunks, and 4 more); a run longer than that is planned from the
    writer's own growth per chunk (:func:`chunk_phases`), so a plan takes the same time at 10 and at
    100,000 chunks."""
    return 2 * -(-preset.window // preset.frames_per_chunk) + 4


def _fill(rollout, writer, limit: int, tracker) -> dict:
    """Commit fake chunks of canonical K/V (the writer's own commit and eviction code at the run's shapes)
    until the writer's slots and device bytes stop growing, or ``limit`` are in. Returns ``settled``
    (stopped because nothing grew) and ``host_per_chunk`` (the host store's growth by the last commit,
    bytes: field's evicted frames, a bank's chunks)."""
    g, f = rollout.geometry, rollout.frames_per_chunk
    before, grew = None, 0
    for c in range(limit):
        writer.begin_chunk(c * f)
        host = writer.host_bytes()
        now = (len(writer.slots()), tracked_now(tracker) - host)  # the device's share: the host store grows apart
        if now == before:
            return {"settled": True, "host_per_chunk": grew}
        before = now
        shape = (1, f * g.tokens_per_frame, g.heads, g.head_dim)
        writer.commit([(torch.empty(shape, dtype=g.dtype), torch.empty(shape, dtype=g.dtype)) for _ in range(g.num_layers)],
                      list(range(c * f, c * f + f)))
        grew = writer.host_bytes() - host
        rollout.skip(torch.empty(1, rollout.latent_channels, f, *rollout.latent_hw))  # counted; what it keeps
    return {"settled": False, "host_per_chunk": grew}


def chunk_phases(plan, preset, memory, networks: tuple, offset: int, dtype, chunks: int) -> None:
    """Set ``plan``'s (a :class:`~worldtrace_cli.engine.memory_plan.MemoryPlan`) denoise, context and decode phases
    and its ``cache``, ``host_store`` parts for a run of ``chunks`` chunks.

    The planned chunk reads a cache its writer filled with ``chunks - 1`` commits, or with at most
    :func:`fill_limit` of them: a writer that settles by then (every fixed-size cache) is planned as
    settled and its host store grown by its own per-chunk growth to ``chunks - 1`` commits; one still
    growing on the device (``full``, ``yarn``) is planned at two fills and every figure carried on along
    the line through them (its cache and rotated buffers grow by one chunk's K/V per chunk). Constant
    time in ``chunks``.

    ``networks``: the fake (dit, vae, clip or None); ``offset``: bytes to add to what the tracker sees
    (it holds the whole DiT in the compute dtype: the GPU holds the stored one; umT5 when it stays).
    A writer whose commit reads its own values is planned as a window of its slot count
    (``plan.cache_model = "slots"``)."""
    target = chunks - 1  # commits before the planned chunk
    limit = min(target, fill_limit(preset))
    first = _phases_at(plan, preset, memory, networks, offset, dtype, limit)
    figures = first
    extra = target - first["filled"]
    if extra and not first["settled"] and first["filled"] >= 2:  # still growing on the device: along the line
        second = _phases_at(plan, preset, memory, networks, offset, dtype, first["filled"] // 2)
        span = first["filled"] - second["filled"]
        figures = {k: (first[k] + (first[k] - second[k]) * extra / span if k in LINEAR else first[k]) for k in first}
        figures["slots"] = round(figures["slots"])
    elif extra:  # settled: only the host store keeps growing, by the writer's own count per chunk
        figures = {**first, "host": first["host"] + extra * first["host_per_chunk"]}
    plan.phases.update({k: int(round(figures[k])) for k in ("denoise", "context", "decode")})
    plan.parts["cache"] = int(round(figures["cache"]))
    plan.parts["host_store"] = int(round(figures["host"]))
    plan.slots = figures["slots"]
    plan.cache_model = figures["cache_model"]


LINEAR = ("denoise", "context", "decode", "cache", "host", "slots")  # figures carried on along the line


def _phases_at(plan, preset, memory, networks: tuple, offset: int, dtype, limit: int) -> dict:
    """The chunk phases of :func:`chunk_phases` after at most ``limit`` commits: ``denoise``, ``context``,
    ``decode`` (peak bytes), ``cache`` (device K/V bytes), ``host`` (the host store's bytes),
    ``host_per_chunk``, ``slots``, ``cache_model``, ``filled`` (commits made), ``settled``."""
    from ..config import memory_config
    from ..model.checkpoint import WorldModel
    from ..trajectory import MODES, frames_for_chunks
    from ..trajectory.actions import ActionPlan
    from .feed import ConditioningFeed
    from .pipeline import pipeline_class

    dit, vae, clip = networks
    pipe = pipeline_class(preset)(preset, WorldModel(dit, vae, clip, []), torch.device("cpu"), dtype, "float32", "none")
    spec, backbone, chunks = MODES[preset.mode], preset.backbone, limit + 1
    with unset_fake():  # the chunks' actions and the camera's poses: host arrays, as in a run
        keyboard = torch.zeros(frames_for_chunks(chunks, preset.frames_per_chunk), spec.keyboard_dim)
        mouse = torch.zeros(keyboard.shape[0], 2) if spec.mouse else None
        plan = ActionPlan(preset.mode, chunks, keyboard, mouse, [""] * chunks, [], [], preset.frames_per_chunk,
                          ["plan"] * chunks if backbone.takes_prompts else None)
        feed = ConditioningFeed(plan, camera=backbone.camera)
        poses = feed.request(limit).poses  # every latent frame's, as a run's requests bring them
    tracker = peak_tracker()
    tracker.track_external(*[m for m in networks if m is not None])
    with tracker:
        conditioned = pipe.plan_conditioning()  # held for the whole run, as pipe.condition's output is
    held = tracked_now(tracker)
    cache_model = "writer"
    with tracker:
        writer = pipe.build_writer(memory)
        rollout = pipe.rollout(writer, conditioned, seed=0)  # fed: the requests below
        writer.set_poses(poses)  # what each chunk's request hands it (ChunkRollout.step)
        try:
            filled = _fill(rollout, writer, limit, tracker)
        except (DataDependentOutputException, DynamicOutputShapeException):  # see the module docstring
            slots = max(len(writer.slots()), int(writer.budget))
            cache_model = "slots"
            writer = pipe.build_writer(memory_config(preset=preset, cache="sliding", budget=slots))
            rollout = pipe.rollout(writer, conditioned, seed=0)
            writer.set_poses(poses)
            filled = _fill(rollout, writer, limit, tracker)
    f, (lh, lw) = preset.frames_per_chunk, pipe.latent_hw
    start = rollout.chunk * f
    writer.begin_chunk(start)
    slots = writer.slots()
    host = writer.host_bytes()
    out = {"cache": tracked_now(tracker) - held - host, "host": host, "slots": len(slots), "cache_model": cache_model,
           "filled": rollout.chunk, **filled}
    with tracker:  # the decoder's feature cache (made by the previous chunk's decode) lives across chunks
        decoder = pipe.decoder()
        decoder.decode(torch.empty(1, rollout.latent_channels, f, lh, lw))
    offset -= host  # the tracker sees the host store; the GPU does not hold it
    with tracker:
        with unset_fake():
            positions = torch.arange(-len(slots), 0, dtype=torch.float64)
            request = feed.request(rollout.chunk)
        read = CacheRead(slots, positions, None, 0, PlanPast(writer, rollout.geometry.num_layers, len(slots)),
                         writer.temporal_frequency_scale())
        inputs, cond = rollout.chunk_inputs(read, start, f, request)
        x = torch.empty(1, rollout.latent_channels, f, lh, lw)
        flow = rollout.flow(x, 0, inputs, cond)
    out["denoise"] = tracked_peak(tracker) + offset
    with tracker:
        x0 = rollout.to_x0(x, flow, 0)
        committed = rollout.context(x0, inputs, cond, lambda: torch.empty(x0.shape))  # a noised pass's draw
        writer.commit(committed, list(range(start, start + f)))  # the writer's copies while the chunk's are alive
    out["context"] = tracked_peak(tracker) + offset
    del committed, inputs, cond, flow, read
    with tracker:
        decoder.decode(x0)
    out["decode"] = tracked_peak(tracker) + offset
    return out


__all__ = ["PlanPast", "chunk_phases", "fill_limit", "module_bytes", "peak_tracker", "tracked_now", "tracked_peak"]
