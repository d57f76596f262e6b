"""One help text per option name: every command that takes ``--seed`` (``--output``,
``--chunks``, ...) says the same of it. :data:`HELP` holds the one text, a template; :func:`option` is
``click.option`` with that text, the command's own default (``{default}``) and note (``{note}``)
filled in. tests/test_cli_help.py walks every command and fails when one option name carries two
templates, or a plain ``help=`` that is not its template."""

from __future__ import annotations

import click

# "{default}" -> " (default: TEXT)" when the command names one; "{note}" -> the command's own clause,
# as it wrote it (its leading punctuation included); other fields come from the registries (_registry_field).
HELP = {
    "--attention-queries": "With --attention-stats: measure a seeded sample of N query tokens per layer instead of "
                           "all of them (faster on full-size models; the record says so).",
    "--attention-stats": "Measure each chunk's attention per cache slot (the share of the softmax mass of its last "
                         "denoising step on each slot and on the chunk itself, per layer){note}. Exact, without the "
                         "attention matrix; frames unchanged (docs/attention.md; its cost: docs/performance.md).",
    "--backend": "The DiT's implementation: native = worldtrace's own; diffusers = diffusers' WanTransformer3DModel "
                 "in the same chunk loop (records, metrics, resume, attention stats; frames within float rounding "
                 "of native's){note} (docs/diffusers.md).",
    "--batch": "Clips per optimiser step.",
    "--budget": "Past latent-frame slots the cache holds = summary + recent (default: the writer's; sliding: MG2's "
                "own 3, gta_drive 1; WorldTrace writers and memrope: the model's window, 6, gta_drive 4){note}.",
    "--cache": "KV-cache writer{note}{default}: {writers_about}",
    "--caches": "Comma-separated cache writers{note}, each as --cache of generate: {writers}",
    "--checkpoint": "The weights folder of a checkpoint preset ({folders}); presets with random or bundled weights "
                    "take none. Its files are checked before anything loads.",
    "--chunks": "The length in chunks (MG2: 3 latent frames = 12 pixel frames each){note}{default}.",
    "--compile": "torch.compile the DiT blocks{note}: the first chunk (or training step) of a process pays tens of "
                 "seconds or more of compilation; reduce-overhead and max-autotune, where offered, add CUDA graphs "
                 "on a GPU.",
    "--data": "The data folder{note}{default}.",
    "--device": "Where the model runs{note}: auto = cuda when available, else cpu.",
    "--device-gb": "Plan GPU memory for a card of N GB{default}{note}.",
    "--dit": "The trained DiT (a dit.safetensors of `train dit`){note}{default}.",
    "--dtype": "Compute dtype (auto = bf16 on cuda, fp32 on cpu){default}.",
    "--ema": "The weights' exponential moving average, DIR/dit-ema.safetensors beside dit.safetensors{note}.",
    "--eval-size": "The frame size the videos are scored at: mind = MIND's 1280x720 (its evaluator's resize){note}.",
    "--image": "Conditioning image (any format PIL reads){note}{default}.",
    "--init": "Start from these weights instead of random ones{note}.",
    "--json": "Print {note} as JSON on stdout.",
    "--metrics": "Per-chunk metrics: fast = TempSSIM, LatentDiff (during a run) and GT-PSNR/SSIM (loopworld); all = "
                 "+ CLIP Scene Drift and PAC (one CLIP forward per pixel frame){note}.",
    "--name": "File stem of the results{default}.",
    "--offload": "GPU memory: text = the text encoder (LingBot, Self-Forcing: umT5) on the GPU only to encode a prompt; "
                 "blocks = also the DiT's blocks in host memory, each brought to the GPU for its forward (diffusers' "
                 "group offloading: slower, a fraction of the weights' memory){note} (docs/gpu-memory.md).",
    "--output": "Where the results are written{note}{default}.",
    "--overwrite": "Replace what an earlier run left in the output folder{note}.",
    "--prefix": "Continue a real video: its chunks (an MP4 or a folder of frames, resized to the preset; truth:K = "
                "loopworld's true render of the first K chunks) are encoded by the VAE and committed to the cache "
                "through the writer instead of generated; generation goes on after them; --chunks counts them "
                "too{note} (docs/continue.md).",
    "--preset": "Model preset: a built-in name ({presets}; `worldtrace presets` describes them with their backbone and "
                "weights) or a preset YAML file{note}.",
    "--print": "Print {note} on stdout instead of its path.",
    "--progress": "Default: one overall progress bar (runs or jobs done) on stderr when it is a terminal{note}; "
                  "--progress adds every run's per-chunk bar; --no-progress shows none.",
    "--prompt": "{prompted} presets: the text prompt{note}.",
    "--random-weights": "Run a checkpoint preset at full size with seeded random weights (no folder){note}.",
    "--rope-precision": "dtype of the RoPE tables and rotation; float64 is MG2's own arithmetic (both replay the "
                        "official fixtures within 4e-6).",
    "--save-every": "Save a resume state every N {note}.",
    "--seed": "Seed of {note}{default}.",
    "--threads": "CPU threads for torch{default}. On a shared or busy machine fewer threads can be much faster: a "
                 "2-core machine running two processes ran 5x slower with torch's default (one per core) than with "
                 "--threads 1.",
    "--vae": "The trained VAE (vae.safetensors of `train vae`){note}.",
    "--warmup": "Warm-up length: {note}.",
    "--weights-dtype": "DiT weight storage: auto = --dtype; fp8 = float8 (e4m3) storage computed in --dtype through "
                       "diffusers' layerwise casting: half bf16's weight memory (loopworld: GT-PSNR within 0.05 dB)"
                       "{note} (docs/gpu-memory.md).",
    "--world-seed": "loopworld: which procedural world (its renders are the ground truth){note}.",
}
# --cache's default where a command takes the model's own writer
MODEL_CACHE = ("the model's own: MG2 sliding; LingBot-World a sink of 6 in a window of 18 latent frames; Self-Forcing "
               "full, its global cache; LongLive a sink of 3 in a window of 12")


class SharedOption(click.Option):
    """A click option whose help is its name's one text in :data:`HELP`, filled in; ``template`` keeps the
    text before filling (what tests/test_cli_help.py compares across commands)."""

    def __init__(self, *args, template: str, **attrs):
        super().__init__(*args, **attrs)
        self.template = template


def long_name(opts) -> str:
    """An option's name as errors and the help test say it: its longest spelling (``-o``/``--output`` ->
    ``--output``; the first of equally long ones)."""
    return max(opts, key=len)


def _registry_field(field: str) -> str:
    """A template field filled from a registry (the same in every command: a writer or preset added there
    appears in every command's help)."""
    from ..config import preset_names
    from ..config.backbones import BACKBONES, titles_where
    from ..writer_options import WRITER_OPTIONS, writer_specs

    if field == "writers_about":  # every runnable writer spec with its row's one line
        return "; ".join(f"{spec}: {WRITER_OPTIONS[spec.split(':')[0]].about}" for spec in writer_specs()) + \
            " (docs/memory.md)."
    if field == "writers":
        return f"{', '.join(writer_specs())} (docs/memory.md)."
    if field == "presets":
        return ", ".join(preset_names())
    if field == "folders":
        return "; ".join(f"{row.title}: {row.checkpoint_folder}" for row in BACKBONES.values())
    if field == "prompted":
        return titles_where(lambda r: r.run_prompt or r.takes_prompts)
    raise KeyError(field)


def help_text(name: str, default_text: str | None = None, note: str = "") -> str:
    """``name``'s one help text (:data:`HELP`) with this command's default and note filled in."""
    import string

    template = HELP[name]
    fields = {"default": f" (default: {default_text})" if default_text else "", "note": note}
    for _, field, _, _ in string.Formatter().parse(template):
        if field and field not in fields:
            fields[field] = _registry_field(field)
    return template.format(**fields)


def option(*decls: str, default_text: str | None = None, note: str = "", **attrs):
    """``click.option(*decls, **attrs)`` with the one help text of its name (the longest of ``decls``'
    option spellings) from :data:`HELP`: ``default_text`` fills ``{default}`` (what the default is,
    where click cannot show it), ``note`` fills ``{note}`` (this command's own clause)."""
    opts = [part for decl in decls if decl.startswith("-") for part in decl.split("/")[:1]]
    name = long_name(opts)
    return click.option(*decls, cls=SharedOption, template=HELP[name],
                        help=help_text(name, default_text, note), **attrs)
