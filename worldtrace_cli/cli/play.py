"""``worldtrace play``: a local web server with live sessions (:mod:`worldtrace_cli.play.server`)."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import click

from .common import run_job
from .options import SEED, checkpoint_option, device_options, memory_options, preset_option
from .shared_options import MODEL_CACHE, option

log = logging.getLogger("worldtrace")



def offered_writers(preset, options: dict) -> list[str]:
    """The writer specs the page offers: every registered writer that opens with this command line's
    settings (each writer takes its own among them, :func:`~worldtrace_cli.writer_options.settings_for`),
    a writer that needs ``:K`` (``mixed``) as ``name:2``. Checked as ``generate`` checks ``--cache``
    (:func:`~worldtrace_cli.jobs.inputs.check_writers`), so a page never offers a writer the server
    refuses. A name with its spec argument is also what its lane reports (``mixed:2``)."""
    from ..config import memory_config
    from ..errors import InputError
    from ..jobs.inputs import check_writers
    from ..writer_options import WRITER_OPTIONS, settings_for

    offered = []
    for name, row in sorted(WRITER_OPTIONS.items()):
        spec = f"{name}:2" if row.arg == "field_slots" else name
        try:
            check_writers([memory_config(preset=preset, cache=spec, **settings_for(spec, options))], preset)
        except InputError as exc:
            log.debug(f"play: not offering {spec}: {exc}")
            continue
        offered.append(spec)
    return offered


def check_port(host: str, port: int) -> None:
    """Bind ``host:port`` once and let go, so a port in use or an address this machine lacks is
    refused before the model loads (the server binds it again when it starts; port 0 always passes).

    Raises:
        OutputError: the address cannot be bound (exit 4).
    """
    from ..errors import OutputError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OutputError(f"--host {host}: unknown address ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise OutputError(f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})") from None


@click.command("play")
@preset_option("loopworld", note="of a backbone that runs live (loopworld walks a world with ground truth; "
                                 "LingBot-World: the keys drive its camera; text-to-video: a prompt box)")
@option("--cache", default=None, metavar="WRITER", default_text=MODEL_CACHE,
        note=" the page starts with (it switches writers and opens a second one beside it)")
@checkpoint_option
@option("--image", type=click.Path(path_type=Path), default=None,
        note="; loopworld starts from its world's view unless this is given, then without ground truth")
@option("--world-seed", type=SEED, default=0, show_default=True)
@option("--seed", type=SEED, default=0, show_default=True, note="the noise")
@memory_options
@device_options
@option("--compile", "compile_mode", type=click.Choice(["none", "default", "reduce-overhead", "max-autotune"]),
        default="none", show_default=True, note=" (on a GPU reduce-overhead is the fast path)")
@option("--metrics", type=click.Choice(["none", "fast", "all"]), default="fast", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but the loopback exposes the model to your network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="TCP port (0: any free port; the URL on stdout names it).")
@click.option("--max-sessions", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Pages served at once (each holds its own sessions and caches); more are refused.")
@click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("play-runs"), show_default=True,
              help="Where every session is recorded as a run folder (video.mp4, chunks.jsonl, summary.json, "
                   "trajectory.yaml that worldtrace generate replays).")
@click.option("--no-record", is_flag=True, help="Do not record sessions (nothing is written; save is off).")
@option("--prompt", default=None, note=" of every session (LingBot-World: its prompt, the keys drive the camera)")
@option("--attention-stats/--no-attention-stats", default=True, show_default=True,
        note=": the cache panel's shares, recorded in chunks.jsonl; --no-attention-stats leaves it out")
@option("--attention-queries", type=click.IntRange(1), default=None, metavar="N")
@click.option("--start-running", is_flag=True,
              help="The world runs as soon as a page opens (idle chunks until a key is held). By default it "
                   "waits for the first key or drag, so a recording starts with what you did.")
def play(preset, cache, checkpoint, random_weights, image, world_seed, seed, device, dtype, compile_mode, metrics,
         host, port, max_sessions, runs_dir, no_record, prompt, attention_stats, attention_queries, start_running,
         **memory):
    """Walk a world live in your browser, with its KV-cache memory on screen.

    Serves one page at http://HOST:PORT/ (printed on stdout): WASD to walk, arrow keys or mouse drag
    to look, one chunk per step (text-to-video presets such as self-forcing-tiny: a prompt box, each
    new prompt a switch); the true view and GT-PSNR beside the generated one on loopworld;
    the cache's slots (recent / summary, source frames, virtual positions, landmarks, retrievals)
    drawn chunk by chunk, with each slot's share of the chunk's attention (hover a slot: the frame it
    holds, and the true frame at its pose). Switch the writer, or open a second one beside it driven by the same keys
    (walk away from a place and back: which one remembers?). Every session is recorded under
    --runs-dir. Ctrl-C stops the server and completes every recording.

    \b
    Example (CPU, the embedded world):
      worldtrace play --cache landmark
      # then open http://127.0.0.1:8000/
    """

    from .options import attention_config

    attention = attention_config(attention_stats, attention_queries)

    def serve():
        import time

        from ..config import load_preset, memory_config
        from ..errors import InputError, OutputError
        from ..jobs.inputs import check_image, check_writers
        from ..writer_options import settings_for

        resolved = load_preset(preset)
        backbone = resolved.backbone
        if not backbone.live:
            raise InputError(f"--preset {resolved.name}: {backbone.title} does not run live yet; it runs with "
                             f"worldtrace generate")
        if image is not None and not backbone.start_image:
            raise InputError(f"--image: preset {resolved.name} is text-to-video: type prompts in the page instead")
        if prompt is not None and not (backbone.run_prompt and not backbone.takes_prompts):
            raise InputError(f"--prompt: preset {resolved.name} takes no run prompt"
                             + (" (type prompts in the page)" if backbone.takes_prompts else ""))
        if image is not None:
            check_image(image, resolved.height, resolved.width)
        elif backbone.start_image and not resolved.has_world:
            raise InputError(f"--preset {resolved.name}: needs --image (only loopworld has a world of its own)")
        options = {k: v for k, v in memory.items() if v is not None}
        from ..config import default_cache

        first = cache or default_cache(resolved)["cache"]
        # each writer the page opens takes its own settings among these (writer_options.settings_for)
        check_writers([memory_config(preset=resolved, cache=first, **settings_for(first, options))], resolved)
        if not no_record:
            from ..runs import RunFolder

            RunFolder(runs_dir).make()  # OutputError naming the folder, before the model loads
            probe = runs_dir / f".worldtrace-write-test-{os.getpid()}"
            try:
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                raise OutputError(f"--runs-dir {runs_dir}: not writable ({exc.strerror or exc})") from None
        check_port(host, port)  # a non-loopback --host is announced once bound, with the port bound
        # the preset itself: without it every page opened open()'s default, loopworld, whatever --preset said
        kwargs = {"preset": resolved, "checkpoint": checkpoint, "random_weights": random_weights, "image": image,
                  "world_seed": world_seed, "seed": seed, "device": device, "dtype": dtype, "compile": compile_mode,
                  "metrics": metrics, **({"prompt": prompt} if prompt is not None else {}), **attention, **options}
        from ..config import RunConfig
        from ..engine.pipeline import Pipeline

        start = time.perf_counter()
        log.info(f"loading {resolved.name} ...")
        cfg = RunConfig(preset=resolved, trajectory=Path("<play>"), output=Path("<play>"), device=device, dtype=dtype,
                        checkpoint=None if checkpoint is None else checkpoint.resolve(), random_weights=random_weights,
                        compile=compile_mode)
        pipeline = Pipeline.from_config(cfg)
        log.info(f"loaded {resolved.name} on {pipeline.device} in {time.perf_counter() - start:.1f} s")
        kwargs["checkpoint"] = cfg.checkpoint
        from ..play.server import PlaySettings, serve_forever

        writers = offered_writers(resolved, options)
        if first not in writers:
            writers.insert(0, first)  # --cache mixed:3: the page offers the spec it runs
        settings = PlaySettings(kwargs, first, writers, runs_dir.resolve(), max_sessions, not no_record, pipeline,
                                start_running=start_running)
        serve_forever(settings, host, port)

    run_job(serve)
