"""``worldtrace play``: live sessions in the browser, served by aiohttp (HTTP + WebSocket).

aiohttp is the one well-kept library that gives both a web server and WebSocket endpoints (and a
WebSocket client, which the tests use), so the page, its static files and the live protocol come
from one dependency; the generation itself runs on a worker thread, so the event loop keeps
serving while a chunk is made.

Protocol (JSON text messages over ``/ws``; each page is one connection and owns its sessions):

client -> server
  ``{"op": "step", "action": "forward+camera_l"}``   one chunk for every lane (action words of the
                                                      trajectory format; ``idle`` when nothing is held)
  ``{"op": "writer", "cache": "field"}``             lane 0 becomes a new session with that writer,
                                                      replaying the actions taken so far
  ``{"op": "compare", "cache": "sliding" | null}``   a second lane: the same actions replayed under
                                                      another writer, then driven by the same keys; null drops it
  ``{"op": "save"}``                                 every lane's state saved into its run folder
  ``{"op": "reset"}``                                recordings closed (complete), fresh sessions opened
server -> client
  ``ready`` (preset, writers, lanes, frame size, fps), ``chunk`` (per lane: JPEG frames as base64,
  GT-PSNR, the slots read, events; the true frames on loopworld), ``status`` (progress text),
  ``saved`` (folders), ``error`` (one line; the connection stays open).

The client never names a file: run folders are made under the server's ``--runs-dir``.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("worldtrace")

STATIC = Path(__file__).parent / "static"
MAX_MESSAGE_BYTES = 4096      # a client message longer than this is answered with an error
WS_MAX_MESSAGE_BYTES = 1 << 20  # aiohttp drops the connection past this (a message it will not buffer)
JPEG_QUALITY = 85


def jpeg_b64(frames) -> list[str]:
    """uint8 [T, H, W, 3] frames as base64 JPEG strings (Pillow)."""
    from PIL import Image

    out = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=JPEG_QUALITY)
        out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


def slot_view(record: dict) -> list[dict]:
    """A chunk record's slots as the page draws them: one dict per slot with ``role``, ``kind``,
    ``frames`` (source latent frames), ``mean`` (their mean) and ``vpos`` (virtual position)."""
    from ..outputs.records import expand_slot_records

    return [{"role": s["role"], "kind": s["kind"], "frames": s["frames"][:8], "n": len(s["frames"]),
             "mean": sum(s["frames"]) / len(s["frames"]) if s["frames"] else None, "vpos": s["virtual_position"]}
            for s in expand_slot_records(record["cache"]["slots"])]


def event_view(record: dict) -> list[dict]:
    """The events worth showing live: landmarks stored and retrievals (with what they picked)."""
    out = []
    for e in record["cache"].get("events") or []:
        if e.get("type") == "landmark_test" and e.get("landmark"):
            out.append({"type": "landmark", "frame": e["frame"]})
        elif e.get("type") == "retrieval" and e.get("retrieved"):
            out.append({"type": "retrieval", "picked": [p.get("frames", p) for p in e["retrieved"]][:6]})
    return out


@dataclass
class PlaySettings:
    """What ``worldtrace play`` serves: the session options every page's sessions open with
    (:func:`~worldtrace_cli.session.open`'s keywords), the writer names offered, the runs folder."""

    open_kwargs: dict
    cache: str
    writers: list[str]
    runs_dir: Path
    max_sessions: int = 1
    record: bool = True
    pipeline: object = None
    counter: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)  # one chunk at a time on the shared model


class Page:
    """One connected page: its lanes (sessions), run on one worker thread."""

    def __init__(self, settings: PlaySettings, ws):
        self.settings, self.ws = settings, ws
        self.lanes: list = []
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldtrace-play")
        self.busy = asyncio.Lock()
        self.closed = False

    # -- sessions (worker thread) -------------------------------------------------------------
    def _open(self, cache: str):
        from ..session import open as open_session
        from ..writer_options import settings_for

        s = self.settings
        record = None
        if s.record:
            s.counter += 1
            record = s.runs_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{s.counter:03d}-{cache.replace(':', '')}"
        # a writer's own flags go to the writers that read them (--landmark-threshold: landmark, mixed)
        return open_session(cache=cache, record=record, pipeline=s.pipeline, **settings_for(cache, s.open_kwargs))

    def _replay(self, session, history: list) -> None:
        for actions in history:
            session.step(actions)

    def _step_all(self, action: str) -> list:
        with self.settings.lock:
            return [lane.step(action) for lane in self.lanes]

    def close_sessions(self, lanes=None) -> list[str]:
        """Close sessions (their run folders completed); returns the folders."""
        done = []
        for lane in (self.lanes if lanes is None else lanes):
            try:
                lane.close()
                if lane.folder is not None:
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
        if not self.ws.closed:
            await self.ws.send_str(json.dumps(obj))

    async def error(self, message: str) -> None:
        await self.send({"op": "error", "message": " ".join(str(message).split())[:300]})

    def lane_info(self) -> list[dict]:
        """Each lane's writer, run folder name, chunk count and history (GT-PSNR and slots per chunk)."""
        return [{"writer": lane.cfg.memory.cache, "run_dir": None if lane.folder is None else lane.folder.path.name,
                 "chunk": lane.chunk, "psnr": [(r.get("metrics") or {}).get("gt_psnr") for r in lane.records],
                 "timeline": [{"slots": slot_view(r), "events": event_view(r)} for r in lane.records]}
                for lane in self.lanes]

    async def start(self) -> None:
        self.lanes = [await self.run(self._open, self.settings.cache)]
        preset = self.lanes[0].preset
        await self.send({"op": "ready", "preset": preset.name, "mode": preset.mode, "writers": self.settings.writers,
                         "lanes": self.lane_info(), "height": preset.height, "width": preset.width, "fps": preset.fps,
                         "truth": preset.has_world and self.settings.open_kwargs.get("image") is None})

    async def handle(self, text: str) -> None:
        """Answer one client message (errors become one-line ``error`` messages)."""
        from ..errors import WorldtraceError

        if len(text) > MAX_MESSAGE_BYTES:
            return await self.error(f"message of {len(text)} bytes: the limit is {MAX_MESSAGE_BYTES}")
        try:
            msg = json.loads(text)
        except ValueError:
            return await self.error("not JSON: send {\"op\": \"step\", \"action\": \"forward\"}")
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            return await self.error("a message is a JSON object with an \"op\" (step, writer, compare, save, reset)")
        op = msg["op"]
        handler = {"step": self.on_step, "writer": self.on_writer, "compare": self.on_compare, "save": self.on_save,
                   "reset": self.on_reset}.get(op)
        if handler is None:
            return await self.error(f"unknown op {op[:40]!r}: step, writer, compare, save or reset")
        async with self.busy:  # one request at a time (a page's messages are read in order anyway)
            try:
                await handler(msg)
            except WorldtraceError as exc:
                await self.error(str(exc))

    async def on_step(self, msg: dict) -> None:
        from ..errors import InputError

        action = msg.get("action", "idle")
        if not isinstance(action, str):
            raise InputError("step: \"action\" is action words, e.g. \"forward+camera_l\"")
        started = time.perf_counter()
        results = await self.run(self._step_all, action)
        lanes = []
        for lane, (frames, record) in zip(self.lanes, results):
            lanes.append({"writer": lane.cfg.memory.cache, "frames": jpeg_b64(frames),
                          "frames_sha256": record["frames_sha256"],
                          "gt_psnr": (record.get("metrics") or {}).get("gt_psnr"),
                          "slots": slot_view(record), "events": event_view(record),
                          "max_offset": record["cache"]["max_offset"], "trained_offset": record["cache"]["trained_offset"],
                          "seconds": round(sum(v for k, v in record["timings_s"].items() if k != "decode_wait"), 3)})
        truth = self.lanes[0].truth()
        await self.send({"op": "chunk", "chunk": results[0].record["chunk"], "action": results[0].record["actions"],
                         "lanes": lanes, "truth": None if truth is None else jpeg_b64(truth),
                         "server_s": round(time.perf_counter() - started, 3)})

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
            folders.append(str(await self.run(lane.save, target)))
        await self.send({"op": "saved", "folders": folders})

    async def on_reset(self, msg: dict) -> None:
        caches = [lane.cfg.memory.cache for lane in self.lanes] or [self.settings.cache]
        done = await self.run(self.close_sessions)
        self.lanes = [await self.run(self._open, cache) for cache in caches]
        await self.send({"op": "lanes", "lanes": self.lane_info(), "closed": [Path(d).name for d in done]})

    async def close(self) -> None:
        """Finish every session (recordings complete) once the running chunk is done. Idempotent."""
        async with self.busy:
            if self.closed:
                return
            self.closed = True
            await self.run(self.close_sessions)
        self.pool.shutdown(wait=True)


def make_app(settings: PlaySettings):
    """The aiohttp application: ``/`` (the page), ``/static/<file>``, ``/ws`` (the live protocol).

    At most ``settings.max_sessions`` pages at once: another gets an ``error`` message and is
    closed. A page's sessions end (recordings complete, memory freed) when it disconnects, and
    every page's when the server stops.
    """
    from aiohttp import WSMsgType, web

    pages: set[Page] = set()

    async def index(request):
        return web.FileResponse(STATIC / "index.html")

    async def no_icon(request):
        return web.Response(status=204)

    async def websocket(request):
        ws = web.WebSocketResponse(max_msg_size=WS_MAX_MESSAGE_BYTES, heartbeat=30)
        await ws.prepare(request)
        if len(pages) >= settings.max_sessions:
            await ws.send_str(json.dumps({"op": "error", "message": f"server full: {len(pages)} of "
                                          f"{settings.max_sessions} sessions in use (worldtrace play --max-sessions)"}))
            await ws.close()
            return ws
        page = Page(settings, ws)
        pages.add(page)
        try:
            try:
                await page.start()
            except Exception as exc:  # a session that cannot open: say why, keep the server
                from ..errors import WorldtraceError

                if not isinstance(exc, WorldtraceError):
                    log.exception("opening a session")
                await page.error(str(exc))
                return ws
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await page.handle(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await page.error("binary messages are not understood: send JSON text")
        except Exception:
            log.exception("play: a page failed")
        finally:
            pages.discard(page)
            await page.close()
        return ws

    async def on_shutdown(app):
        for page in list(pages):
            await page.ws.close()
            await page.close()

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/ws", websocket)
    app.router.add_get("/favicon.ico", no_icon)
    app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
    app.on_shutdown.append(on_shutdown)
    app["pages"] = pages
    return app


def serve_forever(settings: PlaySettings, host: str, port: int) -> None:
    """Serve :func:`make_app` on ``host:port`` until Ctrl-C or SIGTERM, then close every page's
    sessions (their run folders complete). Prints the page's URL as the one line on stdout (with
    ``port`` 0, the free port the system chose).

    Raises:
        OutputError: the address cannot be bound (in use, not permitted).
    """
    import signal
    import sys

    import click
    from aiohttp import web

    from ..errors import OutputError

    async def main():
        runner = web.AppRunner(make_app(settings), handle_signals=False, shutdown_timeout=120)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise OutputError(f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})") from None
        bound = runner.addresses[0][1] if runner.addresses else port
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"http://{shown}:{bound}/")
        sys.stdout.flush()
        log.info("serving; Ctrl-C stops the server and completes every recording")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: finishing the running chunk and closing the recordings")
        for page in list(runner.app["pages"]):
            await page.ws.close()
            await page.close()
        await runner.cleanup()

    asyncio.run(main())


__all__ = ["MAX_MESSAGE_BYTES", "Page", "PlaySettings", "event_view", "jpeg_b64", "make_app", "serve_forever", "slot_view"]
