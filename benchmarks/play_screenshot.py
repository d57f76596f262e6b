"""The README's picture of ``worldtrace play`` (docs/play.png), made the way a person makes it: a real
server, Debian's Chromium driven by Selenium, landmark with *compare with* sliding, the look_back walk
(turn right to B, look at it, turn away, come back, look again), then a hovered cache slot.

    python benchmarks/play_screenshot.py docs/play.png [--preset loopworld] [--cache landmark]

Needs chromium and chromium-driver (apt-get install chromium chromium-driver). Takes a few minutes on
a CPU (each step is one chunk of two writers). Prints the slot tables it saw.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# (key held, chunks): look_back.yaml's walk, keys instead of a trajectory file
WALK = [("ARROW_RIGHT", 2), ("q", 1), ("ARROW_LEFT", 4), ("ARROW_RIGHT", 4), ("q", 3)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--preset", default="loopworld")
    parser.add_argument("--cache", default="landmark")
    parser.add_argument("--compare", default="sliding")
    parser.add_argument("--width", type=int, default=1500)
    parser.add_argument("--height", type=int, default=1400)
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    runs = tempfile.mkdtemp(prefix="play-screenshot-")
    server = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "play", "--port", "0", "--runs-dir", runs,
                               "--preset", args.preset, "--cache", args.cache, "--no-record"],
                              stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={args.width},{args.height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)

    def wait_for(predicate, what, timeout=600):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise SystemExit(f"timed out waiting for {what}")

    def chunk() -> int:
        text = driver.find_element(By.ID, "chunk").text
        return int(text) if text.isdigit() else -1

    try:
        driver.get(url)
        wait_for(lambda: "waits for your first key" in driver.find_element(By.ID, "status").text, "the page")
        Select(driver.find_element(By.ID, "compare")).select_by_value(args.compare)
        wait_for(lambda: driver.find_element(By.ID, "lane1panel").is_displayed(), "the second writer")
        done = 0
        for key, count in WALK:
            held = getattr(Keys, key, key)
            ActionChains(driver).key_down(held).perform()
            target = done + count - 1
            wait_for(lambda: chunk() >= target, f"chunk {target}")
            ActionChains(driver).key_up(held).perform()
            done += count
        ActionChains(driver).send_keys(" ").perform()  # pause: the last chunk stays on screen
        time.sleep(2)
        row = driver.find_elements(By.CSS_SELECTOR, "#slots0 tr")[0]
        ActionChains(driver).move_to_element(row).perform()
        wait_for(lambda: (driver.find_element(By.ID, "previewgen").get_attribute("src") or "").startswith("data:"),
                 "the hovered slot's frame")
        time.sleep(1)
        driver.save_screenshot(args.out)
        for lane in (0, 1):
            print(f"lane {lane + 1}:\n{driver.find_element(By.ID, f'slots{lane}').text}")
    finally:
        driver.quit()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
        shutil.rmtree(runs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
