"""Attention per cache slot (``--attention-stats``): the shares are exact (a direct softmax, a constructed
cache whose scores are known, the materialised attention of real rollouts on the tiny presets, whose
product with the values is SDPA's output), they change no frame, and they reach the records, the
summary's recall attention, the read-back functions and the pictures."""

import json
import math
from pathlib import Path

import pytest
import torch

from worldtrace_cli.model.attention_stats import AttentionProbe, query_sample, segment_shares
from worldtrace_cli.outputs.records import expand_slot_records, most_read_slot, recall_attention, recall_share

from conftest import invoke, one_line_error, skip_without_ffmpeg

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"


def direct_shares(q, k, segments):
    """The materialised attention: softmax(q k^T / sqrt(d)) in float64 [B, H, n, N], summed per segment
    and averaged over batch, heads and queries."""
    scores = torch.einsum("bnhd,bmhd->bhnm", q.double(), k.double()) / math.sqrt(q.shape[-1])
    p = scores.softmax(-1)
    bounds = torch.tensor([0, *segments]).cumsum(0).tolist()
    return torch.stack([p[..., a:b].sum(-1).mean() for a, b in zip(bounds, bounds[1:])])


def test_shares_equal_a_direct_softmax_in_blocks_and_on_a_sample():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 24, 3, 16, generator=gen), torch.randn(2, 40, 3, 16, generator=gen)
    segments = [8, 0, 12, 4, 16]  # an empty slot (a WorldKV frame that kept no token) gets 0
    want = direct_shares(q, k, segments)
    for block_bytes in (4 * 40 * 2 * 3, 2**20):  # one query per block, and all at once
        got = segment_shares(q, k, segments, block_bytes=block_bytes)
        assert got.dtype == torch.float64 and got.shape == (5,)
        assert (got - want).abs().max() < 1e-6 and abs(float(got.sum()) - 1) < 1e-6 and got[1] == 0
    sample = query_sample(5, 24, seed=3, chunk=7)
    assert sample.tolist() == sorted(sample.tolist()) and len(set(sample.tolist())) == 5
    assert torch.equal(sample, query_sample(5, 24, seed=3, chunk=7))  # a resumed run samples the same tokens
    assert not torch.equal(sample, query_sample(5, 24, seed=3, chunk=8))
    assert query_sample(0, 24, 3, 7) is None and query_sample(24, 24, 3, 7) is None
    got = segment_shares(q, k, segments, sample)
    assert (got - direct_shares(q[:, sample], k, segments)).abs().max() < 1e-6
    with pytest.raises(ValueError, match="sum to the 40 keys"):
        segment_shares(q, k, [8, 8])


def test_a_constructed_cache_whose_scores_are_known():
    """Slot 0's keys are zero (every score 0), slot 1's are the query direction scaled so each score is
    log(4) for the one query: the shares are T0 / Z and 4 T1 / Z with Z = T0 + 4 T1 + the chunk's own."""
    d, t0, t1 = 16, 5, 3
    q = torch.zeros(1, 1, 1, d)
    q[..., 0] = 2.0
    k = torch.zeros(1, t0 + t1 + 2, 1, d)
    k[:, t0:t0 + t1, :, 0] = math.log(4) * math.sqrt(d) / 2.0  # q . k / sqrt(d) = log 4
    k[:, t0 + t1:, :, 0] = -1e3  # the chunk's own keys: nothing (score -500)
    got = segment_shares(q, k, [t0, t1, 2])
    z = t0 + 4 * t1
    assert abs(got[0] - t0 / z) < 1e-6 and abs(got[1] - 4 * t1 / z) < 1e-6 and got[2] < 1e-12


def _run_config(preset_name, trajectory, cache, attention=True, chunks=3, **extra):
    from worldtrace_cli.config import RunConfig, load_preset, memory_config

    preset = load_preset(preset_name)
    return RunConfig(preset=preset, trajectory=trajectory, output=Path("unused"), chunks=chunks, metrics="none",
                     progress=False, memory=memory_config(cache=cache, preset=preset), attention_stats=attention,
                     device="cpu", **extra)


def _generate_rollout(cfg):
    """``generate``'s rollout of ``cfg`` (attention measured as it asks) and ``feed(chunk)``: that chunk's
    request from the trajectory (None where the rollout feeds itself)."""
    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.jobs.generate import new_run
    from worldtrace_cli.jobs.inputs import prepare_inputs

    inputs = prepare_inputs(cfg)
    pipeline = Pipeline.from_config(cfg)
    run = new_run(pipeline, cfg, inputs)
    feed = run.feed
    return run.rollout, (lambda c: None) if feed is None else feed.request


@pytest.mark.parametrize("preset, trajectory, cache, image", [
    ("tiny", "aba.yaml", "landmark", IMAGE),
    ("lingbot-tiny", "aba.yaml", "sink", None),
    ("self-forcing-tiny", "prompts_aba.yaml", "field", None),
])
def test_rollout_shares_equal_the_materialised_attention_sdpa_reads(preset, trajectory, cache, image, monkeypatch):
    """On every tiny preset (MG2, LingBot-World, Self-Forcing), each layer's shares at a chunk's last denoising
    step equal the materialised softmax over the q and key buffer the probe was handed, and that softmax
    times the value buffer is the attention output the block's output projection receives (SDPA's)."""
    torch.manual_seed(0)
    rollout, feed = _generate_rollout(_run_config(preset, ROOT / "trajectories" / trajectory, cache, image=image))
    checked, pending, direct, per_layer = [], {}, {}, []
    original = AttentionProbe.observe

    def spy(self, layer, q, k, v, current):
        original(self, layer, q, k, v, current)
        segments = self.tokens[layer].tolist() + [current]
        want = direct_shares(q, k, segments)
        assert (self.layers[layer] - want).abs().max() < 1e-5, (layer, self.layers[layer], want)
        direct[layer] = want
        scores = torch.einsum("bnhd,bmhd->bhnm", q.double(), k.double()) / math.sqrt(q.shape[-1])
        pending[layer] = torch.einsum("bhnm,bmhd->bnhd", scores.softmax(-1), v.double()).flatten(2)
        checked.append((layer, len(segments)))

    def sdpa_output(layer):
        def hook(module, args):
            if layer in pending:
                want = pending.pop(layer)
                assert (args[0].double() - want).abs().max() < 1e-4 * max(1.0, float(want.abs().max()))
        return hook

    monkeypatch.setattr(AttentionProbe, "observe", spy)
    handles = [block.self_attn.o.register_forward_pre_hook(sdpa_output(i))
               for i, block in enumerate(rollout.dit.blocks)]
    try:
        outs = []
        for c in range(3):
            outs.append(rollout.step(feed(c)))
            # which layer read which slot: the record's [L][S] against the direct softmax of each layer
            got = outs[-1].record["cache"]["attention"]["slots_by_layer"]
            want = [direct[layer][:-1].tolist() for layer in sorted(direct)]
            assert len(got) == len(want) and all(len(g) == len(w) for g, w in zip(got, want))
            per_layer.append(max((abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)), default=0.0))
    finally:
        for h in handles:
            h.remove()
    layers = len(rollout.dit.blocks)
    assert len(checked) == 3 * layers and not pending  # one call a chunk (the last denoising step), every layer
    assert checked[-1][1] > 1  # the last chunk read past slots
    assert max(per_layer) < 1e-5, per_layer  # 5 digits
    for out in outs:
        att = out.record["cache"]["attention"]
        shares = [a for run in out.record["cache"]["slots"] for a in run["attention"]]
        assert abs(sum(shares) + att["self"] - 1) < 1e-4
        assert att["pass"] == "last_denoising_step" and att["queries"] == "all"
        assert len(att["by_layer"]["self"]) == layers


def test_sampled_queries_are_said_in_the_record():
    rollout, feed = _generate_rollout(_run_config("tiny", ROOT / "trajectories" / "aba.yaml", "sliding", image=IMAGE,
                                                  attention_queries=7))
    rollout.step(feed(0))
    att = rollout.step(feed(1)).record["cache"]["attention"]
    assert att["queries"]["sampled"] == 7 and att["queries"]["seed"] == 0 and att["queries"]["of"] > 7
    with pytest.raises(ValueError):
        rollout.measure_attention(-1)


@pytest.mark.slow
def test_attention_stats_change_no_frame_and_reach_records_summary_and_timeline(tmp_path, valid):
    """The same run with and without --attention-stats: the same frames_sha256 chunk for chunk; the stats
    in chunks.jsonl (schema-valid), summary.json's attention with the recall on the return chunks, and
    the attention panel in cache_timeline.png (a taller picture)."""
    skip_without_ffmpeg()
    from PIL import Image

    args = ["generate", ROOT / "trajectories" / "aba.yaml", "--preset", "tiny", "--image", IMAGE, "--cache", "landmark",
            "--chunks", "10", "--no-progress", "--metrics", "none", "--threads", "1"]
    plain, stats = tmp_path / "plain", tmp_path / "stats"
    assert invoke(*args, "-o", plain).exit_code == 0
    result = invoke(*args, "-o", stats, "--attention-stats")
    assert result.exit_code == 0, result.output
    a = [json.loads(line) for line in (plain / "chunks.jsonl").read_text().splitlines()]
    b = [json.loads(line) for line in (stats / "chunks.jsonl").read_text().splitlines()]
    assert [r["frames_sha256"] for r in a] == [r["frames_sha256"] for r in b]
    assert "attention" not in a[-1]["cache"] and all("attention" not in s for s in a[-1]["cache"]["slots"])
    valid(stats / "chunks.jsonl", "chunk-record")
    summary = json.loads((stats / "summary.json").read_text())
    valid(summary, "summary")
    assert json.loads((plain / "summary.json").read_text())["attention"] is None
    att = summary["attention"]
    assert att["chunks"] == 10 and abs(att["self"] + att["summary"] + att["recent"] - 1) < 1e-4
    # aba: A -> B over chunks 0-7, back over 8-9; the return chunks' first visits are the forward leg's
    assert att["recall"]["chunks"] and min(att["recall"]["chunks"]) >= 8
    from worldtrace_cli.metrics import first_visit_frames, revisit_pairs
    from worldtrace_cli.trajectory import load_trajectory, plan_actions

    plan = plan_actions(load_trajectory(ROOT / "trajectories" / "aba.yaml"), 10, 3)
    firsts = first_visit_frames(plan, revisit_pairs(plan)["chunk_pairs"])
    assert recall_attention(b, firsts)["mean"] == pytest.approx(att["recall"]["mean"], abs=1e-6)
    h_plain = Image.open(plain / "cache_timeline.png").size[1]
    assert Image.open(stats / "cache_timeline.png").size[1] > 1.5 * h_plain
    # what `worldtrace metrics` recomputes from the folder
    from worldtrace_cli.metrics import summarise_run

    assert summarise_run(stats)["attention"]["recall"] == att["recall"]


def _record(slots, self_share):
    return {"chunk": 9, "cache": {"slots": slots, "attention": {"self": self_share}}}


def test_most_read_slot_and_recall_read_back_a_record():
    slots = [{"role": "summary", "kind": "landmark", "count": 1, "frames": [[0, 0]], "offset": [-6, -6],
              "virtual_position": [21, 21], "tokens": 8, "attention": [0.1]},
             {"role": "summary", "kind": "field", "count": 1, "frames": [[1, 4]], "offset": [-5, -5],
              "virtual_position": [22, 22], "tokens": 8, "attention": [0.4]},
             {"role": "recent", "kind": "recent", "count": 2, "frames": [[25, 26]], "offset": [-2, -1],
              "virtual_position": [25, 26], "tokens": 8, "attention": [0.05, 0.15]}]
    rec = _record(slots, 0.3)
    top = most_read_slot(rec)
    assert top["slot"] == 1 and top["share"] == 0.4 and top["frames"] == [1, 2, 3, 4] and top["self"] == 0.3
    assert top["pixel_frames"] == list(range(1, 17))  # latent frames 1..4 decode to pixel frames 1..16
    assert [s["attention"] for s in expand_slot_records(slots)] == [0.1, 0.4, 0.05, 0.15]
    # the first visit {0, 1, 2}: all of slot 0, half of slot 1's four frames
    assert recall_share(rec, {0, 1, 2}) == pytest.approx(0.1 + 0.4 * 2 / 4)
    # alone, the return chunk is its own baseline: no lift; beside another chunk whose same slots got other
    # shares, the lift is the difference (what the return read beyond its slots' position)
    assert recall_attention([rec], {9: {26}, 4: {0}}) == {"chunks": [9], "per_chunk": [0.15], "mean": 0.15,
                                                          "expected": 0.15, "lift": 0.0}
    other = {**_record([dict(s) for s in slots], 0.3), "chunk": 8}
    other["cache"]["slots"][2] = {**slots[2], "attention": [0.05, 0.05]}
    got = recall_attention([other, rec], {9: {26}})
    assert got["mean"] == 0.15 and got["expected"] == 0.05 and got["lift"] == pytest.approx(0.1)
    assert recall_attention([rec], {3: {0}}) is None
    bare = {"chunk": 2, "cache": {"slots": []}}
    with pytest.raises(ValueError, match="--attention-stats"):
        most_read_slot(bare)
    assert most_read_slot(_record([], 1.0)) is None
    # per layer: layer 1 read the landmark most, layer 0 the field slot (as the mean over layers does)
    with pytest.raises(ValueError, match="per layer"):
        most_read_slot(rec, layer=0)
    rec["cache"]["attention"].update(by_layer={"self": [0.2, 0.4]},
                                     slots_by_layer=[[0.0, 0.7, 0.05, 0.05], [0.2, 0.1, 0.05, 0.25]])
    assert most_read_slot(rec, layer=0)["slot"] == 1 and most_read_slot(rec, layer=0)["share"] == 0.7
    top = most_read_slot(rec, layer=1)
    assert top["slot"] == 3 and top["share"] == 0.25 and top["self"] == 0.4 and top["frames"] == [26]
    with pytest.raises(IndexError, match="2 self-attention layers"):
        most_read_slot(rec, layer=2)


def test_attention_queries_without_the_stats_is_a_usage_error():
    line = one_line_error(invoke("generate", ROOT / "trajectories" / "aba.yaml", "--attention-queries", "8"), 2)
    assert "--attention-stats" in line


def test_the_attention_picture_marks_return_chunks_and_outlines_the_slots_of_the_first_visit():
    """attention_grid / draw_attention: slots aligned at the bottom (NaN above a shorter cache), the
    chunk's own share last, a triangle over each return chunk and a cyan outline on exactly the slots
    that hold a frame of its first visit."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from worldtrace_cli.outputs.timeline import attention_grid, draw_attention

    def run(first, last, shares, kind="recent"):
        n = len(shares)
        return {"role": "recent", "kind": kind, "count": n, "frames": [[first, last]], "tokens": 4,
                "offset": [-n], "virtual_position": [-n], "attention": shares}

    records = [{"chunk": 0, "cache": {"attention": {"self": 1.0}, "slots": []}},
               {"chunk": 1, "cache": {"attention": {"self": 0.5}, "slots": [run(0, 2, [0.2, 0.2, 0.1])]}},
               {"chunk": 2, "cache": {"attention": {"self": 0.4}, "slots": [run(0, 0, [0.3], "landmark"),
                                                                          run(3, 5, [0.1, 0.1, 0.1])]}}]
    returns = {2: {0, 1}}  # chunk 2 comes back to where latent frames 0 and 1 were taken
    grid, held = attention_grid(records, returns)
    assert grid.shape == (5, 3) and np.isnan(grid[:4, 0]).all() and grid[4, 0] == 1.0
    assert np.isnan(grid[0, 1]) and grid[1:4, 1].tolist() == [0.2, 0.2, 0.1]
    assert grid[:, 2].tolist() == [0.3, 0.1, 0.1, 0.1, 0.4]
    assert held.tolist() == [[0, 0, 1], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]  # the landmark holding frame 0
    fig, ax = plt.subplots()
    try:
        assert draw_attention(ax, records, returns) is not None
        outlined = [(p.get_x() + 0.5, p.get_y() + 0.5) for p in ax.patches]
        assert outlined == [(2, 0)]
        marks = [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
        assert [x for x, _ in marks] == [2]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["0: landmark", "1: recent", "2: recent", "3: recent", "chunk itself"]
    finally:
        plt.close(fig)
