"""``benchmarks/fit_table.py`` (issue 66 part 2): the rows it derives instead of planning are the rows the plan
gives (every mode of two writers of a tiny LingBot-World preset, planned and derived), the card choice follows
``generate``'s order and margin, the FLOP count includes the attention (a closed form), and the table in
docs/gpu-memory.md is what the script renders from the committed results file (generated, not typed)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fit-table" / "plans.json"


@pytest.fixture(scope="module")
def fit_table():
    spec = importlib.util.spec_from_file_location("fit_table", ROOT / "benchmarks" / "fit_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny():
    from worldtrace_cli.config import load_preset

    return load_preset("lingbot-v2-1.3b-tiny")


@pytest.mark.slow
def test_derived_rows_are_the_planned_rows(fit_table, tiny, one_thread):
    """A writer's row in another mode = its bf16 chunk phases + what the mode changed in the own cache's, the
    load and text phases the own cache's: to the byte (GB to 3 decimals), for a writer planned through its own
    commits (full, which grows) and one planned as a window of its slots (landmark), each in one of the two modes
    farthest from bf16 (full: blocks + fp8; landmark: umT5 kept on the GPU + fp8)."""
    configs, refused = fit_table.writer_configs(tiny)
    memory = dict(configs)
    assert not refused and fit_table.OWN in memory and {"field", "full", "landmark", "mixed:2"} <= set(memory)
    own = {m: fit_table.plan_row(tiny, fit_table.OWN, memory[fit_table.OWN], *m.split("/"), chunks=8)
           for m in ("text/auto", "blocks/fp8", "none/fp8")}
    models = set()
    for writer, mode in (("full", "blocks/fp8"), ("landmark", "none/fp8")):
        base = fit_table.plan_row(tiny, writer, memory[writer], "text", "auto", chunks=8)
        models.add(base["cache_model"])
        planned = fit_table.plan_row(tiny, writer, memory[writer], *mode.split("/"), chunks=8)
        derived = fit_table.derive_row(base, own[mode], own["text/auto"])
        assert derived["phases_gb"] == pytest.approx(planned["phases_gb"], abs=0.0015), (writer, mode)
        assert derived["peak_phase"] == planned["peak_phase"] and derived["mode"] == mode
    assert models == {"writer", "slots"}
    with pytest.raises(ValueError, match="text/auto"):
        fit_table.derive_row(own["blocks/fp8"], own["blocks/fp8"], own["text/auto"])


def test_the_card_choice_is_generates_order_and_margin(fit_table):
    def row(mode, peak):
        return {"mode": mode, "peak_gb": peak, "peak_phase": "context"}

    rows = [row("text/auto", 16.4), row("text/fp8", 14.7), row("blocks/auto", 13.3), row("blocks/fp8", 12.1),
            row("none/fp8", 1.0)]
    # plan x 1.05 + 1 GB: 16.4 -> 18.2 (24 GB), 14.7 -> 16.4 (not 16), 13.3 -> 15.0 (16)
    assert fit_table.choice(rows, 24, 1.05, 1.0)["mode"] == "text/auto"
    assert fit_table.choice(rows, 16, 1.05, 1.0)["mode"] == "blocks/auto"
    assert fit_table.choice(rows, 8, 1.05, 1.0) is None  # the plan-only mode (umT5 kept) is never chosen
    assert fit_table._cell(rows[2]) == "blocks 13.3" and fit_table._cell(None) == "-"
    assert fit_table._cell({**rows[0], "peak_gb": 0.036, "peak_phase": "text"}) == "bf16 0.04 (text)"


@pytest.mark.slow
def test_the_flop_count_includes_the_attention(fit_table, tiny, one_thread):
    """The plan's DiT calls (a denoising call and the context pass over the full sink cache: 14 past latent
    frames) under FlopCounterMode: the attention is counted (the CPU SDPA kernel given the SDPA formula), one
    call's self- and cross-attention FLOPs as the closed form 4 Sq Sk D per layer."""
    from worldtrace_cli.config import default_cache, memory_config

    row = fit_table.plan_row(tiny, fit_table.OWN, memory_config(preset=tiny, **default_cache(tiny)), "text", "auto",
                             chunks=8, flops=True)
    f = row["flops"]
    tokens = (tiny.height // 16) * (tiny.width // 16)  # per latent frame: 6 x 11
    sq, sk, d, layers = 4 * tokens, (row["slots"] + 4) * tokens, tiny.dit.dim, tiny.dit.num_layers
    assert row["slots"] == 14
    assert f["dit_attention_flops_per_call"] == layers * 4 * d * sq * (sk + tiny.dit.text_len)
    assert f["dit_flops_per_chunk"] == 5 * f["dit_flops_per_call"] > 5 * f["dit_attention_flops_per_call"]
    assert f["decode_flops_per_chunk"] > 0


def test_the_docs_table_is_rendered_from_the_results_file(fit_table, tmp_path):
    """docs/gpu-memory.md's fit table is the script's rendering of the committed plans.json (rerun
    ``python benchmarks/fit_table.py --render`` after editing either); the markers are rewritten in place."""
    results = json.loads(RESULTS.read_text())
    text = fit_table.render(results)
    doc = (ROOT / "docs" / "gpu-memory.md").read_text()
    a, b = doc.index(fit_table.BEGIN) + len(fit_table.BEGIN), doc.index(fit_table.END)
    assert doc[a:b].strip() == text.strip()
    assert {"lingbot-fast", "lingbot-v2-1.3b", "mg2-universal", "self-forcing"} <= set(results["presets"])
    assert all(c["agree"] for e in results["presets"].values() for c in e.get("checks", []))
    copy = tmp_path / "doc.md"
    copy.write_text(f"before\n{fit_table.BEGIN}\nold\n{fit_table.END}\nafter\n")
    fit_table.rewrite_doc(copy, "new")
    assert copy.read_text() == f"before\n{fit_table.BEGIN}\nnew\n{fit_table.END}\nafter\n"
    copy.write_text("no markers")
    with pytest.raises(ValueError, match="fit-table:start"):
        fit_table.rewrite_doc(copy, "new")
