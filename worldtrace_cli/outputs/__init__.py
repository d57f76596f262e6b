"""Run outputs: the streaming MP4 (:mod:`worldtrace_cli.outputs.video`), per-chunk JSONL records and summary
JSON (:mod:`worldtrace_cli.outputs.files`), re-exported here as one namespace.

Everything is written so that a run killed at any moment leaves valid files: the video is
fragmented MP4 encoded by a separate ffmpeg process, JSONL records are fsync'ed one by one, and
JSON summaries are replaced atomically.
"""

from __future__ import annotations

from .files import (JsonlWriter, atomic_path, cache_folder, read_jsonl, read_jsonl_checked, tail_words, to_jsonable,
                    write_json_atomic, write_jsonl_atomic)
from .video import (VideoStreamWriter, concat_videos, count_video_frames, probe_video, read_video_frames,
                    truncate_video)

__all__ = ["JsonlWriter", "VideoStreamWriter", "atomic_path", "cache_folder", "concat_videos", "count_video_frames",
           "probe_video", "read_jsonl", "read_jsonl_checked", "read_video_frames", "tail_words", "to_jsonable",
           "truncate_video", "write_json_atomic", "write_jsonl_atomic"]
