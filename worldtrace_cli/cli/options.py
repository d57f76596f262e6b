"""Click options shared by several commands (one definition, one set of defaults)."""

from __future__ import annotations

from pathlib import Path

import click

from ..writer_options import POSITION_SCHEMES
from .shared_options import option


class _SeedRange(click.IntRange):
    """Seeds: 0 <= x < 2**63 (torch generators take 64-bit seeds), shown as such in help and errors
    instead of the 19-digit bound."""

    def _describe_range(self) -> str:
        return "0<=x<2**63"


class NonEmptyPath(click.Path):
    """``click.Path`` that refuses an empty string: ``-o ""`` would otherwise be the current folder
    (``Path("")`` is ``.``), and a run's files would land among the user's own. A usage error (exit 2)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path; name a folder (e.g. -o out/)", param, ctx)
        return super().convert(value, param, ctx)


def overall_progress(value) -> tuple[bool, bool]:
    """``--progress/--no-progress`` of compare and loopbench run (None when not given) as (one overall
    bar over the runs or jobs, per-chunk bars of every run): not given, the overall bar alone (on stderr,
    a terminal or not, as ``generate``'s bar: a log file shows how far a long run is); ``--progress``
    both; ``--no-progress`` neither."""
    if value is None:
        return True, False
    return value, value


def preset_option(default: str | None = None, note: str = "", param: str | None = None, **attrs):
    """``--preset NAME|FILE``, one help text for every command (``note``: what this command does with it,
    or its default when ``default`` is None; ``param``: the parameter's name when not ``preset``)."""
    if not attrs.get("required"):
        attrs.update(default=default, show_default=default is not None)
    return option("--preset", *([param] if param else []), metavar="NAME|FILE", note=f"; {note}" if note else "",
                  **attrs)


def checkpoint_option(command):
    """``--checkpoint DIR`` and ``--random-weights``, one help text for every command, from the backbone
    registry (each backbone's folder)."""
    command = option("--random-weights", is_flag=True)(command)
    return option("--checkpoint", type=click.Path(path_type=Path), default=None, metavar="DIR")(command)


SEED = _SeedRange(0, 2**63 - 1)  # noise seeds (torch generators take 64-bit seeds)
CHUNKS = click.IntRange(1, 100_000)  # = trajectory.MAX_CHUNKS: checked at parse time, before anything loads


def _set_threads(ctx, param, value):
    """``--threads N``: torch's CPU threads for this process (intra-op), set before torch loads through
    ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` and, if torch is already loaded, ``torch.set_num_threads``."""
    if value is None:
        return
    import os
    import sys

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(value)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(value)


def device_options(command):
    """``--device auto|cuda|cpu``, ``--dtype auto|bf16|fp32`` (parameters ``device``, ``dtype``) and
    ``--threads N`` (applied at parse time, no parameter), the same for every command that runs the
    model (:func:`~worldtrace_cli.engine.pipeline.resolve_device`, :func:`~worldtrace_cli.engine.pipeline.resolve_dtype`)."""
    command = option("--threads", type=click.IntRange(1, 1024), default=None, expose_value=False,
                     callback=_set_threads, is_eager=True, default_text="torch's")(command)
    command = option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True)(command)
    return option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
                  note=" (loopbench under torchrun: the LOCAL_RANK GPU)")(command)


def speed_options(command):
    """The speed settings shared by generate, compare, loopbench run and bench speed (click options
    ``--rope-precision``, ``--compile``, ``--overlap-decode`` -> parameters ``rope_precision``,
    ``compile_mode``, ``overlap_decode``); :func:`speed_config` turns them into RunConfig fields."""
    options = [
        option("--rope-precision", type=click.Choice(["float32", "float64"]), default="float32", show_default=True),
        option("--compile", "compile_mode", type=click.Choice(["none", "default", "reduce-overhead", "max-autotune"]),
               default="none", show_default=True),
        click.option("--overlap-decode", is_flag=True,
                     help="Decode each chunk while the next one is generated (side CUDA stream; worker thread "
                          "on CPU, where it does not pay)."),
    ]
    for add in reversed(options):
        command = add(command)
    return command


def speed_config(rope_precision: str, compile_mode: str, overlap_decode: bool, backend: str = "native") -> dict:
    """:func:`speed_options` values (and :func:`backend_option`'s) as RunConfig keyword arguments."""
    return {"rope_precision": rope_precision, "compile": compile_mode, "overlap_decode": overlap_decode,
            "backend": backend}


def backend_option(command):
    """``--backend native|diffusers`` of generate, compare and loopbench run (parameter ``backend``;
    :func:`speed_config` passes it on): the DiT's implementation, worldtrace's own or diffusers'
    ``WanTransformer3DModel`` in the same chunk loop (the backbone row's ``dit_backends``)."""
    return option("--backend", type=click.Choice(["native", "diffusers"]), default="native", show_default=True,
                  note=": text-to-video (t2v) presets only; not with --compile, --rope-precision float64, fp8 "
                       "weights, block offloading, --fsdp or --split-heads yet")(command)


def attention_options(command):
    """``--attention-stats`` and ``--attention-queries N`` of generate, compare and loopbench run
    (parameters ``attention_stats``, ``attention_queries``); :func:`attention_config` turns them into
    RunConfig fields."""
    command = option("--attention-queries", type=click.IntRange(1), default=None, metavar="N")(command)
    return option("--attention-stats", is_flag=True,
                  note=": in chunks.jsonl, cache_timeline.png, summary.json's recall attention on return legs")(command)


def attention_config(attention_stats: bool, attention_queries: int | None) -> dict:
    """:func:`attention_options` values as RunConfig keyword arguments.

    Raises:
        click.UsageError: ``--attention-queries`` without ``--attention-stats`` (exit 2)."""
    if attention_queries is not None and not attention_stats:
        raise click.UsageError("--attention-queries samples the queries of --attention-stats: add --attention-stats")
    return {"attention_stats": bool(attention_stats), "attention_queries": attention_queries or 0}


def prefix_options(command):
    """``--prefix VIDEO``, ``--prefix-chunks K`` and ``--reference VIDEO`` of generate, compare and
    loopbench run (parameters ``prefix``, ``prefix_chunks``, ``reference``); :func:`prefix_config` turns
    them into RunConfig fields (docs/continue.md)."""
    command = click.option("--reference", type=click.Path(path_type=Path), default=None, metavar="VIDEO",
                           help="With --prefix: the real frames that follow the prefix (an MP4 or a folder of "
                                "frames), to score the continuation against (PSNR / SSIM / MSE per chunk).")(command)
    command = click.option("--prefix-chunks", type=click.IntRange(1), default=None, metavar="K",
                           help="With --prefix: commit only the clip's first K chunks (4F-3 + 4F(K-1) pixel "
                                "frames: 9, 21, 33 ... for MG2); the frames after them score the continuation.")(command)
    return option("--prefix", default=None, metavar="VIDEO",
                  note=". Its first frame is the start image unless --image is given")(command)


def prefix_config(prefix: str | None, prefix_chunks: int | None, reference: Path | None) -> dict:
    """:func:`prefix_options` values as RunConfig keyword arguments."""
    return {"prefix": prefix, "prefix_chunks": prefix_chunks, "reference": reference}


def int_list(minimum: int = 1):
    """A click callback for a comma-separated list of integers >= ``minimum`` (``"8,16"`` -> ``[8, 16]``,
    in the order given).

    Raises (from the callback): click.BadParameter for a non-integer, a value below ``minimum`` or an
    empty list: a usage error naming the option (exit 2), before anything loads.
    """
    def callback(ctx, param, value):
        if value is None:
            return None
        try:
            items = [int(v) for v in (v.strip() for v in value.split(",")) if v]
        except ValueError:
            raise click.BadParameter(f"{value!r}: comma-separated integers expected") from None
        if not items:
            raise click.BadParameter("at least one value expected")
        if any(i < minimum for i in items):
            raise click.BadParameter(f"every value must be >= {minimum}, got {value!r}")
        return items
    return callback


def name_list(ctx, param, value):
    """A click callback for a comma-separated list of names (``"a, b,"`` -> ``["a", "b"]``); None stays
    None (the command's default).

    Raises: click.BadParameter for an empty list (a usage error naming the option, exit 2).
    """
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise click.BadParameter("at least one name expected")
    return items


def _writer_default(flag_name: str, writers: list[str]) -> str:
    """`` (default ...)`` for a writer flag's help: one value, or each writer's (from its options class)."""
    from ..writer_options import WRITER_OPTIONS

    values = {w: getattr(WRITER_OPTIONS[w].options(), flag_name) for w in writers}
    shown = {v for v in values.values() if v is not None}
    if not shown:
        return ""
    if len(set(values.values())) == 1:
        return f" (default {next(iter(shown)):g})" if isinstance(next(iter(shown)), float) else f" (default {next(iter(shown))})"
    return " (default " + ", ".join(f"{w} {v:g}" if isinstance(v, float) else f"{w} {v}" for w, v in values.items()
                                     if v is not None) + ")"


def _flag_check(writer_flag):
    """A click callback running a writer flag's own check: a usage error naming the option (exit 2)."""
    def callback(ctx, param, value):
        import math

        if value is None:
            return None
        if isinstance(value, float) and not math.isfinite(value):
            raise click.BadParameter(f"must be a finite number, got {value}")
        problem = writer_flag.check(value) if writer_flag.check else None
        if problem:
            raise click.BadParameter(problem)
        return value
    return callback


def writer_flag_help(name: str) -> str:
    """The help of writer setting ``name`` (``landmark_threshold``): the writers that read it, its own text and
    default, from the registry (one text wherever the flag is offered)."""
    from ..writer_options import writer_flags

    writer_flag, writers = writer_flags()[name]
    default = "" if "default" in writer_flag.help else _writer_default(name, writers)
    return f"{', '.join(writers)}: {writer_flag.help}{default}."


def memory_options(command):
    """The memory settings of generate, compare, loopbench run and play: the shared ones (parameters
    ``positions``, ``budget``, ``summary_slots``, ``recent_slots``) and one option per writer setting
    in the registry (:func:`~worldtrace_cli.writer_options.writer_flags`: ``--sink-frames``,
    ``--top-k``, ...; a writer added to :data:`~worldtrace_cli.writer_options.WRITER_OPTIONS` brings
    its flags here), each None when not given (the writer's own default applies) and checked at
    parse time by its :class:`~worldtrace_cli.writer_options.Flag` check;
    :func:`~worldtrace_cli.config.memory_config` turns them (and a ``--cache`` spec) into a
    :class:`~worldtrace_cli.writer_options.MemoryConfig`. Help names the writers that read each flag."""
    from pathlib import Path

    from ..writer_options import writer_flags

    options = [
        click.option("--positions", type=click.Choice(POSITION_SCHEMES),
                     default=None, help="Position scheme override (default: the writer's)."),
        option("--budget", type=click.IntRange(0), default=None),
        click.option("--summary-slots", type=click.IntRange(0), default=None,
                     help="N_s summary slots (WorldTrace writers; default window - 2: 4, gta_drive 2)."),
        click.option("--recent-slots", type=click.IntRange(1), default=None, help="N_r verbatim recent slots (default 2)."),
    ]
    types = {"int": int, "float": float, "str": str, "path": click.Path(path_type=Path)}
    for name, (writer_flag, writers) in writer_flags().items():
        options.append(click.option(writer_flag.option, name, type=types[writer_flag.kind], default=None,
                                    metavar=writer_flag.metavar, callback=_flag_check(writer_flag),
                                    help=writer_flag_help(name)))
    for add in reversed(options):
        command = add(command)
    return command
