"""Nothing of a user's inside -o / record= is removed or overwritten: every name a run writes (its run
files, its resume states, video.part.mp4) that worldtrace cannot prove it wrote is refused with exit 4,
naming the file, with --overwrite too; for RunFolder itself and for generate, compare, loopbench,
sessions (record / save) and resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from worldtrace_cli.errors import OutputError
from worldtrace_cli.runs import RunFolder
from worldtrace_cli.runs.folder import LEFTOVERS, MANIFEST, RUN_FILES, STATE_NAMES

ROOT = Path(__file__).resolve().parents[1]
NAMES = RUN_FILES + LEFTOVERS


def _plant(folder: Path, name: str) -> Path:
    """A user's own file at ``name`` (a folder with a file in it for a state name); returns the file."""
    target = folder / name
    if name in STATE_NAMES:
        target.mkdir(parents=True)
        mine = target / "cv.txt"
    else:
        folder.mkdir(parents=True, exist_ok=True)
        mine = target
    mine.write_text("mine")
    return mine


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_a_users_file_at_any_name_a_run_writes_is_refused_and_kept(tmp_path, name, overwrite):
    mine = _plant(tmp_path / "jobs", name)
    folder = RunFolder(tmp_path / "jobs")
    with pytest.raises(OutputError, match=rf"^{tmp_path / 'jobs' / name}: .*worldtrace replaces only what it wrote"):
        folder.prepare(overwrite=overwrite)
    with pytest.raises(OutputError):
        folder.refuse_occupied(overwrite)  # the torch-free check that commands run before a model loads
    assert mine.read_text() == "mine"
    folder.clear_state()  # a completed run's clean-up leaves it too
    assert mine.read_text() == "mine"


def test_what_worldtrace_wrote_is_replaced_with_overwrite_and_a_users_file_beside_it_stays(tmp_path):
    folder = RunFolder(tmp_path / "run").prepare(overwrite=False)
    assert json.loads((folder.path / MANIFEST).read_text())["files"] == list(NAMES)
    for name in RUN_FILES + ("video.part.mp4",):
        (folder.path / name).write_bytes(b"worldtrace's")
    (folder.state).mkdir()
    (folder.state / ".worldtrace-state").write_bytes(b"")
    (folder.state / "state.json").write_text("{}")
    (folder.path / "notes.txt").write_text("mine")  # not a name a run writes: never touched
    with pytest.raises(OutputError, match="unfinished run"):
        folder.prepare(overwrite=False)
    folder.prepare(overwrite=True)
    assert not any((folder.path / n).exists() for n in NAMES)
    assert (folder.path / "notes.txt").read_text() == "mine"


def test_a_run_folder_of_a_version_before_the_manifest_is_still_replaced(tmp_path):
    path = tmp_path / "old"
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"status": "complete", "totals": {"chunks": 1}}))
    (path / "chunks.jsonl").write_text('{"chunk": 0}\n')
    (path / "video.mp4").write_bytes(b"x")
    RunFolder(path).prepare(overwrite=True)
    assert not (path / "video.mp4").exists() and (path / MANIFEST).is_file()
    (path / "chunks.jsonl").write_text("anything\n")  # the manifest now claims the name: replaced
    RunFolder(path).prepare(overwrite=True)
    other = tmp_path / "users"
    other.mkdir()
    (other / "summary.json").write_text('{"my": "data"}')  # a user's JSON, no worldtrace run around it
    with pytest.raises(OutputError, match="summary.json: a file worldtrace did not write"):
        RunFolder(other).prepare(overwrite=True)


def _image(tmp_path: Path) -> Path:
    import numpy as np
    from PIL import Image

    path = tmp_path / "img.png"
    Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(path)
    return path


def test_generate_keeps_a_users_resume_folder_the_issue_reproduction(tmp_path):
    """The reported data loss: `generate -o jobs` with jobs/resume/cv.txt deleted cv.txt and exited 0."""
    from worldtrace_cli.cli import main

    mine = _plant(tmp_path / "jobs", "resume")
    for extra in ([], ["--overwrite"]):
        res = CliRunner().invoke(main, ["generate", "--preset", "tiny", "--image", str(_image(tmp_path)),
                                        str(ROOT / "trajectories" / "aba.yaml"), "--chunks", "1", "--no-progress",
                                        "-o", str(tmp_path / "jobs")] + extra)
        assert res.exit_code == 4, res.output
        assert "resume: a folder holding cv.txt, not a state worldtrace saved" in res.output
        assert mine.read_text() == "mine"
    assert not (tmp_path / "jobs" / "video.mp4").exists()  # refused before anything was written


@pytest.mark.parametrize("name", ["resume.old", "video.part.mp4"])
def test_generate_resume_and_compare_and_loopbench_refuse_a_users_file(tmp_path, name):
    from worldtrace_cli.cli import main

    traj = str(ROOT / "trajectories" / "aba.yaml")
    image = str(_image(tmp_path))
    # resume: a users's file in a folder given to --resume
    mine = _plant(tmp_path / "r", name)
    res = CliRunner().invoke(main, ["generate", "--resume", str(tmp_path / "r")])
    assert res.exit_code != 0 and mine.read_text() == "mine", res.output
    # compare: a user's file in one writer's sub-folder
    mine = _plant(tmp_path / "cmp" / "sliding", name)
    res = CliRunner().invoke(main, ["compare", traj, "--preset", "tiny", "--image", image, "--chunks", "1",
                                    "--cache", "sliding,landmark", "--overwrite", "-o", str(tmp_path / "cmp")])
    assert res.exit_code == 4 and "worldtrace replaces only what it wrote" in res.output, res.output
    assert mine.read_text() == "mine"


def test_compare_keeps_a_users_compare_json(tmp_path):
    from worldtrace_cli.runs.claims import remove_own_result

    path = tmp_path / "compare.json"
    path.write_text('{"mine": 1}')
    with pytest.raises(OutputError, match="compare.json: a file worldtrace did not write"):
        remove_own_result(path, "modes", "compare")
    assert path.read_text() == '{"mine": 1}'
    path.write_text('{"modes": []}')
    remove_own_result(path, "modes", "compare")
    assert not path.exists()


def test_a_session_record_folder_keeps_a_users_files(tmp_path):
    import worldtrace_cli as wt

    mine = _plant(tmp_path / "live", "resume.tmp")
    for overwrite in (False, True):
        with pytest.raises(OutputError, match="resume.tmp: a folder holding cv.txt"):
            wt.open("tiny", cache="sliding", image=_image(tmp_path), record=tmp_path / "live", overwrite=overwrite)
    assert mine.read_text() == "mine"


def test_a_read_only_output_is_refused_before_torch_loads(tmp_path):
    """A read-only mount (root ignores mode bits, not a read-only filesystem): exit 4 from the torch-free
    checks, for a folder on it and for one that would be made there."""
    import subprocess
    import sys

    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount permission)")
    try:
        (mnt / "out").mkdir()
        if subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        for out in (mnt / "out", mnt / "new" / "run"):
            code = ("import sys; from worldtrace_cli.runs import RunFolder; from worldtrace_cli.errors import OutputError\n"
                    f"try:\n    RunFolder({str(out)!r}).refuse_occupied(True)\nexcept OutputError as e:\n"
                    "    print(e); assert 'torch' not in sys.modules; sys.exit(4)\n")
            res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert res.returncode == 4 and "is not writable (a read-only filesystem" in res.stdout, res.stdout + res.stderr
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
