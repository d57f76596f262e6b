"""One connected page of ``worldtrace play``: its lanes (sessions), the order its messages are
answered in, and what happens when it leaves (the protocol: :mod:`worldtrace_cli.play.server`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .views import event_view, frame_index, jpeg_b64, one_line, self_share, slot_view

log = logging.getLogger("worldtrace")

MAX_MESSAGE_BYTES = 4096      # a client message longer than this is answered with an error
MAX_QUEUED = 16               # client messages waiting behind the running one; more are answered with an error


class PageLeft(Exception):
    """The page's client closed or dropped the connection while its request ran (a writer's replay
    stops between chunks); nothing to report."""


@dataclass
class PlaySettings:
    """What ``worldtrace play`` serves: the session options every page's sessions open with
    (:func:`~worldtrace_cli.session.open`'s keywords), the writer specs offered (each one a page
    can open: ``mixed:2``, not ``mixed``), the runs folder, and whether the world runs before the
    first key (``start_running``; by default the page waits for it)."""

    open_kwargs: dict
    cache: str
    writers: list[str]
    runs_dir: Path
    max_sessions: int = 1
    record: bool = True
    pipeline: object = None
    numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # run folders' numbers (next(): atomic)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one chunk at a time on the shared model
    start_running: bool = False


class Page:
    """One connected page: its lanes (sessions), run on one worker thread."""

    def __init__(self, settings: PlaySettings, ws):
        self.settings, self.ws = settings, ws
        self.lanes: list = []
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldtrace-play")
        self.busy = asyncio.Lock()
        self.closed = False
        self.leaving = False  # the client closed or dropped the connection: queued requests are dropped
        # per open session (by id), per latent frame: the JPEG of the last pixel frame it decoded to, so a
        # hovered cache slot shows the frame it holds (the "frame" op); dropped when the session closes
        self.stills: dict[int, dict[int, str]] = {}

    # -- sessions (worker thread) -------------------------------------------------------------
    def _open(self, cache: str):
        from ..session import open as open_session
        from ..writer_options import settings_for

        s = self.settings
        record = None
        if s.record:
            number = next(s.numbers)  # pages open sessions on their own threads: each folder its own number
            record = s.runs_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{number:03d}-{cache.replace(':', '')}"
        # a writer's own flags go to the writers that read them (--landmark-threshold: landmark, mixed)
        return open_session(cache=cache, record=record, pipeline=s.pipeline, **settings_for(cache, s.open_kwargs))

    def _replay(self, session, history: list) -> None:
        for actions in history:
            if self.leaving:  # the page left: no point replaying for nobody
                raise PageLeft()
            frames, record = session.step(actions)
            self._keep_stills(session, record, frames)

    def _keep_stills(self, session, record: dict, frames, encoded: list[str] | None = None) -> None:
        """Keep the JPEG of each of the chunk's latent frames (its last pixel frame; ``encoded``: the
        chunk's frames already encoded, else the needed ones are)."""
        stills = self.stills.setdefault(id(session), {})
        first, end = record["latent_frames"]
        for f in range(first, end):
            i = frame_index(record["chunk"], f, session.preset.frames_per_chunk)
            stills[f] = encoded[i] if encoded is not None else jpeg_b64(frames[i:i + 1])[0]

    def _step_all(self, action: str, prompt: str | None = None) -> list:
        with self.settings.lock:  # a text-to-video lane takes the prompt (None: the last one goes on)
            return [lane.step(action, prompt=prompt) if lane.takes_prompts else lane.step(action) for lane in self.lanes]

    def close_sessions(self, lanes=None) -> list[str]:
        """Close sessions (their run folders completed); returns the folders recorded (a session
        closed before its first chunk leaves none)."""
        done = []
        for lane in (self.lanes if lanes is None else lanes):
            self.stills.pop(id(lane), None)
            try:
                if lane.close() is not None:  # a summary: the session recorded chunks
                    done.append(str(lane.folder.path))
            except Exception as exc:  # one lane failing to close must not keep the others open
                log.warning(f"while closing a session: {exc}")
        if lanes is None:
            self.lanes = []
        return done

    async def run(self, fn, *args):
        """Run ``fn(*args)`` on the page's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- messages -----------------------------------------------------------------------------
    async def send(self, obj: dict) -> None:
        """Send one message; a connection that went away meanwhile marks the page as leaving."""
        if self.ws.closed or self.leaving:
            return
        try:
            await self.ws.send_str(json.dumps(obj))
        except ConnectionError:  # the client dropped (aiohttp: "Cannot write to closing transport")
            self.leaving = True

    async def error(self, message: str) -> None:
        """Send one ``error`` line; paths inside ``--runs-dir`` are shown relative to it (no server paths)."""
        text = " ".join(str(message).split()).replace(f"{self.settings.runs_dir}{os.sep}", "")
        await self.send({"op": "error", "message": text.replace(str(self.settings.runs_dir), "--runs-dir")[:300]})

    def lane_info(self) -> list[dict]:
        """Each lane's writer, run folder name, chunk count and history (GT-PSNR and slots per chunk)."""
        return [{"writer": lane.cfg.memory.cache, "run_dir": None if lane.folder is None else lane.folder.path.name,
                 "chunk": lane.chunk, "psnr": [(r.get("metrics") or {}).get("gt_psnr") for r in lane.records],
                 "timeline": [{"slots": slot_view(r), "events": event_view(r), "self": self_share(r)}
                              for r in lane.records]}
                for lane in self.lanes]

    async def start(self) -> None:
        self.lanes = [await self.run(self._open, self.settings.cache)]
        preset = self.lanes[0].preset
        await self.send({"op": "ready", "preset": preset.name, "mode": preset.mode, "writers": self.settings.writers,
                         "lanes": self.lane_info(), "height": preset.height, "width": preset.width, "fps": preset.fps,
                         "truth": preset.has_world and self.settings.open_kwargs.get("image") is None,
                         "wait_for_key": not self.settings.start_running})

    async def converse(self) -> None:
        """Read the client's messages and answer them in order on a second task, so a close frame
        is seen while a request runs: then the requests still queued are dropped and at most the
        running one (one chunk, or a replay that stops between chunks) finishes. More than
        :data:`MAX_QUEUED` waiting messages are answered with an error and dropped.

        A request that fails for an unforeseen reason (a bug) is logged with its reason
        (:meth:`failed`) and ends the connection.
        """
        from aiohttp import WSMsgType

        queue: asyncio.Queue = asyncio.Queue()
        worker = asyncio.create_task(self._answer(queue))
        try:
            async for msg in self.ws:
                if worker.done():
                    break
                if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    continue
                if queue.qsize() >= MAX_QUEUED:
                    await self.error(f"{queue.qsize()} requests are waiting, the most a page may queue: this one is "
                                     f"dropped (send the next step when a chunk arrives)")
                    continue
                queue.put_nowait(msg)
        finally:
            self.leaving = True  # a close frame, a dropped connection, a server stop: what waits is dropped
            queue.put_nowait(None)
            await worker

    def failed(self, exc: BaseException) -> None:
        """Log the page's failure as one line with its reason (the traceback with ``-v``)."""
        log.error(f"play: a page failed ({one_line(exc)}); its recordings are completed")
        log.debug("play: a page failed", exc_info=exc)

    async def _answer(self, queue: asyncio.Queue) -> None:
        from aiohttp import WSMsgType

        try:
            while (msg := await queue.get()) is not None:
                if self.leaving:
                    continue
                if msg.type == WSMsgType.TEXT:
                    await self.handle(msg.data)
                else:
                    await self.error("binary messages are not understood: send JSON text")
        except Exception as exc:  # a bug: said now (closing the connection may cancel the handler's task)
            self.failed(exc)
            await self.ws.close()  # ends the reading loop

    async def handle(self, text: str) -> None:
        """Answer one client message (errors become one-line ``error`` messages)."""
        from ..errors import WorldtraceError

        if len(text) > MAX_MESSAGE_BYTES:
            return await self.error(f"message of {len(text)} bytes: the limit is {MAX_MESSAGE_BYTES}")
        try:
            msg = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: a few thousand nested brackets
            return await self.error("not JSON: send {\"op\": \"step\", \"action\": \"forward\"}")
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            return await self.error("a message is a JSON object with an \"op\" (step, writer, compare, save, reset)")
        op = msg["op"]
        handler = {"step": self.on_step, "writer": self.on_writer, "compare": self.on_compare, "save": self.on_save,
                   "reset": self.on_reset, "frame": self.on_frame}.get(op)
        if handler is None:
            return await self.error(f"unknown op {op[:40]!r}: step, writer, compare, save, reset or frame")
        async with self.busy:  # one request at a time (a page's messages are read in order anyway)
            try:
                await handler(msg)
            except WorldtraceError as exc:
                await self.error(str(exc))
            except PageLeft:
                pass

    async def on_step(self, msg: dict) -> None:
        from ..errors import InputError

        action, prompt = msg.get("action", "idle"), msg.get("prompt")
        if not self.lanes:
            raise InputError("step: no session is open (a reset failed to open one); reload the page")
        if not isinstance(action, str):
            raise InputError("step: \"action\" is action words, e.g. \"forward+camera_l\"")
        if prompt is not None and (not isinstance(prompt, str) or not self.lanes[0].takes_prompts):
            raise InputError("step: \"prompt\" is text, for a text-to-video preset (self-forcing-tiny, ...)")
        if self.lanes[0].takes_prompts and "action" in msg:
            raise InputError("step: a text-to-video page takes {\"op\": \"step\", \"prompt\": \"...\"} (no prompt: "
                             "the last one goes on), not \"action\"")
        started = time.perf_counter()
        results = await self.run(self._step_all, action, prompt)
        lanes = []
        for lane, (frames, record) in zip(self.lanes, results):
            encoded = jpeg_b64(frames)
            self._keep_stills(lane, record, frames, encoded)
            lanes.append({"writer": lane.cfg.memory.cache, "frames": encoded,
                          "frames_sha256": record["frames_sha256"],
                          "gt_psnr": (record.get("metrics") or {}).get("gt_psnr"),
                          "slots": slot_view(record), "events": event_view(record), "self": self_share(record),
                          "max_offset": record["cache"]["max_offset"], "trained_offset": record["cache"]["trained_offset"],
                          "seconds": round(sum(v for k, v in record["timings_s"].items() if k != "decode_wait"), 3)})
        truth = self.lanes[0].truth()
        await self.send({"op": "chunk", "chunk": results[0].record["chunk"], "action": results[0].record["actions"],
                         "lanes": lanes, "truth": None if truth is None else jpeg_b64(truth),
                         "server_s": round(time.perf_counter() - started, 3)})

    async def on_frame(self, msg: dict) -> None:
        """``{"op": "frame", "lane": i, "latent_frame": f}``: the frame a cache slot holds, as the page
        shows it on hover: the generated one (the last pixel frame latent frame f decoded to) and, with
        ground truth, the true one at the same pose."""
        from ..errors import InputError

        lane, frame = msg.get("lane", 0), msg.get("latent_frame")
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < len(self.lanes):
            raise InputError(f"frame: \"lane\" is 0 .. {len(self.lanes) - 1}, got {str(lane)[:20]}")
        session = self.lanes[lane]
        stills = self.stills.get(id(session), {})
        if isinstance(frame, bool) or not isinstance(frame, int) or frame not in stills:
            raise InputError(f"frame: \"latent_frame\" is a generated latent frame of lane {lane} "
                             f"(0 .. {max(stills, default=-1)}), got {str(frame)[:20]}")
        fpc = session.preset.frames_per_chunk
        chunk = frame // fpc
        truth = await self.run(session.truth, chunk)
        await self.send({"op": "frame", "lane": lane, "latent_frame": frame, "generated": stills[frame],
                         "truth": None if truth is None else jpeg_b64(truth[frame_index(chunk, frame, fpc):][:1])[0]})

    def _history(self) -> list:
        return self.lanes[0].actions_taken() if self.lanes else []

    async def _replayed(self, cache: str):
        from ..errors import InputError

        if not isinstance(cache, str) or cache not in self.settings.writers and ":" not in cache:
            raise InputError(f"unknown writer {str(cache)[:40]!r}; offered: {', '.join(self.settings.writers)}")
        history = self._history()
        await self.send({"op": "status", "message": f"{cache}: replaying {len(history)} chunks"})
        session = await self.run(self._open, cache)
        try:
            await self.run(self._replay, session, history)
        except BaseException:
            await self.run(self.close_sessions, [session])
            raise
        return session

    async def on_writer(self, msg: dict) -> None:
        session = await self._replayed(msg.get("cache"))
        old, self.lanes = self.lanes[:1], [session] + self.lanes[1:]
        await self.run(self.close_sessions, old)
        await self.send({"op": "lanes", "lanes": self.lane_info()})

    async def on_compare(self, msg: dict) -> None:
        cache = msg.get("cache")
        new = [] if cache is None else [await self._replayed(cache)]
        old, self.lanes = self.lanes[1:], self.lanes[:1] + new
        await self.run(self.close_sessions, old)
        await self.send({"op": "lanes", "lanes": self.lane_info()})

    async def on_save(self, msg: dict) -> None:
        from ..errors import InputError

        if not self.lanes or self.lanes[0].folder is None:
            raise InputError("save: this server does not record (--no-record)")
        folders = []
        for lane in self.lanes:
            target = lane.folder.path / "saved" / f"chunk-{lane.chunk:05d}"
            # the server's own folder: saving the same chunk again replaces the same state
            await self.run(lambda: lane.save(target, overwrite=True))
            folders.append(target.relative_to(self.settings.runs_dir).as_posix())  # run-relative: no server paths
        await self.send({"op": "saved", "folders": folders})

    async def on_reset(self, msg: dict) -> None:
        caches = [lane.cfg.memory.cache for lane in self.lanes] or [self.settings.cache]
        done = await self.run(self.close_sessions)
        fresh: list = []
        try:
            for cache in caches:
                fresh.append(await self.run(self._open, cache))
        except BaseException:  # none left open (or locked) when one cannot open
            await self.run(self.close_sessions, fresh)
            raise
        self.lanes = fresh
        await self.send({"op": "lanes", "lanes": self.lane_info(), "closed": [Path(d).name for d in done]})

    async def close(self) -> None:
        """Finish every session (recordings complete) once the running chunk is done. Idempotent."""
        async with self.busy:
            if self.closed:
                return
            self.closed = True
            await self.run(self.close_sessions)
        self.pool.shutdown(wait=True)


__all__ = ["MAX_MESSAGE_BYTES", "MAX_QUEUED", "Page", "PageLeft", "PlaySettings"]
