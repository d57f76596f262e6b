"""``worldtrace train vae|dit``: train the loopworld model's codec and DiT (resumable, budgeted)."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from .common import run_job
from .options import SEED, NonEmptyPath, preset_option
from .shared_options import option


def _settings(steps, minutes, lr, warmup, seed, threads, save_every, log_every, ema=0.0):
    from ..train.common import LoopSettings

    return LoopSettings(steps=steps, minutes=minutes, lr=lr, warmup=warmup, seed=seed, threads=threads,
                        save_every=save_every, log_every=log_every, ema=ema)


class _StopFlag:
    """Ctrl-C / SIGTERM ask the loop to stop after the current step (the state is saved first)."""

    def __init__(self):
        self.stopped = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, *_):
        if self.stopped:
            raise KeyboardInterrupt
        self.stopped = True

    def __call__(self):
        return self.stopped


def loop_options(default_steps: int, default_lr: float):
    """Options every trainer takes: budget, schedule, seed, threads, output folder."""
    def wrap(command):
        for add in reversed([
            option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="DIR",
                   note=": the training folder (created; rerun the same command to continue a stopped run)"),
            click.option("--steps", type=click.IntRange(1), default=default_steps, show_default=True,
                         help="Optimiser steps in all."),
            click.option("--minutes", type=click.FloatRange(0), default=0.0, show_default=True,
                         help="Stop this invocation after this many minutes (0: no limit); rerun to continue."),
            click.option("--lr", type=click.FloatRange(0, min_open=True), default=default_lr, show_default=True,
                         help="Peak learning rate (AdamW; warm-up then cosine to lr/10)."),
            option("--warmup", type=click.IntRange(0), default=100, show_default=True,
                   note="optimiser steps of linear learning-rate warm-up before the cosine"),
            option("--seed", type=SEED, default=0, show_default=True, note="the data and the noise"),
            option("--threads", type=click.IntRange(1), default=1, show_default=True),
            option("--save-every", type=click.IntRange(1), default=250, show_default=True,
                   note="optimiser steps (the training state)"),
            click.option("--log-every", type=click.IntRange(1), default=25, show_default=True,
                         help="Steps between lines of DIR/loss.jsonl (mean loss of the window, learning rate, "
                              "seconds since this invocation started; 1 times every step)."),
            click.option("--no-progress/--progress", "no_progress", default=False,
                         help="No progress bar (default: --progress, on stderr)."),
        ]):
            command = add(command)
        return command
    return wrap


@click.group("train")
def train():
    """Train the embedded world model (preset loopworld) on the procedural world.

    \b
    1. worldtrace train vae -o train/vae                 the codec (diffusers AutoencoderKLWan)
    2. worldtrace train encode --vae train/vae/vae.safetensors -o train/data
                                                         rendered clips encoded to latents
    3. worldtrace train dit --data train/data -o train/dit
                                                         the DiT (beside step 2: it picks up new shards)
    4. worldtrace train eval train/dit --vae train/vae/vae.safetensors
                                                         memory, drift and action tests
    5. worldtrace train export --dit train/dit/dit.safetensors --vae train/vae/vae.safetensors \\
           -o loopworld.safetensors                      the preset's weights file
    The recipe of the shipped weights, with times: docs/loopworld.md.
    """


@train.command("vae")
@loop_options(default_steps=2000, default_lr=1e-3)
@option("--batch", type=click.IntRange(1), default=4, show_default=True)
@click.option("--clip-frames", type=click.IntRange(5), default=9, show_default=True,
              help="Pixel frames per clip (1 + 4k): 9 for the first stage, 33 for the long-video stage.")
@option("--init", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
        note=" (an earlier stage's vae.safetensors)")
@click.option("--decoder-only", is_flag=True,
              help="Train only the decoder of --init: its latents stay bit-identical, so encoded clips and a "
                   "DiT trained on them stay valid (sharper pictures from the same latents).")
def train_vae_cmd(output, steps, minutes, lr, warmup, seed, threads, save_every, log_every, no_progress, batch, clip_frames,
                  init, decoder_only):
    """Train the loopworld VAE on rendered clips; writes DIR/vae.safetensors (normalisation folded in)."""
    from ..train.vae import train_vae

    stop = _StopFlag()

    def job():
        if clip_frames % 4 != 1:
            from ..errors import InputError

            raise InputError(f"--clip-frames: must be 1 + 4k (5, 9, 13, ...), got {clip_frames}")
        r = train_vae(output, _settings(steps, minutes, lr, warmup, seed, threads, save_every, log_every), batch=batch,
                      progress=not no_progress, stop=stop, clip_frames=clip_frames, init=init,
                      decoder_only=decoder_only)
        click.echo(f"worldtrace: VAE step {r['step']} ({r['minutes']:.1f} min this run), held-out "
                   f"reconstruction {r['psnr_db']:.2f} dB PSNR -> {r['file']}", err=True)

    run_job(job)


@train.command("encode")
@option("--vae", "vae_weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="DIR",
        note=": the data folder (shards clips-NNNNN.safetensors; rerun to continue or to add shards)")
@click.option("--shards", type=click.IntRange(1), default=100, show_default=True, help="Shards of 32 clips wanted.")
@option("--seed", type=SEED, default=0, show_default=True,
        note="the rendered worlds, trajectories and clip layout (shards of another seed are other clips)")
@click.option("--late", type=click.FloatRange(0, 1), default=0.7, show_default=True,
              help="Share of clips taken far into a rollout (constant conditioning) rather than at its start.")
@click.option("--loop", type=click.FloatRange(0, 1), default=0.85, show_default=True,
              help="Share of look-away-and-back clips (the rest are random walks).")
@click.option("--max-angle", type=click.FloatRange(30, 180), default=90.0, show_default=True,
              help="Largest turn of a loop clip in degrees.")
@click.option("--vary-return", is_flag=True,
              help="Loops come back at a random latent frame from chunk 1's last on (to a pose of an earlier "
                   "chunk) and walk on, instead of always at the clip's last latent frame: the return can "
                   "then only be placed by reading the actions.")
@click.option("--world", type=click.Choice(["procedural", "towers"]), default="procedural", show_default=True,
              help="The worlds' style: procedural = the textured city (loopworld's); towers = 2x2-cell towers in "
                   "solid colours with a heading-tinted sky and a sun, drawn for a small model (docs/loopworld.md; "
                   "docs/loopworld.md).")
@option("--threads", type=click.IntRange(1), default=1, show_default=True)
@option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="cpu", show_default=True,
        note=" (the VAE; frames are rendered on the CPU)")
@click.option("--workers", type=click.IntRange(0, 128), default=0, show_default=True,
              help="Processes that render shards while this one encodes them, a shard's clips batched per VAE "
                   "call off the CPU (the same clips): for a GPU, e.g. --device cuda --workers 12 beside `train "
                   "dit` on the same card (one CUDA context, not one per encoder); each worker keeps up to 2 "
                   "shards (~90 MB each) queued. 0: render and encode here, clip by clip. On CPUs only, separate "
                   "processes with other --seed values are faster.")
@click.option("--no-progress/--progress", "no_progress", default=False, help="No progress bar (default: --progress, on stderr).")
def train_encode_cmd(vae_weights, output, shards, seed, late, loop, max_angle, vary_return, world, threads, device,
                     workers, no_progress):
    """Render and encode training clips for `train dit` (can run while it trains)."""
    from ..engine.base import resolve_device
    from ..train.dataset import ClipMix, encode_clips

    stop = _StopFlag()

    def job():
        r = encode_clips(output, vae_weights, shards, seed, ClipMix(late, loop, max_angle, vary_return, world),
                         threads=threads, progress=not no_progress, stop=stop, device=str(resolve_device(device)),
                         workers=workers)
        click.echo(f"worldtrace: {r['clips']} clips in {output}", err=True)

    run_job(job)


@train.command("dit")
@option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
        note=" of `train encode` (re-scanned for new shards while training)")
@preset_option("loopworld", note="its DiT configuration is trained")
@loop_options(default_steps=4000, default_lr=1e-3)
@option("--batch", type=click.IntRange(1), default=4, show_default=True)
@click.option("--return-weight", type=click.FloatRange(1), default=3.0, show_default=True,
              help="Loss weight of the latent frame where a loop returns to its first pose.")
@click.option("--start-share", type=click.FloatRange(0, 1), default=None,
              help="Probability that a clip from a rollout's start trains its chunk 0 (the start image's "
                   "chunk) rather than chunk 1 or 2. Default 1/6 (the first 3,965 steps of the shipped DiT; its last 1,900 used 0.5).")
@option("--init", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
        note=" (an earlier run's dit.safetensors)")
@click.option("--self-context", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Probability that a clip's context chunks are the model's own samples (the product's sampler) "
                   "instead of the clean latents, so it learns to continue from its own output (exposure bias); "
                   "about 2x the time per clip.")
@click.option("--context-noise", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
              help="Largest noise level (sigma) of the context chunks: each clip's context passes read its context "
                   "latents noised to sigma ~ U(0, this) at timestep 1000 sigma, so the model learns to read imperfect "
                   "context (noise augmentation against drift, as GameNGen); sample with the preset's context_noise.")
@option("--ema", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True,
        note=": also kept, with this decay (e.g. 0.999; 0: none)")
@option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="cpu", show_default=True,
        note=" (the DiT trains; a run may be continued on another device)")
@click.option("--batched", is_flag=True,
              help="Run a step's --batch clips together, one DiT call per chunk for the clips that share a target "
                   "chunk, instead of one clip at a time (same loss, another random stream): 15-20 % faster per "
                   "clip on a CPU; on a GPU use it with a large --batch (e.g. 512: a step is dispatch-bound there).")
@option("--compile", "compile_mode", type=click.Choice(["none", "default"]), default="none", show_default=True,
        note=" (their pure parts for training, symbolic batch sizes: the same losses with less than half the ATen "
             "calls per step, for GPUs, where each is a kernel launch; loopworld's first step compiles for 6.5 "
             "minutes on 2 CPU cores)")
@click.option("--precision", type=click.Choice(["float32", "tf32", "bf16"]), default="float32", show_default=True,
              help="Arithmetic of the training steps: float32 (IEEE, the same losses on CPU and GPU); tf32 (CUDA "
                   "only: float32 matrix products on TF32 tensor cores); bf16 (mixed precision: forward passes under "
                   "bfloat16 autocast, float32 weights, gradients and optimiser state). A run may be continued in "
                   "another precision.")
def train_dit_cmd(data, preset, output, steps, minutes, lr, warmup, seed, threads, save_every, log_every, no_progress, batch,
                  return_weight, start_share, init, self_context, context_noise, ema, device, batched, compile_mode,
                  precision):
    """Train the DiT on encoded clips through MG2's sliding cache; writes DIR/dit.safetensors
    (and DIR/dit-ema.safetensors with --ema)."""
    from ..config import load_preset
    from ..engine.base import resolve_device
    from ..train.dit import train_dit
    from ..train.objective import START_SHARE

    stop = _StopFlag()

    def job():
        r = train_dit(output, data, load_preset(preset), _settings(steps, minutes, lr, warmup, seed, threads, save_every, log_every, ema),
                      batch=batch, return_weight=return_weight, progress=not no_progress, stop=stop,
                      start_share=START_SHARE if start_share is None else start_share, init=init,
                      self_context=self_context, device=str(resolve_device(device)), batched=batched,
                      compile_mode=compile_mode, precision=precision, context_noise=context_noise)
        loss = "no step this run" if r["loss"] is None else f"loss {r['loss']:.4f}"
        rate = f", {r['clips_per_second']:.1f} clips/s" if r["clips_per_second"] else ""
        click.echo(f"worldtrace: DiT step {r['step']} ({r['minutes']:.1f} min this run{rate}, {r['pool_clips']} clips in "
                   f"the pool), {loss} -> {r['file']}", err=True)

    run_job(job)


@train.command("eval")
@click.argument("dit_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@option("--vae", "vae_weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
        note=" that encodes the held-out clips")
@preset_option(note="its DiT configuration; default: the one DIT_DIR/settings.json names (needed for a folder "
                    "holding only dit.safetensors, e.g. weights trained elsewhere)")
@option("--data", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
        note=" where the held-out clips are cached (its late conditioning is computed from --vae when it has none)",
        default_text="the run's data folder, else DIT_DIR")
@click.option("--clips", type=click.IntRange(2), default=64, show_default=True, help="Held-out loop clips.")
@click.option("--rollouts", type=click.IntRange(0), default=8, show_default=True,
              help="Held-out random walks for the drift test (0: skip it).")
@click.option("--rollout-chunks", type=click.IntRange(2), default=8, show_default=True,
              help="Chunks per drift-test walk.")
@option("--ema", "use_ema", is_flag=True, note=": tested instead of the weights")
@click.option("--pictures", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="PNG",
              help="Also write the first 2 drift-test walks as a picture: truth, teacher-forced, free rollout.")
@option("--threads", type=click.IntRange(1), default=1, show_default=True)
@option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="JSON",
        note=": the JSON file, its path printed on stdout", default_text="DIT_DIR/eval.json")
@option("--print", "show", is_flag=True, note="the JSON (eval.json)")
def train_eval_cmd(dit_dir, vae_weights, preset, data, clips, rollouts, rollout_chunks, use_ema, pictures, threads,
                   output, show):
    """Memory and drift tests of a DiT folder (writes eval.json and prints its path; held-out clips are
    cached in the data folder and encoded again when --vae is another file than the one that encoded them).

    Memory: return-frame latent MSE with the first visit in the cache, removed, or replaced by another
    world's frame. Drift: per-chunk latent MSE of free rollouts (the model reads its own chunks) vs
    teacher-forced ones (it reads the true chunks) on held-out walks from a rollout's start.
    Actions: flow-matching loss on those walks with their own actions vs another walk's (gap > 0:
    the model follows the keyboard and mouse)."""
    import json

    def job():
        import torch

        from ..config import Preset, load_preset
        from ..errors import InputError
        from ..model.checkpoint import load_dit_weights
        from ..model.sampler import FlowMatchSchedule
        from ..train.dit import DIT_EMA_FILE, DIT_FILE, build_dit
        from ..train.evaluate import (action_effect, drift_pictures, heldout_clips, heldout_rollout_clips,
                                      late_conditioning_of, memory_effect, rollout_drift)

        torch.set_num_threads(threads)
        info = dit_dir / "settings.json"
        settings = json.loads(info.read_text()) if info.exists() else {}
        if preset is None and "preset" not in settings:
            raise InputError(f"{dit_dir}: no settings.json (not a `train dit` folder): pass --preset (e.g. loopworld)")
        dit_preset = load_preset(preset) if preset is not None else Preset.from_dict(settings["preset"])
        dit = build_dit(dit_preset, 0)
        load_dit_weights(dit, dit_dir / (DIT_EMA_FILE if use_ema else DIT_FILE))  # strict, clear error for a bad file
        folder = data if data is not None else Path(settings["data"]) if "data" in settings else dit_dir
        held = heldout_clips(folder, vae_weights, clips)
        late_cond = late_conditioning_of(folder, vae_weights)
        schedule = FlowMatchSchedule(tuple(dit_preset.denoising_steps), dit_preset.timestep_shift, dit_preset.sampler)
        out = memory_effect(dit, held, late_cond, schedule)
        if rollouts:
            walks = heldout_rollout_clips(folder, vae_weights, rollouts, rollout_chunks)
            out["drift"] = rollout_drift(dit, walks, late_cond, schedule, keep=2 if pictures else 0)
            if len(walks) >= 2:
                out["actions"] = action_effect(dit, walks, late_cond)
            if pictures:
                from ..model.vae import build_wan_vae
                from ..outputs import atomic_path

                with atomic_path(pictures) as tmp:
                    drift_pictures(build_wan_vae("loopworld", vae_weights), out["drift"].pop("latents")).save(tmp, "PNG")
                out["pictures"] = str(pictures)
        from ..outputs import write_json_atomic

        target = output if output is not None else dit_dir / "eval.json"
        write_json_atomic(target, out)
        click.echo(f"worldtrace: wrote {target}", err=True)
        click.echo(json.dumps(out, indent=2) if show else str(target))  # stdout: one line unless --print

    run_job(job)


@train.command("grow")
@preset_option(param="target", required=True,
               note="the grown DiT's: the source's DiT with more blocks (num_layers; action_config.blocks may list "
                    "the new ones)")
@click.option("--from", "source", default="loopworld", show_default=True, metavar="NAME|FILE",
              help="Preset of the DiT that is grown.")
@option("--dit", "dit_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
        note=" to grow", default_text="the --from preset's bundled weights")
@option("-o", "--output", type=NonEmptyPath(dir_okay=False, path_type=Path), required=True,
        note=": the grown DiT weights (float32 safetensors) for `train dit --preset PRESET --init FILE`")
@option("--seed", type=SEED, default=0, show_default=True,
        note="the weights of action modules that no old block provides")
def train_grow_cmd(target, source, dit_file, output, seed):
    """Grow a trained DiT deeper without changing its outputs: old blocks keep their order, each new
    block copies the old block before it with its residual-output projections zeroed (identity at
    first). Start `train dit --init` from the result instead of random weights."""
    from ..config import load_preset
    from ..train.grow import grow_dit

    def job():
        r = grow_dit(load_preset(source), load_preset(target), output, dit_file, seed)
        new = sum(1 for _, is_new in r["blocks"] if is_new)
        click.echo(f"worldtrace: wrote {r['file']} ({len(r['blocks'])} blocks, {new} new; "
                   f"{r['parameters'] / 1e6:.2f} M parameters)", err=True)

    run_job(job)


@train.command("export")
@option("--dit", "dit_weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@option("--vae", "vae_weights", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True)
@option("-o", "--output", type=NonEmptyPath(dir_okay=False, path_type=Path), required=True,
        note=": the bundle file (the loopworld preset reads worldtrace_cli/presets/loopworld.safetensors)")
@click.option("--dit-format", type=click.Choice(["float16", "int8"]), default="float16", show_default=True,
              help="How the DiT is stored. int8: its matrices as int8 with one float32 scale per output row "
                   "(about half float16's bytes; read back as floats: on a 3x loopworld DiT the GT-PSNR of 4 "
                   "rollouts moved by 0.11 dB at most, their return legs by 0.05), for a DiT too large to ship "
                   "in float16. Judge the int8 bundle itself before shipping it.")
def train_export_cmd(dit_weights, vae_weights, output, dit_format):
    """Bundle a trained DiT and VAE (and the tiny CLIP tower) into one preset weights file."""
    from ..train.dit import export_bundle

    def job():
        r = export_bundle(dit_weights, vae_weights, output, dit_format=dit_format)
        click.echo(f"worldtrace: wrote {r['file']} ({r['bytes'] / 2**20:.1f} MiB, DiT in {r['dit_format']}; "
                   f"parameters {r['parameters']})", err=True)

    run_job(job)
