"""How `worldtrace play` feels: key-to-frame latency and displayed fps, measured in a real browser.

Starts `worldtrace play` (its own process), opens the page in headless Chromium (Debian's chromium
and chromium-driver, through Selenium), holds W, then alternates W and D every ``--switch`` seconds
for ``--seconds`` of play, and reads what the page itself measured: per key change the seconds
from the key event to the first frame drawn of a chunk generated with it (the HUD's "key to
frame"), displayed frames in each second, and the server's seconds per chunk. Writes a JSON file and
prints its path.

    python benchmarks/play_latency.py --seconds 60 -o benchmarks/results/play-cpu-2026-11-27/loopworld.json
    python benchmarks/play_latency.py --device cuda --preset mg2-universal -o gpu.json \\
        -- --random-weights --compile reduce-overhead   # on a GPU (needs chromium there too)

Targets (issue 38): the next chunk on screen within 1.5 chunk-times of the key, >= 12 fps displayed.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds of play measured (after the first chunk)")
    ap.add_argument("--switch", type=float, default=1.7, help="seconds between key changes")
    ap.add_argument("--cache", default="landmark")
    ap.add_argument("--preset", default="loopworld")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("extra", nargs="*", help="more `worldtrace play` flags (after --)")
    args = ap.parse_args(argv)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    runs = tempfile.mkdtemp(prefix="play-bench-")
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "play", "--port", "0", "--runs-dir", runs,
                             "--preset", args.preset, "--cache", args.cache, "--device", args.device, *args.extra],
                            stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(url)
        while not driver.find_element(By.ID, "chunk").text.isdigit():
            time.sleep(0.1)
        driver.execute_script("S.latencies = []; S.fpsSamples = []; S.serverTimes = [];")
        keys, i, end = ("w", "d"), 0, time.time() + args.seconds
        ActionChains(driver).key_down(keys[0]).perform()
        while time.time() < end:
            time.sleep(args.switch)
            ActionChains(driver).key_up(keys[i % 2]).key_down(keys[(i + 1) % 2]).perform()
            i += 1
        result = driver.execute_script("return {latencies: S.latencies, fps: S.fpsSamples, server: S.serverTimes, "
                                       "chunk: +$('chunk').textContent}")
    finally:
        driver.quit()
        proc.send_signal(2)
        proc.wait(timeout=120)
    chunks = [json.loads(line) for p in Path(runs).glob("*/chunks.jsonl") for line in p.read_text().splitlines()]
    # the model's phases per chunk (denoise, context, cache, decode), the first chunk left out
    per_chunk = [sum(v for k, v in r["timings_s"].items() if k != "decode_wait") for r in chunks[1:]]
    chunk_s = statistics.median(per_chunk) if per_chunk else None
    lat = sorted(result["latencies"])
    report = {
        "what": "worldtrace play: key-to-frame latency and displayed fps in headless Chromium",
        "preset": args.preset, "cache": args.cache, "device": args.device, "extra": args.extra,
        "machine": {"cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
        "seconds_measured": args.seconds, "key_changes": len(lat), "chunks": result["chunk"] + 1,
        "chunk_seconds_median": chunk_s,
        "latency_s": {"median": statistics.median(lat) if lat else None,
                      "p90": lat[int(0.9 * (len(lat) - 1))] if lat else None, "max": max(lat) if lat else None},
        "latency_in_chunk_times_median": (statistics.median(lat) / chunk_s) if lat and chunk_s else None,
        # the whole step as the page waits for it: the model, truth, metrics, recording, JPEG encoding
        "server_seconds_median": statistics.median(result["server"][1:]) if len(result["server"]) > 1 else None,
        "displayed_fps": {"median": statistics.median(result["fps"]) if result["fps"] else None,
                          "mean": statistics.fmean(result["fps"]) if result["fps"] else None},
        "latencies": [round(v, 3) for v in result["latencies"]], "fps_per_second": result["fps"],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    shutil.rmtree(runs, ignore_errors=True)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
