"""Ctrl-C (or SIGTERM) stops the test suite, its xdist workers and every process a test started, within
seconds (a stopped suite used to wait for each worker's test: over 60 s, processes left behind). A real
nested pytest run with this suite's conftest, a test holding a child in its own session."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SLOW = '''
import subprocess, sys, time
from pathlib import Path

def test_holds_a_child(tmp_path_factory):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    Path(__import__("os").environ["CHILD_PID_FILE"]).write_text(str(child.pid))
    time.sleep(600)
'''

START = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.executable, sys.argv[1:])"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().decode().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_suite_ends_its_workers_and_their_children(tmp_path, sig):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(HERE / "conftest.py", suite / "conftest.py")
    (suite / "test_slow.py").write_text(SLOW)
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "CHILD_PID_FILE": str(pid_file)}
    env.pop("PYTEST_XDIST_WORKER", None)
    # SIGINT back to its default: a process started in the background inherits it ignored
    proc = subprocess.Popen([sys.executable, "-c", START, sys.executable, "-m", "pytest", "-q", "-n", "1",
                             "-p", "no:cacheprovider", str(suite)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pid_file.exists(), "the nested suite did not start its test"
        child = int(pid_file.read_text())
        assert _alive(child)
        start = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=30)
        took = time.monotonic() - start
        assert not _alive(child), "the test's child outlived the stopped suite"
        assert took < 30  # seconds, not the test's 600 (measured: about 5 s on a 2-core CPU)
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
