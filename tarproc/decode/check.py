"""Decode checks: every image, audio and video field decoded in full, and each one that fails named.

``tarshow --summary --decode`` and ``--report --decode`` use it: the summary reads headers only,
so a JPEG with garbage inside its scan, or a FLAC whose frames are damaged, passes it. Here:

- JPEG: libjpeg-turbo (``tarproc._jpeg``; simplejpeg where it is not built) reads every scan at
  1/8 scale. The entropy-coded data is read whole at any scale, and libjpeg's warnings ("Corrupt
  JPEG data: premature end of data segment", "N extraneous bytes before marker") are failures,
  as in training's strict decode; only the inverse DCT is cheaper. CMYK goes to Pillow.
- other images: Pillow opens and loads them (a PNG cut short or with a bad CRC fails).
- audio and video: PCM WAV by its header (the samples need no decoding); everything else by PyAV,
  every packet of the first audio and video stream decoded. FFmpeg drops a damaged audio frame
  with no error: audio that decodes to fewer samples than its headers declare (beyond encoder
  delay) fails. Without PyAV such a field is not checked (``MissingDependencyError``, said once
  by the caller).

``DecodeCheck`` runs the checks in this process (``processes=1``) or in a process pool (fork on
Linux, as ``CpuDecoder``), in batches, with a bounded number of batches in flight; results are
taken in submission order, so the list of failures is the same whatever ``processes``.

>>> import io; from PIL import Image; buf = io.BytesIO(); Image.new("RGB", (40, 30)).save(buf, "JPEG")
>>> check_field("image", buf.getvalue()) is None, check_field("image", buf.getvalue()[:200]) is not None
(True, True)
"""

from __future__ import annotations

import concurrent.futures
import io
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import MediaError, MissingDependencyError
from ..procgroup import worker_pool
from ..sniff import sniff_type
from .media import audio_stream, ffmpeg_reason, import_av, is_wav, open_container, video_stream, wav_header

_jpeg: Any
try:  # tarproc's own libjpeg-turbo binding (optional: built when libjpeg's headers are there)
    from .. import _jpeg  # type: ignore[attr-defined, no-redef]
except ImportError:  # pragma: no cover - depends on the build
    _jpeg = None

KINDS = ("image", "media")
MAX_LISTED = 1000  # failures listed one by one; the rest are counted
BATCH_ITEMS = 16  # fields per job sent to a worker
BATCH_BYTES = 4 << 20  # or fewer, when they are big
UNCHECKED = "\0unchecked"  # a worker's answer for a field it could not check (no PyAV): not a failure
_JPEG_MAGIC = b"\xff\xd8\xff"
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, KeyError, MemoryError)


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def check_image(data: bytes) -> str | None:
    """Why the image ``data`` does not decode, or None when it decodes cleanly."""
    if not data:
        return "no data (an empty field)"
    if data[:3] == _JPEG_MAGIC:
        reason = _check_jpeg(data)
        if reason != "cmyk":
            return reason
    return _check_pillow(data)


def _check_jpeg(data: bytes) -> str | None:
    """libjpeg's verdict, or ``"cmyk"`` for the colour spaces it leaves to Pillow."""
    if _jpeg is not None:
        try:
            width, height, _ = _jpeg.read_header(data)
            got = _jpeg.decode_region(data, 0, 0, (width + 7) // 8, (height + 7) // 8, 8, 1, 3)
        except ValueError as e:
            return _one_line(f"libjpeg: {e}")
        return "cmyk" if got is None else None
    import simplejpeg

    try:
        _, _, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        if colorspace in ("CMYK", "YCCK"):
            return "cmyk"
        # strict (the default): libjpeg's warnings are errors
        simplejpeg.decode_jpeg(data, min_height=1, min_width=1, min_factor=8, strict=True)
    except (ValueError, KeyError) as e:  # simplejpeg raises KeyError for some damaged headers
        return _one_line(f"libjpeg: {e}" if str(e) else "libjpeg: damaged JPEG data")
    return None


def _check_pillow(data: bytes) -> str | None:
    from PIL import Image, UnidentifiedImageError

    from ..imaging import PILLOW_MODULES

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=PILLOW_MODULES)
            with Image.open(io.BytesIO(data)) as img:
                img.load()
    except UnidentifiedImageError:
        kind = sniff_type(data[:512])
        return f"not an image Pillow reads (the data looks like {kind})"
    except (*_PIL_ERRORS, Image.DecompressionBombError) as e:
        return _one_line(f"Pillow: {e}" if str(e) else f"Pillow: {type(e).__name__}")
    return None


def check_media(data: bytes) -> str | None:
    """Why the audio or video ``data`` does not decode, or None; ``MissingDependencyError`` when it
    needs PyAV and PyAV is not installed."""
    if not data:
        return "no data (an empty field)"
    if is_wav(data):
        try:
            header = wav_header(data)  # a data chunk that declares more than is there, a bad fmt chunk
        except MediaError as e:
            return str(e)
        if header.is_pcm:
            return None  # samples as stored: nothing to decode
    av = import_av()
    frames = samples = 0
    try:
        with open_container(data) as container:
            audio = audio_stream(container)
            streams = [s for s in (audio, video_stream(container)) if s is not None]
            if not streams:
                return "no audio or video stream FFmpeg can decode"
            for packet in container.demux(streams):
                for frame in packet.decode():
                    frames += 1
                    if packet.stream is audio:
                        samples += frame.samples
            declared = _declared_samples(container, audio) if audio is not None else None
    except MediaError as e:
        return str(e)
    except av.FFmpegError as e:
        return _one_line(f"FFmpeg: {ffmpeg_reason(e)}" + (f" (after {frames} frames)" if frames else ""))
    except (ValueError, OSError, EOFError) as e:
        return _one_line(f"cannot decode: {e}")
    if not frames:
        return "no frame decodes"
    # FFmpeg drops a damaged audio frame with a line in its log, not an error: the samples missing
    # from what the headers declare say so (beyond 1% or 1024 samples: encoder delay and padding)
    if declared is not None and declared - samples > max(0.01 * declared, 1024):
        return f"{samples} of the {declared} audio samples its headers declare decode: damaged frames dropped"
    return None


def _declared_samples(container: Any, stream: Any) -> int | None:
    """The audio samples the headers declare (duration times rate), or None where they don't say."""
    rate = stream.codec_context.sample_rate
    if not rate:
        return None
    if stream.duration and stream.time_base:
        return round(float(stream.duration * stream.time_base) * rate)
    if container.duration and container.duration > 0:
        return round(container.duration / 1_000_000 * rate)
    return None


def check_field(kind: str, data: bytes) -> str | None:
    """``check_image`` or ``check_media`` by ``kind`` (``"image"`` or ``"media"``)."""
    return check_image(data) if kind == "image" else check_media(data)


def _answer(kind: str, data: bytes) -> str | None:
    try:
        return check_field(kind, data)
    except MissingDependencyError as e:
        return UNCHECKED + str(e)


def _check_batch(jobs: list[tuple[str, bytes]]) -> list[str | None]:
    return [_answer(kind, data) for kind, data in jobs]


class DecodeCheck:
    """Decodes fields as they are added and keeps what failed: counts per kind, the failures in the
    order the fields came (``MAX_LISTED`` of them, with the ``tarfirst`` command), the count of
    those not checked (``note`` says why). ``on_failure(url, key, field, reason, data)`` hears each
    failure. Call ``finish`` (waits for the pool) and ``close``.

    >>> c = DecodeCheck()
    >>> c.add("x.tar", "a", "jpg", "image", b"\\xff\\xd8\\xff\\xe0 not really"); c.finish()
    >>> c.failed, c.failures[0]["command"]
    (1, 'tarfirst x.tar --key a -f jpg')
    """

    def __init__(self, processes: int = 1, on_failure: Callable[..., None] | None = None) -> None:
        self.processes = processes
        self.on_failure = on_failure
        self.checked = {kind: 0 for kind in KINDS}
        self.failed = 0
        self.failures: list[dict[str, Any]] = []
        self.unchecked = 0
        self.note: str | None = None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._batch: list[tuple[str | None, str, str, str, bytes]] = []
        self._batch_bytes = 0
        self._in_flight: deque[tuple[list[Any], concurrent.futures.Future[list[str | None]]]] = deque()

    def add(self, url: str | None, key: str, field: str, kind: str, data: bytes | bytearray | memoryview) -> None:
        """Check one field (now, or in a worker: its verdict is taken in order later)."""
        data = data if type(data) is bytes else bytes(data)
        if self.processes <= 1:
            self._take(url, key, field, kind, data, _answer(kind, data))
            return
        self._batch.append((url, key, field, kind, data))
        self._batch_bytes += len(data)
        if len(self._batch) >= BATCH_ITEMS or self._batch_bytes >= BATCH_BYTES:
            self._submit()

    def _submit(self) -> None:
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch:
            return
        if self._pool is None:  # workers that leave Ctrl-C to this process, which stops the pool
            self._pool = worker_pool(self.processes)
        future = self._pool.submit(_check_batch, [(kind, data) for _, _, _, kind, data in batch])
        self._in_flight.append((batch, future))
        while len(self._in_flight) > 2 * self.processes:
            self._collect()

    def _collect(self) -> None:
        batch, future = self._in_flight.popleft()
        for (url, key, field, kind, data), answer in zip(batch, future.result(), strict=True):
            self._take(url, key, field, kind, data, answer)

    def _take(self, url: str | None, key: str, field: str, kind: str, data: bytes, answer: str | None) -> None:
        if answer is not None and answer.startswith(UNCHECKED):
            self.unchecked += 1
            self.note = answer[len(UNCHECKED):]
            return
        self.checked[kind] += 1
        if answer is None:
            return
        self.failed += 1
        if len(self.failures) < MAX_LISTED:
            from ..content import tarfirst_command

            self.failures.append({"key": key, "field": field, "url": url, "kind": kind, "reason": answer,
                                  "command": tarfirst_command(url, key, field)})
        if self.on_failure is not None:
            self.on_failure(url, key, field, answer, data)

    def finish(self) -> None:
        """Check what is still queued and wait for every verdict."""
        self._submit()
        while self._in_flight:
            self._collect()
        self.close()

    def close(self) -> None:
        """Stop the workers (after ``finish``, or on an error: what is in flight is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def as_dict(self) -> dict[str, Any]:
        return {"checked": dict(self.checked), "failed": self.failed, "failures": list(self.failures),
                "not_listed": self.failed - len(self.failures), "unchecked": self.unchecked, "note": self.note}


__all__ = ["MAX_LISTED", "DecodeCheck", "check_field", "check_image", "check_media"]
