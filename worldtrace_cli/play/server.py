"""``worldtrace play``: live sessions in the browser, served by aiohttp (HTTP + WebSocket).

aiohttp is the one well-kept library that gives both a web server and WebSocket endpoints (and a
WebSocket client, which the tests use), so the page, its static files and the live protocol come
from one dependency; the generation itself runs on a worker thread, so the event loop keeps
serving while a chunk is made.

Protocol (JSON text messages over ``/ws``; each page is one connection and owns its sessions):

client -> server
  ``{"op": "step", "action": "forward+camera_l"}``   one chunk for every lane (action words of the
                                                      trajectory format; ``idle`` when nothing is held)
  ``{"op": "step", "prompt": "a red lighthouse"}``   the same for a text-to-video preset (``ready``'s
                                                      mode ``text``); no prompt: the last one goes on
  ``{"op": "writer", "cache": "field"}``             lane 0 becomes a new session with that writer,
                                                      replaying the actions taken so far
  ``{"op": "compare", "cache": "sliding" | null}``   a second lane: the same actions replayed under
                                                      another writer, then driven by the same keys; null drops it
  ``{"op": "save"}``                                 every lane's state saved into its run folder
  ``{"op": "reset"}``                                recordings closed (complete), fresh sessions opened
  ``{"op": "frame", "lane": 0, "latent_frame": 5}``  the frame a cache slot holds (hovered or tapped)
server -> client
  ``ready`` (preset, writers, lanes, frame size, fps, wait_for_key), ``chunk`` (per lane: JPEG frames as base64,
  GT-PSNR, the slots read with their attention shares, the chunk's own share, events; the true frames on
  loopworld), ``frame`` (the generated JPEG of that latent frame and the true one at its pose, or null),
  ``status`` (progress text), ``saved`` (folders relative to ``--runs-dir``), ``error`` (one line; the
  connection stays open).

The client never names a file: run folders are made under the server's ``--runs-dir``, and the
page is shown only paths inside it. A close frame or a dropped connection drops the page's queued
requests (at most the running chunk finishes); a message over 1 MiB closes the connection with
WebSocket code 1009.
"""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from .page import MAX_MESSAGE_BYTES, MAX_QUEUED, Page, PageLeft, PlaySettings
from .views import event_view, jpeg_b64, one_line, slot_view

log = logging.getLogger("worldtrace")

STATIC = Path(__file__).parent / "static"
WS_MAX_MESSAGE_BYTES = 1 << 20  # past this aiohttp closes the connection with code 1009 (message too big)
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # --host values that keep the server to this machine


def make_app(settings: PlaySettings):
    """The aiohttp application: ``/`` (the page), ``/static/<file>``, ``/ws`` (the live protocol).

    At most ``settings.max_sessions`` pages at once: another gets an ``error`` message and is
    closed. A page's sessions end (recordings complete, memory freed) when it disconnects, and
    every page's when the server stops.
    """
    from aiohttp import web

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
            await page.converse()
        except Exception as exc:  # a bug: say what it was (the traceback with -v)
            page.failed(exc)
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
        if host not in LOOPBACK:  # the port bound, not the one asked for (--port 0)
            log.warning(f"--host {host}: the server is reachable from other machines; anyone who can reach "
                        f"{shown}:{bound} can drive the model (there is no authentication)")
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


__all__ = ["LOOPBACK", "MAX_MESSAGE_BYTES", "MAX_QUEUED", "Page", "PageLeft", "PlaySettings", "event_view", "jpeg_b64", "make_app", "one_line", "serve_forever", "slot_view"]
