"""``worldtrace play``: the real server in its own process on localhost, driven by a real WebSocket
client (aiohttp's) and by a real headless browser (Chromium from Debian's packages through
Selenium and Debian's chromedriver; skipped where they are not installed: `.ci/run` installs them)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def start_server(runs, *args, host="127.0.0.1"):
    """``worldtrace play --port 0`` in its own process; returns (process, base URL from its stdout,
    on the loopback: the server may bind all addresses, the tests connect to this machine only)."""
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "play", "--port", "0", "--runs-dir", str(runs),
                             "--device", "cpu", "--host", host, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith(f"http://{host}:"):
        proc.kill()
        raise AssertionError(f"no URL on stdout: {url!r}; stderr: {proc.stderr.read()[-2000:]}")
    return proc, url.replace(f"//{host}:", "//127.0.0.1:")


def stop_server(proc) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return rc, proc.stderr.read()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("play-runs")
    # a landmark setting (loopworld's own tau): the compare test's sliding lane must open without it
    proc, url = start_server(runs, "--cache", "landmark", "--landmark-threshold", "0.0047")
    yield url, runs
    rc, err = stop_server(proc)
    assert rc == 0, err[-2000:]
    assert "a page failed" not in err, err[-2000:]  # dropped, flooded and bombed pages are no failures


def _chrome():
    """Headless Chromium from Debian's packages, driven by Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _waiter(driver):
    """``wait_for(predicate, what, timeout)``: poll until true, else fail naming what and the page's status."""
    from selenium.webdriver.common.by import By

    def wait_for(predicate, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; status: {driver.find_element(By.ID, 'status').text}")
    return wait_for


async def _receive(ws) -> dict:
    msg = await asyncio.wait_for(ws.receive(), timeout=180)
    return json.loads(msg.data)


def run(coro):
    return asyncio.run(coro)


def test_a_websocket_client_drives_five_chunks_and_the_run_folder_is_complete(server):
    import aiohttp
    from PIL import Image

    url, runs = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            ready = await _receive(ws)
            assert ready["op"] == "ready" and ready["truth"] and "landmark" in ready["writers"]
            chunks = []
            for action in ["forward", "forward", "camera_r", "camera_l+back", "idle"]:
                await ws.send_str(json.dumps({"op": "step", "action": action}))
                chunks.append(await _receive(ws))
            return ready, chunks

    ready, chunks = run(drive())
    assert [c["chunk"] for c in chunks] == [0, 1, 2, 3, 4]
    for c in chunks:
        lane = c["lanes"][0]
        assert len(lane["frames"]) == len(c["truth"]) == (9 if c["chunk"] == 0 else 12)
        img = Image.open(io.BytesIO(base64.b64decode(lane["frames"][0])))
        assert img.size == (ready["width"], ready["height"])
        assert lane["gt_psnr"] > 5 and lane["writer"] == "landmark"
    assert chunks[-1]["lanes"][0]["slots"], "the cache panel gets the slots each chunk read"
    # attention per slot is on in play: each slot's share and the chunk's own sum to 1
    last = chunks[-1]["lanes"][0]
    assert abs(sum(s["share"] for s in last["slots"]) + last["self"] - 1) < 1e-4
    assert all(isinstance(s["still"], int) for s in last["slots"])
    run_dir = runs / ready["lanes"][0]["run_dir"]
    deadline = time.time() + 60  # the page disconnected: its session closes its recording
    while not (run_dir / "summary.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == 5
    records = [json.loads(line) for line in (run_dir / "chunks.jsonl").read_text().splitlines()]
    assert [r["frames_sha256"] for r in records] == [c["lanes"][0]["frames_sha256"] for c in chunks]
    assert "camera_l+back" in (run_dir / "trajectory.yaml").read_text()


BAD_MESSAGES = [
    ("not json at all", "not JSON"),
    (json.dumps([1, 2]), "JSON object with an \"op\""),
    (json.dumps({"op": "fly"}), "unknown op 'fly'"),
    (json.dumps({"op": "step", "action": "jump"}), "'jump' is not valid in universal mode"),
    (json.dumps({"op": "step", "action": ["forward"]}), "\"action\" is action words"),
    (json.dumps({"op": "writer", "cache": "../../etc"}), "unknown writer"),
    (json.dumps({"op": "step", "action": "x" * 20000}), "the limit is 4096"),
    ("[" * 2000 + "]" * 2000, "not JSON"),  # nested past the recursion limit: an answer, not a crash
]


def test_bad_messages_get_one_line_and_the_server_keeps_serving(server):
    """Every bad message on one page, one after another: each answered with its one-line error, a
    binary frame too, and the page still steps afterwards (one session, so one model step: the
    server's answer to each message does not depend on the messages before it)."""
    import aiohttp

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            assert (await _receive(ws))["op"] == "ready"
            errors = []
            for message, _ in BAD_MESSAGES:
                await ws.send_str(message)
                errors.append(await _receive(ws))
            await ws.send_bytes(b"\x00\x01")
            binary = await _receive(ws)
            await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
            return errors, binary, await _receive(ws)

    errors, binary, chunk = run(drive())
    for (message, reply), error in zip(BAD_MESSAGES, errors):
        assert error["op"] == "error" and reply in error["message"] and "\n" not in error["message"], message[:40]
    assert binary["op"] == "error" and "binary" in binary["message"]
    assert chunk["op"] == "chunk" and chunk["chunk"] == 0


def test_a_second_page_over_max_sessions_is_refused(server):
    import aiohttp

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as first:
            assert (await _receive(first))["op"] == "ready"
            async with http.ws_connect(url + "ws") as second:
                refused = await _receive(second)
            await first.send_str(json.dumps({"op": "step", "action": "idle"}))  # the first page still works
            return refused, await _receive(first)

    refused, chunk = run(drive())
    assert refused["op"] == "error" and "server full" in refused["message"]
    assert chunk["op"] == "chunk"


def test_a_hovered_slot_gets_the_frame_it_holds_and_the_truth(server):
    """The ``frame`` op: the generated frame of a latent frame the lane made (what a cache slot holds)
    and the true frame at its pose; a frame not made yet, or a lane that is not there, is one line."""
    import aiohttp
    from PIL import Image

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            ready = await _receive(ws)
            for action in ["forward", "camera_r"]:
                await ws.send_str(json.dumps({"op": "step", "action": action}))
                chunk = await _receive(ws)
            replies = []
            for msg in ({"op": "frame", "lane": 0, "latent_frame": chunk["lanes"][0]["slots"][0]["still"]},
                        {"op": "frame", "lane": 0, "latent_frame": 6}, {"op": "frame", "lane": 3, "latent_frame": 0}):
                await ws.send_str(json.dumps(msg))
                replies.append(await _receive(ws))
            return ready, chunk, replies

    ready, chunk, (good, late, lane) = run(drive())
    assert good["op"] == "frame" and good["truth"] is not None
    img = Image.open(io.BytesIO(base64.b64decode(good["generated"])))
    assert img.size == (ready["width"], ready["height"])
    first = chunk["lanes"][0]["slots"][0]["still"]
    if first == 5:  # the slot holds the last latent frame of chunk 1: its still is that chunk's last pixel frame
        assert good["generated"] == chunk["lanes"][0]["frames"][-1]
    assert late["op"] == "error" and "latent_frame" in late["message"] and "0 .. 5" in late["message"]
    assert lane["op"] == "error" and "lane" in lane["message"]


def test_compare_replays_a_second_writer_beside_the_first(server):
    import aiohttp

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            await _receive(ws)
            for action in ["forward", "camera_r"]:
                await ws.send_str(json.dumps({"op": "step", "action": action}))
                await _receive(ws)
            await ws.send_str(json.dumps({"op": "compare", "cache": "sliding"}))
            while (msg := await _receive(ws))["op"] == "status":
                pass
            await ws.send_str(json.dumps({"op": "step", "action": "camera_l"}))
            return msg, await _receive(ws)

    lanes, chunk = run(drive())
    assert [(l["writer"], l["chunk"]) for l in lanes["lanes"]] == [("landmark", 2), ("sliding", 2)]
    assert len(lanes["lanes"][1]["psnr"]) == 2  # the replayed writer's own history
    assert [l["writer"] for l in chunk["lanes"]] == ["landmark", "sliding"] and chunk["chunk"] == 2


def test_ctrl_c_completes_the_recordings_of_connected_pages(tmp_path):
    """Also issue 44 (7): bound on every address with --port 0, the warning names the port bound."""
    import aiohttp

    proc, url = start_server(tmp_path, "--cache", "sliding", "--metrics", "none", "--start-running", host="0.0.0.0")
    port = url.rsplit(":", 1)[1].strip("/")

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            ready = await _receive(ws)
            for _ in range(2):
                await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
                await _receive(ws)
            rc, err = await asyncio.get_running_loop().run_in_executor(None, stop_server, proc)
            return ready, rc, err

    ready, rc, err = run(drive())
    assert rc == 0, err[-2000:]
    assert f"anyone who can reach 0.0.0.0:{port} can drive the model" in err and ":0 " not in err, err[-2000:]
    assert ready["wait_for_key"] is False  # --start-running: the page runs idle chunks from load
    summary = json.loads((tmp_path / ready["lanes"][0]["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == 2


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")
def test_a_browser_walks_and_the_cache_panel_follows(server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    url, _ = server
    driver = _chrome()
    wait_for = _waiter(driver)

    def chunk():
        text = driver.find_element(By.ID, "chunk").text
        return int(text) if text.isdigit() else -1

    def status():
        return driver.find_element(By.ID, "status").text

    try:
        driver.get(url)
        # issue 44: the world waits for the first key (no idle chunks, nothing recorded, the CPU idle)
        wait_for(lambda: "waits for your first key" in status(), "the page to be ready")
        time.sleep(2)
        assert chunk() == -1 and driver.find_element(By.ID, "latency").text == "-"
        # a key pressed while paused: key-to-frame leaves the 6 s pause out (it counted it before)
        ActionChains(driver).send_keys(" ").perform()
        wait_for(lambda: status() == "paused", "the pause")
        ActionChains(driver).key_down("w").perform()
        time.sleep(6)
        resumed = time.monotonic()
        ActionChains(driver).send_keys(" ").perform()
        wait_for(lambda: driver.find_element(By.ID, "latency").text not in ("-", ""), "the first chunk's latency")
        shown = time.monotonic() - resumed  # at least the latency the page counts, if it leaves the pause out
        # (counted with the pause it would be 6 s more; a loaded machine's slow chunk moves both alike)
        assert float(driver.find_element(By.ID, "latency").text) <= shown + 0.5, shown
        assert chunk() >= 0
        canvas_sum = "const c = document.getElementById('gen0'); const d = c.getContext('2d')" \
                     ".getImageData(0, 0, c.width, c.height).data; let s = 0; for (const v of d) s += v; return s;"
        wait_for(lambda: driver.execute_script(canvas_sum) > 0, "a drawn frame")
        before = driver.find_element(By.ID, "slots0").text
        seen = chunk()
        wait_for(lambda: chunk() >= seen + 2, "two chunks while W is held")
        assert "W" in [k.text for k in driver.find_elements(By.CSS_SELECTOR, ".key.on")]
        assert driver.find_element(By.ID, "action").text == "forward"
        ActionChains(driver).key_up("w").perform()
        ActionChains(driver).drag_and_drop_by_offset(driver.find_element(By.ID, "gen0"), 120, 0).perform()
        wait_for(lambda: "camera_r" in driver.find_element(By.ID, "action").text, "a chunk turned by a mouse drag")
        after = driver.find_element(By.ID, "slots0").text
        assert after != before and "recent" in after
        # the memory being read: the attention panel is drawn, each slot row shows its share, and a
        # hovered slot shows the frame it holds beside the true frame
        attn_sum = canvas_sum.replace("'gen0'", "'attn0'")
        wait_for(lambda: driver.execute_script(attn_sum) > 0, "the attention panel")
        assert driver.find_element(By.ID, "attn0").is_displayed()
        row = driver.find_elements(By.CSS_SELECTOR, "#slots0 tr")[0]
        assert float(row.text.split()[-1]) > 0  # the share column
        ActionChains(driver).move_to_element(row).perform()
        wait_for(lambda: (driver.find_element(By.ID, "previewgen").get_attribute("src") or "").startswith("data:image"),
                 "the hovered slot's frame")
        assert "slot 0" in driver.find_element(By.ID, "previewlabel").text
        assert driver.find_element(By.ID, "previewtruth").is_displayed()
        wait_for(lambda: driver.find_element(By.ID, "latency").text not in ("-", ""), "a key-to-frame latency")
        # compare with sliding: the second writer replays the walk and gets its own attention panel
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element(By.ID, "compare")).select_by_value("sliding")
        wait_for(lambda: driver.find_element(By.ID, "cache1panel").is_displayed(), "the second writer's cache panel")
        wait_for(lambda: driver.execute_script(canvas_sum.replace("'gen0'", "'attn1'")) > 0,
                 "the second writer's attention panel")
        rows = driver.find_elements(By.CSS_SELECTOR, "#slots1 tr")
        assert rows and all(r.text.split()[0] == "recent" for r in rows), [r.text for r in rows]  # sliding: recent only
        assert float(rows[0].text.split()[-1]) > 0
        driver.save_screenshot(str(tmp_path / "play.png"))
        assert (tmp_path / "play.png").stat().st_size > 10_000
    finally:
        driver.quit()


def test_play_refuses_bad_settings_before_loading(server, tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    port = server[0].rsplit(":", 1)[1].strip("/")
    (tmp_path / "a-file").write_text("")
    for args, code, message in ((["--preset", "lingbot-tiny"], 2, "--preset lingbot-tiny: needs --image"),
                                (["--preset", "tiny"], 2, "needs --image"),
                                (["--cache", "nope"], 2, "nope"),
                                (["--port", port], 4, f"--port {port}: cannot listen"),
                                (["--runs-dir", str(tmp_path / "a-file")], 4, "a-file")):
        out = subprocess.run([sys.executable, "-m", "worldtrace_cli", "play", "--runs-dir", str(tmp_path), *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == code and message in out.stderr and out.stdout == "", out.stderr
        assert "loading" not in out.stderr  # refused before the model loads


def _run_dirs(runs) -> set:
    return {p.name for p in runs.iterdir() if p.is_dir()}


async def _next_page(http, url, timeout=60) -> dict:
    """Connect until the server has a free page slot (a page that left frees its slot once its
    running chunk is done); the ``ready`` message."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        async with http.ws_connect(url + "ws") as ws:
            if (msg := await _receive(ws))["op"] == "ready":
                return msg
        await asyncio.sleep(0.2)
    raise AssertionError("the server never served another page")


def test_the_page_offers_only_writers_it_opens_and_unstepped_sessions_leave_nothing(server):
    """Issue 44 (3, 9): every writer offered opens (mixed as mixed:2); sessions closed before a
    step (the page's first, each writer switched to, a reset) leave no run folder."""
    import aiohttp

    url, runs = server
    before = _run_dirs(runs)

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            ready = await _receive(ws)
            replies = {}
            for writer in ready["writers"]:
                await ws.send_str(json.dumps({"op": "writer", "cache": writer}))
                while (msg := await _receive(ws))["op"] == "status":
                    pass
                replies[writer] = msg
            await ws.send_str(json.dumps({"op": "reset"}))
            return ready, replies, await _receive(ws)

    ready, replies, reset = run(drive())
    assert "mixed:2" in ready["writers"] and "mixed" not in ready["writers"] and ready["wait_for_key"] is True
    for writer, reply in replies.items():
        assert reply["op"] == "lanes" and reply["lanes"][0]["writer"] == writer, reply
    assert reset["op"] == "lanes" and reset["closed"] == []  # no recording: nothing was generated
    deadline = time.time() + 30
    while _run_dirs(runs) != before and time.time() < deadline:
        time.sleep(0.2)
    assert _run_dirs(runs) == before


def test_a_close_frame_drops_queued_steps_and_save_names_no_server_path(server):
    """Issue 44 (6, 8): a page that queues 40 steps and closes politely gets at most the running
    chunk (the session slot is free at once); save answers run-relative folders."""
    import aiohttp

    url, runs = server

    async def drive():
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(url + "ws") as ws:
                ready = await _receive(ws)
                await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
                await _receive(ws)
                for _ in range(2):  # twice at the same chunk: the server replaces its own saved state
                    await ws.send_str(json.dumps({"op": "save"}))
                    saved = await _receive(ws)
                for _ in range(40):
                    await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
                while (msg := await _receive(ws))["op"] != "error":  # past 16 waiting: refused at once
                    pass
                assert "16 requests are waiting" in msg["message"], msg
            closed = time.time()
            second = await _next_page(http, url)  # the slot: free once the running chunk is done
            return ready, saved, time.time() - closed, second

    ready, saved, waited, second = run(drive())
    assert saved["op"] == "saved" and saved["folders"], saved
    for folder in saved["folders"]:
        assert not folder.startswith("/") and str(runs) not in folder
        assert (runs / folder / "state.json").is_file()
    assert second["op"] == "ready", second  # not "server full"
    run_dir = runs / ready["lanes"][0]["run_dir"]
    deadline = time.time() + 60
    while not (run_dir / "summary.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    chunks = json.loads((run_dir / "summary.json").read_text())["totals"]["chunks"]
    assert chunks <= 3, f"{chunks} chunks generated for a page that left after its first (waited {waited:.1f} s)"


def _masked_text_frame_head(declared: int, body: bytes) -> bytes:
    """A client's WebSocket text frame (RFC 6455 section 5.2: FIN, opcode 1, mask bit, 64-bit length)
    declaring ``declared`` payload bytes, followed by the first ``len(body)`` of them, masked."""
    import struct

    mask = b"\x11\x22\x33\x44"
    head = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", declared) + mask
    return head + bytes(b ^ mask[i % 4] for i, b in enumerate(body))


def test_a_dropped_connection_and_a_huge_message_end_the_page_quietly(server):
    """Issue 44 (11, the 1 MiB case): a client that vanishes mid-chunk is no failure (the module's
    server checks its stderr); a message over 1 MiB is closed with WebSocket code 1009 (message too
    big), as docs/session.md says, and the server keeps serving."""
    import aiohttp

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url + "ws")
            await _receive(ws)
            for _ in range(3):
                await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
            await asyncio.sleep(0.3)
            ws._response.connection.transport.abort()  # no close frame: the network went away
            deadline = time.time() + 60
            while time.time() < deadline:  # "server full" while the dropped page finishes its chunk
                async with http.ws_connect(url + "ws") as ws:
                    if (await _receive(ws))["op"] != "ready":
                        await asyncio.sleep(0.2)
                        continue
                    # The frame's header declares 2 MiB and a little of the body follows: the server
                    # refuses at the header. Writing the whole body raced the server's close on a
                    # loaded machine (its reset while the client still wrote lost the close frame).
                    ws._response.connection.transport.write(_masked_text_frame_head(2 << 20, b"x" * 64))
                    closing = await asyncio.wait_for(ws.receive(), timeout=60)
                    return closing, await _next_page(http, url)
            raise AssertionError("the dropped page never freed its slot")

    closing, ready = run(drive())
    assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1009


def test_a_failing_page_says_why_in_its_log_line(monkeypatch):
    """Issue 44 (11): a page that fails for an unforeseen reason (a bug) is logged with that reason,
    and the connection is closed (the real make_app, in process; the fault injected into the step)."""
    import logging

    import aiohttp
    from aiohttp.test_utils import TestServer

    from worldtrace_cli.play.server import Page, PlaySettings, make_app

    async def no_sessions(self):
        await self.send({"op": "ready"})

    async def broken_step(self, msg):
        raise RuntimeError("the model fell over\nsecond line")

    monkeypatch.setattr(Page, "start", no_sessions)
    monkeypatch.setattr(Page, "on_step", broken_step)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("worldtrace")
    logger.addHandler(handler)

    async def drive():
        settings = PlaySettings({}, "sliding", ["sliding"], Path("."), record=False)
        async with TestServer(make_app(settings)) as srv, aiohttp.ClientSession() as http:
            async with http.ws_connect(srv.make_url("/ws")) as ws:
                await _receive(ws)
                await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
                closing = await asyncio.wait_for(ws.receive(), timeout=30)
            for _ in range(100):  # the server logs once its reading loop has ended
                if any("a page failed" in line for line in lines):
                    break
                await asyncio.sleep(0.1)
        return closing

    try:
        closing = run(drive())
    finally:
        logger.removeHandler(handler)
    assert closing.type == aiohttp.WSMsgType.CLOSE
    assert [line for line in lines if "a page failed" in line] == [
        "play: a page failed (RuntimeError: the model fell over second line); its recordings are completed"]


def test_a_text_to_video_preset_plays_on_prompts(tmp_path):
    """``worldtrace play --preset self-forcing-tiny``: ``ready`` says mode text (no truth); a step
    carries the prompt (none: the last goes on; a new one switches and re-caches); the recording's
    trajectory is prompt segments. In a browser the prompt box starts the video (typing W in it
    does not walk); action-only messages get the session's one-line error."""
    import aiohttp

    runs = tmp_path / "runs"
    proc, url = start_server(runs, "--preset", "self-forcing-tiny", "--cache", "sliding")
    try:
        async def drive():
            async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
                ready = await _receive(ws)
                out = []
                for msg in ({"op": "step"}, {"op": "step", "prompt": "a red lighthouse"}, {"op": "step"},
                            {"op": "step", "prompt": "a busy market"}, {"op": "step", "prompt": 3},
                            {"op": "step", "action": "forward"}):
                    await ws.send_str(json.dumps(msg))
                    out.append(await _receive(ws))
                return ready, out

        ready, (first, *chunks, bad, walk) = run(drive())
        assert ready["mode"] == "text" and ready["truth"] is False
        assert first["op"] == "error" and "needs a prompt" in first["message"]
        assert [c["action"] for c in chunks] == ["a red lighthouse", "a red lighthouse", "a busy market"]
        assert bad["op"] == "error" and "\"prompt\" is text" in bad["message"]
        assert walk["op"] == "error" and "a text-to-video page takes" in walk["message"], walk
        if CHROMIUM and CHROMEDRIVER:
            _browser_types_a_prompt(url, tmp_path)
    finally:
        rc, err = stop_server(proc)
    assert rc == 0, err[-2000:]
    (run_dir,) = [p for p in runs.iterdir() if (p / "trajectory.yaml").is_file() and "market" in
                  (p / "trajectory.yaml").read_text()]
    assert "- {prompt: a red lighthouse, chunks: 2}" in (run_dir / "trajectory.yaml").read_text()
    records = [json.loads(line) for line in (run_dir / "chunks.jsonl").read_text().splitlines()]
    assert any(e["type"] == "prompt_recache" for e in records[2]["cache"]["events"])


def _browser_types_a_prompt(url, tmp_path):
    from selenium.webdriver.common.by import By

    driver = _chrome()
    wait_for = _waiter(driver)

    try:
        driver.get(url)
        wait_for(lambda: "waits for your first prompt" in driver.find_element(By.ID, "status").text, "the page")
        assert driver.find_element(By.ID, "promptbar").is_displayed()
        box = driver.find_element(By.ID, "prompt")
        box.send_keys("a windmill by a canal")  # holds a 'w' and a space: typing must not walk or pause
        time.sleep(1)
        assert driver.find_element(By.ID, "chunk").text == "-" and driver.find_element(By.ID, "pause").text == "Pause"
        box.send_keys("\n")
        wait_for(lambda: driver.find_element(By.ID, "chunk").text.isdigit() and int(driver.find_element(By.ID, "chunk").text) >= 1,
                 "two chunks")
        assert driver.find_element(By.ID, "action").text == "a windmill by a canal"
        driver.save_screenshot(str(tmp_path / "play-text.png"))
    finally:
        driver.quit()


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")
def test_lingbot_world_plays_in_a_browser(tmp_path):
    """``worldtrace play --preset lingbot-tiny --image ... --prompt ...``: LingBot-World runs live from the
    keys (its camera made chunk by chunk from them); the page draws its frames and the attention panel
    (no ground truth); the recording's trajectory holds the walk and its summary the prompt."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    image = Path(__file__).resolve().parents[1] / "assets" / "images" / "mg2_universal_0000.png"
    runs = tmp_path / "runs"
    proc, url = start_server(runs, "--preset", "lingbot-tiny", "--image", str(image), "--prompt", "a quiet plaza",
                             "--cache", "sink")
    try:
        driver = _chrome()
        wait_for = _waiter(driver)
        try:
            driver.get(url)
            wait_for(lambda: "waits for your first key" in driver.find_element(By.ID, "status").text, "the page")
            assert driver.find_element(By.ID, "truthpanel").is_displayed() is False
            ActionChains(driver).key_down("w").perform()
            wait_for(lambda: driver.find_element(By.ID, "chunk").text.isdigit()
                     and int(driver.find_element(By.ID, "chunk").text) >= 1, "two chunks while W is held")
            ActionChains(driver).key_up("w").perform()
            assert driver.find_element(By.ID, "action").text.startswith("forward")
            for canvas in ("gen0", "attn0"):
                drawn = (f"const c = document.getElementById('{canvas}'); const d = c.getContext('2d')"
                         ".getImageData(0, 0, c.width, c.height).data; let s = 0; for (const v of d) s += v; return s;")
                wait_for(lambda: driver.execute_script(drawn) > 0, f"the {canvas} canvas drawn")
            driver.save_screenshot(str(tmp_path / "play-lingbot.png"))
        finally:
            driver.quit()
    finally:
        rc, err = stop_server(proc)
    assert rc == 0, err[-2000:]
    (run_dir,) = [p for p in runs.iterdir() if (p / "summary.json").is_file()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["config"]["preset"]["architecture"] == "lingbot" and summary["config"]["prompt"] == "a quiet plaza"
    assert summary["totals"]["chunks"] >= 2 and "forward" in (run_dir / "trajectory.yaml").read_text()
