"""Decode video fields to clips: N frames at a chosen rate and size, from the start or at random.

::

    from tarproc.decode.video import VideoSpec, decode_video
    spec = VideoSpec(frames=8, fps=4, size=(112, 112), random_clip=True, seed=0)
    clip = decode_video(mp4_bytes, spec, key="clip-0001")   # (8, 112, 112, 3) uint8

The exact semantics (PyAV decodes: ``pip install 'tarproc[media]'``):

- a clip is ``frames`` frames. With ``fps``, frame ``i`` is the one on screen at time
  ``start + i / fps`` (the last frame whose timestamp is not after it: a lower rate skips frames,
  a higher one repeats them); with ``fps=None``, ``frames`` consecutive stored frames from the
  ``start``-th;
- ``start`` is 0, or with ``random_clip`` drawn uniformly (a time with ``fps``, a frame index
  without) from every start that keeps the clip inside the video's duration as its headers give
  it, from ``random.Random(f"{seed}/{key}")`` with the sample's ``plan_key`` (key, plus the epoch
  after the first), as for the image plans, so a resumed run draws the same clips;
- a video shorter than the clip repeats its last frame (the frame stays on screen);
- ``size=(height, width)`` resizes each frame with FFmpeg's bilinear scaler (aspect ratio not
  kept: crop in ``map`` or on the batch if you need it); ``None`` keeps the stored size;
- values are RGB uint8, laid out ``THWC`` (default) or ``TCHW``;
- a stored frame over ``max_pixels`` is an error before anything is decoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MediaError, OptionError
from .media import ffmpeg_reason, import_av, is_wav, open_container, video_stream
from .spec import DEFAULT_MAX_PIXELS, named_parameters, plan_rng

LAYOUTS = ("THWC", "TCHW")
MAX_FRAMES = 10_000
_SEEK_AFTER = 1.0  # seconds: a later start seeks to the key frame before it rather than decoding up to it


@named_parameters
@dataclass(frozen=True)
class VideoSpec:
    """How to decode a video field (see the module docstring for the exact semantics).

    >>> VideoSpec(frames=8, fps=4, size=(64, 96)).shape(48, 64)
    (8, 64, 96, 3)
    """

    frames: int = 8
    fps: float | None = None
    size: tuple[int, int] | None = None
    random_clip: bool = False
    layout: str = "THWC"
    seed: int | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        if isinstance(self.frames, bool) or not isinstance(self.frames, int) or not 1 <= self.frames <= MAX_FRAMES:
            raise OptionError(f"bad frames {self.frames!r}; give the frames per clip, 1..{MAX_FRAMES}")
        if self.fps is not None and (isinstance(self.fps, bool) or not isinstance(self.fps, (int, float))
                                     or not math.isfinite(self.fps) or self.fps <= 0):
            raise OptionError(f"bad fps {self.fps!r}; give frames per second > 0, or None (the stored frames)")
        if self.size is not None:
            if (not isinstance(self.size, tuple) or len(self.size) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in self.size)):
                raise OptionError(f"bad size {self.size!r}; give (height, width) in pixels, or None")
            if self.size[0] * self.size[1] > self.max_pixels:
                raise OptionError(f"size {self.size} is over max_pixels {self.max_pixels:,}")
        if self.layout not in LAYOUTS:
            raise OptionError(f"bad layout {self.layout!r}; use one of {', '.join(LAYOUTS)}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise OptionError(f"bad seed {self.seed!r}; must be an integer or None")
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise OptionError(f"bad max_pixels {self.max_pixels!r}; must be >= 1")

    @property
    def random(self) -> bool:
        return self.random_clip

    def shape(self, height: int, width: int) -> tuple[int, int, int, int]:
        """The clip's shape for a video stored as ``height`` x ``width``."""
        h, w = self.size if self.size is not None else (height, width)
        return (self.frames, h, w, 3) if self.layout == "THWC" else (self.frames, 3, h, w)

    def clip_start(self, key: str, duration: float | None, stored_frames: int | None) -> float:
        """The clip's start: seconds with ``fps``, else a frame index (as a float)."""
        if not self.random_clip:
            return 0.0
        rng = plan_rng(self.seed, key)
        if self.fps is not None:
            room = (duration or 0.0) - self.frames / self.fps
            return rng.uniform(0.0, room) if room > 0 else 0.0
        room_frames = (stored_frames or 0) - self.frames
        return float(rng.randint(0, room_frames)) if room_frames > 0 else 0.0


def decode_video(data: bytes | bytearray | memoryview, spec: VideoSpec, key: str = "") -> np.ndarray:
    """The clip of the video ``data`` as ``spec`` says (``key``: the sample's plan key, for a random
    clip). Undecodable data is a ``MediaError``; without PyAV, a ``MissingDependencyError``."""
    if is_wav(data):
        raise MediaError("no video stream (the data is WAV audio)")
    av = import_av()
    with open_container(data) as container:
        stream = video_stream(container)
        if stream is None:
            raise MediaError("no video stream")
        ctx = stream.codec_context
        if ctx.width and ctx.height and ctx.width * ctx.height > spec.max_pixels:
            raise MediaError(f"video of {ctx.width}x{ctx.height} pixels is over the limit of {spec.max_pixels:,} "
                             "(max_pixels)")
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        native_fps = float(rate) if rate else None
        duration = _duration(container, stream)
        stored = stream.frames or (round(duration * native_fps) if duration and native_fps else None)
        start = spec.clip_start(key, duration, stored)
        try:
            if spec.fps is not None:
                if start > _SEEK_AFTER and stream.time_base:
                    container.seek(int(start / stream.time_base), stream=stream, backward=True)
                # a timestamp within one tick of the container's clock counts as on time (Matroska keeps ms)
                tick = float(stream.time_base) if stream.time_base else 0.0
                tolerance = min(max(tick, 1e-6), 0.25 / native_fps if native_fps else 1e-3)
                picked = _by_time(container.decode(stream), start, spec.fps, spec.frames, native_fps, tolerance)
            else:
                picked = _consecutive(container.decode(stream), int(start), spec.frames)
            if not picked:
                raise MediaError("the video has no frame that decodes")
            arrays = [_pixels(frame, spec) for frame in picked]
        except av.FFmpegError as e:
            raise MediaError(f"cannot decode the video: {ffmpeg_reason(e)}") from None
    while len(arrays) < spec.frames:  # shorter than the clip: the last frame stays on screen
        arrays.append(arrays[-1])
    clip = np.stack(arrays)
    return np.ascontiguousarray(clip.transpose(0, 3, 1, 2)) if spec.layout == "TCHW" else clip


def _duration(container: Any, stream: Any) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / 1_000_000
    return None


def _time(frame: Any, index: int, native_fps: float | None) -> float:
    if frame.time is not None:
        return float(frame.time)
    return index / native_fps if native_fps else float(index)


def _by_time(frames: Any, start: float, fps: float, count: int, native_fps: float | None, eps: float = 1e-6) -> list[Any]:
    """The frames on screen at ``start + i / fps`` for ``i`` < ``count`` (fewer at the video's end);
    a frame within ``eps`` after a wanted time counts as on screen then."""
    wanted = [start + i / fps for i in range(count)]
    out: list[Any] = []
    previous = None
    for index, frame in enumerate(frames):
        t = _time(frame, index, native_fps)
        while len(out) < count and t > wanted[len(out)] + eps:
            out.append(previous if previous is not None else frame)  # before the first frame: the first
        if len(out) == count:
            return out
        previous = frame
    if previous is not None and len(out) < count:
        out.append(previous)  # the video's last frame, on screen at the next wanted time
    return out


def _consecutive(frames: Any, start: int, count: int) -> list[Any]:
    out: list[Any] = []
    last = None
    for index, frame in enumerate(frames):
        last = frame
        if index >= start:
            out.append(frame)
            if len(out) == count:
                break
    return out or ([last] if last is not None else [])  # a start past the end (headers overstated): the last


def _pixels(frame: Any, spec: VideoSpec) -> np.ndarray:
    if spec.size is None:
        return np.asarray(frame.to_ndarray(format="rgb24"))
    height, width = spec.size
    return np.asarray(frame.reformat(width=width, height=height, format="rgb24", interpolation="BILINEAR").to_ndarray())


__all__ = ["VideoSpec", "decode_video"]
