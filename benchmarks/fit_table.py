"""What fits where: every full-size preset's GPU memory plan (``worldtrace bench memory``: the real modules at
the real shapes under FakeTensorMode, no GPU) for every writer at its default budget and every offload /
weight-dtype mode, recorded in ``benchmarks/results/fit-table/plans.json``, and the table of
``docs/gpu-memory.md`` between ``<!-- fit-table:start -->`` and ``<!-- fit-table:end -->`` rendered from it.

Usage (from the repository root; OMP_NUM_THREADS=1 on a shared CPU):

    python benchmarks/fit_table.py                    # plan everything, write plans.json and the docs table
    python benchmarks/fit_table.py --render           # only rewrite the docs table from plans.json
    python benchmarks/fit_table.py --presets lingbot-v2-1.3b --update   # re-plan some presets into plans.json
    python benchmarks/fit_table.py --presets tiny,lingbot-v2-1.3b-tiny --all-planned -o /tmp/p.json --no-docs

Which plans are computed: "every preset at full size" is every built-in preset with real weights
(``weights: checkpoint`` or ``bundled``; the random tiny presets are test models), planned in bf16 at 64 chunks
(``bench memory``'s default) with umT5-XXL for a checkpoint preset. Presets whose memory cannot differ
(they differ only in the sampler or its steps: loopworld-euler) share one set of plans (``same_as``). For each,
at its own resolution (and LingBot-World's also at the official ``--size 720*1280``, with its own cache):

- its own cache (``default_cache``, the run without ``--cache``) in every mode, each planned;
- every registered writer at its default budget in the ``text`` / bf16 mode, planned; its other modes
  *derived*: the load and text phases are the own cache's of that mode (the writer is not built before the
  chunk phases), and each chunk phase is the writer's bf16 phase plus what the mode changed in the own cache's
  (``plan_memory`` adds the mode as one offset to what the tracker saw, whatever the writer); one derived row per
  preset is planned too and must agree to the byte (``checks``), and ``--all-planned`` plans every row instead.
  That keeps a full table at about 150 plans of 5-30 s each instead of 600.

Modes: offload ``text`` (umT5 on the GPU only to encode the prompt: what runs do) or ``blocks`` (also the DiT's
blocks in host memory, two on the GPU), weights ``auto`` (bf16) or ``fp8``; ``none`` (umT5 kept on the GPU, plan
only) for a preset with a text encoder. A mode fits a card when ``peak x HEADROOM + RESERVE_GB`` (1.05, 1 GB:
``worldtrace_cli/jobs/bench_memory.py``, what ``generate`` checks) is within it.

FLOPs: the own cache's bf16 plan also runs under ``torch.utils.flop_counter.FlopCounterMode`` (it counts shapes:
fake tensors are enough; the CPU SDPA kernel the fake DiT dispatches to is given the SDPA formula here). The plan
makes one denoising call and the context pass, so a chunk's DiT FLOPs are half the DiT's count times (steps + 1);
the streaming decoder decodes one chunk.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from dataclasses import asdict, replace
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "fit-table" / "plans.json"
DOC = ROOT / "docs" / "gpu-memory.md"
BEGIN, END = "<!-- fit-table:start -->", "<!-- fit-table:end -->"
CARDS_GB = (8, 12, 16, 24, 48, 80)
CHUNKS = 64
OWN = "own"  # the label of a preset's own cache (default_cache)
# (offload, weights dtype): generate's choices first, in jobs/bench_memory.py's CANDIDATES order; none last
RUN_MODES = (("text", "auto"), ("text", "fp8"), ("blocks", "auto"), ("blocks", "fp8"))
PLAN_ONLY_MODES = (("none", "auto"), ("none", "fp8"))
LABELS = {("text", "auto"): "bf16", ("text", "fp8"): "fp8", ("blocks", "auto"): "blocks", ("blocks", "fp8"): "blocks+fp8",
          ("none", "auto"): "umT5 kept, bf16", ("none", "fp8"): "umT5 kept, fp8"}
# the official --size 720*1280 (lingbot-architecture.md §2.2, §10.1: 90x160 latents for a 16:9 image)
EXTRA_RESOLUTIONS = {"lingbot": ((720, 1280),)}
CHUNK_PHASES = ("denoise", "context", "decode")
# preset keys that cannot change a memory plan (the sampler and its steps; names and comments; file names)
NOT_MEMORY = ("name", "description", "sampler", "denoising_steps", "timestep_shift", "landmark_threshold",
              "context_noise", "files", "bundle")

log = logging.getLogger("fit_table")


def mode_key(offload: str, weights_dtype: str) -> str:
    """``offload/weights_dtype``, the key of a mode in the rows (``text/auto``)."""
    return f"{offload}/{weights_dtype}"


def full_size_presets(names=None) -> list[str]:
    """The built-in presets with real weights (``checkpoint`` or ``bundled``), or ``names`` as given."""
    from worldtrace_cli.config import load_preset, preset_names

    return list(names) if names else [n for n in preset_names() if load_preset(n).weights != "random"]


def memory_key(preset) -> str:
    """A preset's fields that can change its memory plan (JSON): equal keys, equal plans."""
    d = preset.to_dict()
    return json.dumps({k: v for k, v in d.items() if k not in NOT_MEMORY}, sort_keys=True, default=str)


def modes(preset) -> tuple:
    """The (offload, weights dtype) modes planned for ``preset``: :data:`RUN_MODES`, and with a text encoder
    :data:`PLAN_ONLY_MODES`."""
    return RUN_MODES + (PLAN_ONLY_MODES if preset.backbone.text_encoder else ())


def writer_configs(preset) -> tuple[list, dict]:
    """([(label, MemoryConfig)], {writer: refusal line}): the preset's own cache (:data:`OWN`) and every
    registered writer at its default budget (``example_specs``: ``mixed:2``; as ``bench memory --cache W`` plans it: a growing cache past
    generate's default cap), and the writers its backbone refuses."""
    from worldtrace_cli.config import default_cache, memory_config
    from worldtrace_cli.errors import WorldtraceError
    from worldtrace_cli.jobs.inputs import check_writers
    from worldtrace_cli.memory import example_specs
    from worldtrace_cli.writer_options import settings_for

    out, refused = [], {}
    for label in (OWN, *example_specs()):  # one runnable spec per writer (mixed: mixed:2)
        options = default_cache(preset) if label == OWN else {"cache": label}
        options = settings_for(options["cache"], {**options, "max_cache_gb": 1e12})
        try:
            memory = memory_config(preset=preset, **options)
            check_writers([memory], preset)
        except WorldtraceError as exc:
            refused[label] = str(exc)
            continue
        out.append((label, memory))
    return out, refused


def plan_row(preset, label: str, memory, offload: str, weights_dtype: str, chunks: int = CHUNKS, flops: bool = False) -> dict:
    """One planned row: :func:`~worldtrace_cli.engine.memory_plan.plan_memory` of ``preset`` (bf16) as JSON, with
    the preset, resolution, writer label, budget and seconds; ``flops`` also counts FLOPs (:func:`_flops`)."""
    import torch

    from worldtrace_cli.engine.memory_plan import plan_memory

    start = time.perf_counter()
    counter = None
    if flops:
        from torch.utils.flop_counter import FlopCounterMode

        _register_cpu_sdpa()
        counter = FlopCounterMode(display=False, depth=None)
        with counter:
            plan = plan_memory(preset, memory, offload, weights_dtype, torch.bfloat16, chunks)
    else:
        plan = plan_memory(preset, memory, offload, weights_dtype, torch.bfloat16, chunks)
    row = {"preset": preset.name, "resolution": f"{preset.height}x{preset.width}", "writer": label,
           "cache": memory.cache, "budget": memory.budget, "mode": mode_key(offload, weights_dtype), **plan.to_dict(),
           "source": "planned", "seconds": round(time.perf_counter() - start, 1)}
    if counter is not None:
        row["flops"] = _flops(counter, preset)
    return row


def derive_row(base: dict, own_mode: dict, own_base: dict) -> dict:
    """The row of ``base``'s writer (planned in ``text/auto``) in ``own_mode``'s mode: load and text phases
    and the DiT's part from the own cache's row in that mode, each chunk phase ``base``'s plus the mode's change
    in the own cache's (``own_mode - own_base``); GB to 3 decimals as the planned rows (``source: derived``).

    Raises:
        ValueError: rows of different presets or resolutions, or a ``base`` not in ``text/auto``.
    """
    if base["mode"] != "text/auto" or own_base["mode"] != "text/auto":
        raise ValueError(f"derive_row: the bases must be text/auto rows, got {base['mode']}, {own_base['mode']}")
    if {(r["preset"], r["resolution"]) for r in (base, own_mode, own_base)} != {(base["preset"], base["resolution"])}:
        raise ValueError("derive_row: rows of different presets or resolutions")
    phases = {p: own_mode["phases_gb"][p] for p in ("load", "text")}
    phases.update({p: round(base["phases_gb"][p] + own_mode["phases_gb"][p] - own_base["phases_gb"][p], 3)
                   for p in CHUNK_PHASES})
    peak_phase = max(phases, key=phases.get)
    parts = {**base["parts_gb"], "dit": own_mode["parts_gb"]["dit"]}
    options = {**base["options"], **{k: own_mode["options"][k] for k in ("offload", "weights_dtype")}}
    return {**{k: base[k] for k in ("preset", "resolution", "writer", "cache", "budget", "slots", "cache_model")},
            "mode": own_mode["mode"], "options": options, "peak_gb": phases[peak_phase], "peak_phase": peak_phase,
            "phases_gb": phases, "parts_gb": parts, "source": "derived", "seconds": 0.0}


def same_plan(a: dict, b: dict, tolerance_gb: float = 0.002) -> bool:
    """True when two rows' phases agree within ``tolerance_gb`` (the rows' GB are rounded to 3 decimals)."""
    return all(abs(a["phases_gb"][p] - b["phases_gb"][p]) <= tolerance_gb for p in a["phases_gb"])


def plan_preset(preset, chunks: int = CHUNKS, all_planned: bool = False, resolutions=None) -> dict:
    """Every row of one preset (see the module docstring): ``rows``, ``refused`` writers (the backbone's
    refusal line), ``errors`` (writers whose plan raised), ``checks`` (derived rows planned too, with whether
    they agree), ``flops`` (own cache, own resolution), ``seconds``."""
    start = time.perf_counter()
    configs, refused = writer_configs(preset)
    own = dict(configs)[OWN]
    rows, checks, errors = [], [], {}
    res_list = [(preset.height, preset.width), *(resolutions if resolutions is not None
                                                  else EXTRA_RESOLUTIONS.get(preset.architecture, ()))]
    for h, w in res_list:
        at = preset if (h, w) == (preset.height, preset.width) else replace(preset, height=h, width=w)
        native = at is preset
        own_rows = {}
        for off, wd in modes(at):
            log.info(f"{preset.name} {h}x{w} {OWN} {off}/{wd} ...")
            own_rows[mode_key(off, wd)] = plan_row(at, OWN, own, off, wd, chunks, flops=native and (off, wd) == ("text", "auto"))
        rows += own_rows.values()
        if not native:
            continue
        checked = False
        for label, memory in configs:
            if label == OWN:
                continue
            log.info(f"{preset.name} {label} text/auto ...")
            try:
                base = plan_row(at, label, memory, "text", "auto", chunks)
            except Exception as exc:  # noqa: BLE001 - a writer the plan cannot run is recorded, the table goes on
                log.error(f"{preset.name} {label}: the plan failed: {type(exc).__name__}: {exc}")
                errors[label] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            rows.append(base)
            for off, wd in modes(at)[1:]:
                key = mode_key(off, wd)
                derived = derive_row(base, own_rows[key], own_rows["text/auto"])
                if all_planned or (not checked and key == "blocks/fp8"):
                    log.info(f"{preset.name} {label} {key} (check) ...")
                    planned = plan_row(at, label, memory, off, wd, chunks)
                    checks.append({"preset": preset.name, "writer": label, "mode": key, "planned_peak_gb": planned["peak_gb"],
                                   "derived_peak_gb": derived["peak_gb"], "agree": same_plan(planned, derived)})
                    checked = True
                    rows.append(planned)
                else:
                    rows.append(derived)
    flops = next(r.pop("flops") for r in rows if "flops" in r)
    return {"rows": rows, "refused": refused, "errors": errors, "checks": checks, "flops": flops,
            "seconds": round(time.perf_counter() - start, 1)}


def _register_cpu_sdpa() -> None:
    """Give the CPU flash kernel (what SDPA dispatches to on a CPU, fake tensors included) the SDPA FLOP
    formula ``torch.utils.flop_counter`` has for the CUDA kernels (4 B H Sq Sk D)."""
    import torch
    from torch.utils import flop_counter

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if op in flop_counter.flop_registry or op.default in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(op)
    def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def _flops(counter, preset) -> dict:
    """FLOPs of the DiT and of the streaming decoder in one plan (FlopCounterMode's per-module counts: the
    DiT's class, the VAE's ``WanDecoder3d``) per chunk: the DiT's count is one denoising call and the context
    pass, so a chunk is half of it times (steps + 1)."""
    counts = counter.get_flop_counts()
    dit_name = preset.backbone.load("dit").__name__
    dit = sum(counts.get(dit_name, {}).values())
    attention = sum(n for op, n in counts.get(dit_name, {}).items() if "scaled_dot_product" in str(op))
    decode = sum(counts.get("WanDecoder3d", {}).values())
    calls = len(preset.denoising_steps) + 1
    return {"dit_class": dit_name, "dit_flops_per_call": dit // 2, "dit_attention_flops_per_call": attention // 2,
            "dit_calls_per_chunk": calls, "dit_flops_per_chunk": dit // 2 * calls, "decode_flops_per_chunk": decode,
            "counted": "one denoising call and the context pass; attention included (SDPA formula)"}


def run(names=None, chunks: int = CHUNKS, all_planned: bool = False, saved=None) -> dict:
    """Plan ``names`` (default :func:`full_size_presets`): ``{"meta", "presets": {name: {...}}}``; ``saved``
    is called with the results so far after each preset (a long run keeps what it planned)."""
    import torch

    from worldtrace_cli.config import load_preset
    from worldtrace_cli.jobs.bench_memory import HEADROOM, RESERVE_GB

    start = time.perf_counter()
    presets, done = {}, {}
    for name in full_size_presets(names):
        preset = load_preset(name)
        key = memory_key(preset)
        info = {"architecture": preset.architecture, "title": preset.backbone.title, "description": preset.description,
                "resolution": f"{preset.height}x{preset.width}", "weights": preset.weights,
                "dit": asdict(preset.dit),
                "dit_parameters": _parameters(preset)}
        if key in done:
            presets[name] = {**info, "same_as": done[key]}
            continue
        done[key] = name
        log.info(f"planning {name} ...")
        presets[name] = {**info, "same_as": None, **plan_preset(preset, chunks, all_planned)}
        if saved is not None:
            saved({"meta": {"partial": True, "command": sys.argv}, "presets": presets})
    meta = {"date": date.today().isoformat(), "command": sys.argv, "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "chunks": chunks, "dtype": "bfloat16",
            "cards_gb": list(CARDS_GB), "headroom": HEADROOM, "reserve_gb": RESERVE_GB,
            "seconds": round(time.perf_counter() - start, 1), "all_planned": all_planned}
    return {"meta": meta, "presets": presets}


def _parameters(preset) -> int:
    """The DiT's parameter count, built on the meta device."""
    import torch

    with torch.device("meta"):
        dit = preset.backbone.load("dit")(preset.dit)
    return sum(p.numel() for p in dit.parameters())


# -- what fits where -----------------------------------------------------------------------------------------
def fits(peak_gb: float, card_gb: float, headroom: float, reserve_gb: float) -> bool:
    """``generate``'s rule (jobs/bench_memory.py): ``peak x headroom + reserve`` within the card."""
    return peak_gb * headroom + reserve_gb <= card_gb


def choice(rows: list[dict], card_gb: float, headroom: float, reserve_gb: float) -> dict | None:
    """The first row of :data:`RUN_MODES` order (bf16, fp8, blocks, blocks+fp8) that fits ``card_gb``, or None."""
    by_mode = {r["mode"]: r for r in rows}
    for off, wd in RUN_MODES:
        row = by_mode.get(mode_key(off, wd))
        if row is not None and fits(row["peak_gb"], card_gb, headroom, reserve_gb):
            return row
    return None


def _rows(entry: dict, writer: str, resolution: str | None = None) -> list[dict]:
    return [r for r in entry["rows"] if r["writer"] == writer and (resolution is None or r["resolution"] == resolution)]


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    off, wd = row["mode"].split("/")
    phase = f" ({row['peak_phase']})" if row["peak_phase"] in ("load", "text") else ""
    gb = f"{row['peak_gb']:.1f}" if row["peak_gb"] >= 1 else f"{row['peak_gb']:.2f}"
    return f"{LABELS[(off, wd)]} {gb}{phase}"


def _tflop(flops: int) -> str:
    tflop = flops / 1e12
    return f"{tflop:,.0f}" if tflop >= 100 else f"{tflop:.3g}"


def dump(results: dict) -> str:
    """``results`` as JSON, one line per row (the file stays readable and a few hundred kB)."""
    marks = {}
    shallow = {**results, "presets": {}}
    for name, entry in results["presets"].items():
        if "rows" in entry:
            marks[name] = f"__rows_{len(marks)}__"
            entry = {**entry, "rows": marks[name]}
        shallow["presets"][name] = entry
    text = json.dumps(shallow, indent=1)
    for name, mark in marks.items():
        rows = ",\n".join("   " + json.dumps(r, separators=(",", ":")) for r in results["presets"][name]["rows"])
        text = text.replace(f'"{mark}"', "[\n" + rows + "\n  ]")
    return text + "\n"


def render(results: dict) -> str:
    """The Markdown between the doc's markers: the cards table (own cache, every resolution), the writers
    table (smallest card per writer and preset), the FLOPs, and where the numbers come from."""
    meta, presets = results["meta"], results["presets"]
    hr, reserve, cards = meta["headroom"], meta["reserve_gb"], meta["cards_gb"]
    planned = {n: e for n, e in presets.items() if e.get("same_as") is None}
    twins = {n: [m for m, e in presets.items() if e.get("same_as") == n] for n in planned}
    name = {n: ", ".join([f"`{n}`", *[f"`{m}`" for m in twins[n]]]) for n in planned}
    out = [f"Generated by `python benchmarks/fit_table.py` from "
           f"[benchmarks/results/fit-table/plans.json](../benchmarks/results/fit-table/plans.json) ({meta['date']}, "
           f"torch {meta['torch']}, {meta['seconds'] / 60:.0f} min on this CPU): each preset's plan in bf16 at "
           f"{meta['chunks']} chunks, a checkpoint run (umT5-XXL), the CLIP tower counted (a checkpoint run without "
           f"its file holds 1.26 GB less). A cell is the first of bf16, fp8 (`--weights-dtype fp8`), blocks "
           f"(`--offload blocks`), blocks+fp8 whose plan x {hr} + {reserve:g} GB fits the card, with its planned "
           f"peak in GB; (text): the peak is the conditioning, not a chunk (for a checkpoint LingBot-World or "
           f"text-to-video run umT5-XXL, 11.4 GB, visiting the GPU to encode the prompt); - : none fits. `full` and "
           f"`yarn` grow with the run: planned at {meta['chunks']} chunks.", "",
           "**The model's own cache** (no `--cache`):", "",
           "| preset | resolution | " + " | ".join(f"{c} GB" for c in cards) + " |",
           "|---|---|" + "---|" * len(cards)]
    for n, e in planned.items():
        for res in dict.fromkeys(r["resolution"] for r in e["rows"]):
            rows = _rows(e, OWN, res)
            native = " (its own)" if res == e["resolution"] else ""
            out.append(f"| {name[n]} | {res}{native} | " + " | ".join(_cell(choice(rows, c, hr, reserve)) for c in cards) + " |")
    writers = list(dict.fromkeys(r["writer"] for e in planned.values() for r in e["rows"] if r["writer"] != OWN))
    out += ["", "**Every writer at its default budget** (the preset's own resolution): the smallest card that fits, "
            "and how (`n/a`: the backbone refuses the writer):", "",
            "| writer | " + " | ".join(f"`{n}`" for n in planned) + " |", "|---|" + "---|" * len(planned)]
    for w in [OWN, *writers]:
        cells = []
        for n, e in planned.items():
            if w in e.get("refused", {}):
                cells.append("n/a")
                continue
            if w in e.get("errors", {}):
                cells.append("plan failed")
                continue
            rows = _rows(e, w, e["resolution"])
            fit = next(((c, row) for c in cards if (row := choice(rows, c, hr, reserve)) is not None), None)
            cells.append("-" if fit is None else f"{fit[0]}: {LABELS[tuple(fit[1]['mode'].split('/'))]}")
        out.append(f"| {'own cache' if w == OWN else w} | " + " | ".join(cells) + " |")
    out += ["", "FLOPs per chunk by the plan (`torch.utils.flop_counter` under the fake mode; the DiT's denoising "
            "calls and context pass, and one chunk's decode), own cache at the preset's resolution:", "",
            "| preset | DiT calls per chunk | DiT TFLOP per call | of it attention | DiT TFLOP per chunk | "
            "decode TFLOP per chunk |", "|---|---|---|---|---|---|"]
    for n, e in planned.items():
        f = e["flops"]
        out.append(f"| {name[n]} | {f['dit_calls_per_chunk']} | {_tflop(f['dit_flops_per_call'])} | "
                   f"{_tflop(f['dit_attention_flops_per_call'])} | {_tflop(f['dit_flops_per_chunk'])} | "
                   f"{_tflop(f['decode_flops_per_chunk'])} |")
    checks = [c for e in planned.values() for c in e["checks"]]
    derived = sum(r["source"] == "derived" for e in planned.values() for r in e["rows"])
    total = sum(len(e["rows"]) for e in planned.values())
    agree = sum(c["agree"] for c in checks)
    out += ["", f"{total} rows, {total - derived} planned, {derived} derived from planned rows (the module docstring of "
            f"`benchmarks/fit_table.py`); {agree} of {len(checks)} derived rows planned as a check agree."]
    return "\n".join(out)


def rewrite_doc(path: Path, text: str) -> None:
    """Replace what lies between :data:`BEGIN` and :data:`END` in ``path`` with ``text``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    doc = path.read_text()
    a, b = doc.find(BEGIN), doc.find(END)
    if a < 0 or b < a:
        raise ValueError(f"{path}: needs {BEGIN} ... {END}")
    path.write_text(doc[:a + len(BEGIN)] + "\n" + text + "\n" + doc[b:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=None, help="comma-separated preset names (default: every full-size preset)")
    ap.add_argument("--chunks", type=int, default=CHUNKS)
    ap.add_argument("--all-planned", action="store_true", help="plan every row instead of deriving the writers' modes")
    ap.add_argument("--update", action="store_true", help="merge the presets planned into the results file")
    ap.add_argument("--render", action="store_true", help="only rewrite the docs table from the results file")
    ap.add_argument("-o", "--output", type=Path, default=RESULTS)
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the docs table")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.render:
        results = json.loads(args.output.read_text())
    else:
        names = args.presets.split(",") if args.presets else None
        partial = args.output.with_suffix(".partial.json")
        partial.parent.mkdir(parents=True, exist_ok=True)
        results = run(names, args.chunks, args.all_planned,
                      saved=lambda r: partial.write_text(dump(r)))
        partial.unlink(missing_ok=True)
        if args.update and args.output.is_file():
            old = json.loads(args.output.read_text())
            old["presets"].update(results["presets"])
            old["meta"]["updated"] = results["meta"]
            results = old
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(dump(results))
        log.info(f"wrote {args.output} ({results['meta']['seconds']:.0f} s)")
    if not args.no_docs:
        rewrite_doc(args.doc, render(results))
        log.info(f"rewrote the table in {args.doc}")
    failed = [c for e in results["presets"].values() for c in e.get("checks", []) if not c["agree"]]
    for c in failed:
        log.error(f"derived row disagrees with its plan: {c}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
