"""Decoding generated chunks in order, at once or overlapped with the next chunk's generation."""

from __future__ import annotations

import time

import torch

from .record import decode_record
from .rollout import ChunkOutput


class DecodePipeline:
    """Decodes generated chunks in order with a streaming VAE decoder, either at once or one chunk
    behind generation so that chunk c's decode overlaps chunk c+1's DiT work.

    Overlap runs the decode on a side CUDA stream (waiting on the main stream's work so far; frames
    come back through pinned memory) on CUDA, and on a single worker thread on CPU. The decoder is
    stateful (causal feature cache), so chunks are always decoded in submission order, by one
    stream or thread. :meth:`flush` waits for everything submitted: call it before reading or
    loading the decoder's state (resume states) and at the end. Build the pipeline after restoring
    a decoder state: the restored tensors were made on the main stream, and the first side-stream
    decode marks them as used there, so the allocator does not hand their memory to the next
    chunk's DiT while the decode still reads them.

    Each returned :class:`ChunkOutput` has ``frames`` (uint8 [T, H, W, 3] on the CPU), its record's
    ``memory`` re-read after the decode (peak GPU bytes include it), and in ``timings_s``: ``decode`` (seconds the decode itself took: side-stream CUDA events or
    the worker's wall clock) and with overlap ``decode_wait`` (seconds generation waited for it:
    the part of the decode on the critical path).

    Args:
        decoder: a :class:`~worldtrace_cli.model.vae.StreamingDecoder`.
        device: the device generation runs on.
        overlap: decode one chunk behind (True) or at submission (False).
    """

    def __init__(self, decoder, device: torch.device, overlap: bool = False):
        self.decoder, self.device, self.overlap = decoder, torch.device(device), overlap
        self._pending: list = []
        self._stream = self._pool = None
        self._state_marked = False
        if overlap and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        elif overlap:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldtrace-decode")

    def _decode_timed(self, latents: torch.Tensor):
        start = time.perf_counter()
        frames = self.decoder.decode(latents)
        return frames, time.perf_counter() - start

    def _launch(self, out: ChunkOutput):
        if self._stream is None:
            return self._pool.submit(self._decode_timed, out.latents)
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)  # the latents (and a restored decoder state) are ready
        if not self._state_marked:  # a restored feature cache was allocated on the main stream
            for t in self.decoder.state()["cache"]:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(self._stream)
            self._state_marked = True
        with torch.cuda.stream(self._stream):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            pixels = self.decoder.decode_pixels(out.latents)
            host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(pixels, non_blocking=True)
            end.record()
        out.latents.record_stream(self._stream)  # the allocator must not reuse them under the decode
        return host, pixels, begin, end

    def _collect(self, out: ChunkOutput, handle) -> ChunkOutput:
        start = time.perf_counter()
        if self._stream is None:
            out.frames, seconds = handle.result()
        else:
            host, _pixels, begin, end = handle
            end.synchronize()
            out.frames, seconds = host, begin.elapsed_time(end) / 1000.0
        decode_record(out.record, seconds, self.device, wait=time.perf_counter() - start)
        return out

    def submit(self, out: ChunkOutput) -> list[ChunkOutput]:
        """Queue ``out`` (its ``latents`` [1, 16, F, h, w]) for decoding; returns the chunks whose
        frames are ready, oldest first (without overlap: ``out`` itself; with: the previous chunk)."""
        if not self.overlap:
            out.frames, seconds = self._decode_timed(out.latents)
            decode_record(out.record, seconds, self.device)
            return [out]
        self._pending.append((out, self._launch(out)))
        ready = []
        while len(self._pending) > 1:
            ready.append(self._collect(*self._pending.pop(0)))
        return ready

    def flush(self) -> list[ChunkOutput]:
        """Wait for every queued chunk; returns them with their frames, oldest first."""
        ready = [self._collect(*item) for item in self._pending]
        self._pending.clear()
        return ready

    def close(self) -> None:
        """Drop what is still queued (after a failure) and stop the worker thread."""
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
