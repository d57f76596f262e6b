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

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def start_server(runs, *args):
    """``worldtrace play --port 0`` in its own process; returns (process, base URL from its stdout)."""
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "play", "--port", "0", "--runs-dir", str(runs),
                             "--device", "cpu", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise AssertionError(f"no URL on stdout: {url!r}; stderr: {proc.stderr.read()[-2000:]}")
    return proc, url


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
    run_dir = runs / ready["lanes"][0]["run_dir"]
    deadline = time.time() + 60  # the page disconnected: its session closes its recording
    while not (run_dir / "summary.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == 5
    records = [json.loads(line) for line in (run_dir / "chunks.jsonl").read_text().splitlines()]
    assert [r["frames_sha256"] for r in records] == [c["lanes"][0]["frames_sha256"] for c in chunks]
    assert "camera_l+back" in (run_dir / "trajectory.yaml").read_text()


@pytest.mark.parametrize("message, reply", [
    ("not json at all", "not JSON"),
    (json.dumps([1, 2]), "JSON object with an \"op\""),
    (json.dumps({"op": "fly"}), "unknown op 'fly'"),
    (json.dumps({"op": "step", "action": "jump"}), "'jump' is not valid in universal mode"),
    (json.dumps({"op": "step", "action": ["forward"]}), "\"action\" is action words"),
    (json.dumps({"op": "writer", "cache": "../../etc"}), "unknown writer"),
    (json.dumps({"op": "step", "action": "x" * 20000}), "the limit is 4096"),
])
def test_bad_messages_get_one_line_and_the_server_keeps_serving(server, message, reply):
    import aiohttp

    url, _ = server

    async def drive():
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "ws") as ws:
            assert (await _receive(ws))["op"] == "ready"
            await ws.send_str(message)
            error = await _receive(ws)
            await ws.send_bytes(b"\x00\x01")
            binary = await _receive(ws)
            await ws.send_str(json.dumps({"op": "step", "action": "forward"}))
            return error, binary, await _receive(ws)

    error, binary, chunk = run(drive())
    assert error["op"] == "error" and reply in error["message"] and "\n" not in error["message"]
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
    import aiohttp

    proc, url = start_server(tmp_path, "--cache", "sliding", "--metrics", "none")

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
    summary = json.loads((tmp_path / ready["lanes"][0]["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == 2


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run installs them)")
def test_a_browser_walks_and_the_cache_panel_follows(server, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    url, _ = server
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)

    def wait_for(predicate, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; status: {driver.find_element(By.ID, 'status').text}")

    def chunk():
        text = driver.find_element(By.ID, "chunk").text
        return int(text) if text.isdigit() else -1

    try:
        driver.get(url)
        wait_for(lambda: chunk() >= 0, "the first chunk")
        canvas_sum = "const c = document.getElementById('gen0'); const d = c.getContext('2d')" \
                     ".getImageData(0, 0, c.width, c.height).data; let s = 0; for (const v of d) s += v; return s;"
        wait_for(lambda: driver.execute_script(canvas_sum) > 0, "a drawn frame")
        before = driver.find_element(By.ID, "slots0").text
        ActionChains(driver).key_down("w").perform()
        seen = chunk()
        wait_for(lambda: chunk() >= seen + 2, "two chunks while W is held")
        assert "W" in [k.text for k in driver.find_elements(By.CSS_SELECTOR, ".key.on")]
        assert driver.find_element(By.ID, "action").text == "forward"
        ActionChains(driver).key_up("w").perform()
        ActionChains(driver).drag_and_drop_by_offset(driver.find_element(By.ID, "gen0"), 120, 0).perform()
        wait_for(lambda: "camera_r" in driver.find_element(By.ID, "action").text, "a chunk turned by a mouse drag")
        after = driver.find_element(By.ID, "slots0").text
        assert after != before and "recent" in after
        wait_for(lambda: driver.find_element(By.ID, "latency").text not in ("-", ""), "a key-to-frame latency")
        driver.save_screenshot(str(tmp_path / "play.png"))
        assert (tmp_path / "play.png").stat().st_size > 10_000
    finally:
        driver.quit()


def test_play_refuses_bad_settings_before_loading(server, tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    port = server[0].rsplit(":", 1)[1].strip("/")
    (tmp_path / "a-file").write_text("")
    for args, code, message in ((["--preset", "lingbot-tiny"], 2, "LingBot-World runs with worldtrace generate"),
                                (["--preset", "tiny"], 2, "needs --image"),
                                (["--cache", "nope"], 2, "nope"),
                                (["--port", port], 4, f"--port {port}: cannot listen"),
                                (["--runs-dir", str(tmp_path / "a-file")], 4, "a-file")):
        out = subprocess.run([sys.executable, "-m", "worldtrace_cli", "play", "--runs-dir", str(tmp_path), *args],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == code and message in out.stderr and out.stdout == "", out.stderr
        assert "loading" not in out.stderr  # refused before the model loads
