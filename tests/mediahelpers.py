"""Real audio and video files for the media tests, encoded with PyAV (FFmpeg) on the fly.

``tone(...)`` is a known signal (a sine per channel, a different frequency each) so a decode can be
checked against it; ``encode_audio``/``encode_video`` write it with a real encoder into bytes.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

# container format and codec for each extension the tests use
AUDIO_FORMATS = {
    "wav": ("wav", "pcm_s16le"),
    "flac": ("flac", "flac"),
    "ogg": ("ogg", "libvorbis"),  # replaced by FFmpeg's own "vorbis" where libvorbis is absent
    "opus": ("ogg", "libopus"),
    "mp3": ("mp3", "libmp3lame"),
    "m4a": ("mp4", "aac"),
}
VIDEO_FORMATS = {
    "mp4": ("mp4", "libx264"),
    "mkv": ("matroska", "mpeg4"),
    "webm": ("webm", "libvpx"),
    "avi": ("avi", "mpeg4"),
}


def has_encoder(name: str) -> bool:
    import av

    try:
        av.codec.Codec(name, "w")
    except Exception:
        return False
    return True


def audio_codec(ext: str, channels: int = 2) -> tuple[str, str]:
    """The (container format, encoder) for ``ext``: FFmpeg's own Vorbis encoder writes only stereo,
    so mono ``ogg`` is Opus where libvorbis is absent."""
    fmt, codec = AUDIO_FORMATS[ext]
    if codec == "libvorbis" and not has_encoder(codec):
        codec = "vorbis" if channels == 2 else "libopus"
    return fmt, codec


def tone(seconds: float, rate: int, channels: int = 1, freq: float = 440.0) -> np.ndarray:
    """``(channels, samples)`` float32 sines at half amplitude, channel ``c`` at ``freq * (c + 1)``."""
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([0.5 * np.sin(2 * np.pi * freq * (c + 1) * t) for c in range(channels)]).astype(np.float32)


def encode_audio(ext: str, seconds: float = 1.0, rate: int = 16000, channels: int = 1, signal: np.ndarray | None = None) -> bytes:
    """``signal`` (default: ``tone``) encoded as a real ``ext`` file."""
    import av

    samples = tone(seconds, rate, channels) if signal is None else signal
    fmt, codec = audio_codec(ext, samples.shape[0])
    layout = {1: "mono", 2: "stereo"}[samples.shape[0]]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate if codec != "libopus" else 48000)
        stream.layout = layout
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}
        if codec == "pcm_s16le":
            stream.format = "s16"
        resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=stream.rate)
        frame_size = stream.codec_context.frame_size or 1024
        pts = 0
        for start in range(0, samples.shape[1], frame_size):
            chunk = np.ascontiguousarray(samples[:, start:start + frame_size])
            frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            frame.sample_rate = rate
            frame.pts = pts
            frame.time_base = Fraction(1, rate)
            pts += chunk.shape[1]
            for resampled in resampler.resample(frame):
                out.mux(stream.encode(resampled))
        for resampled in resampler.resample(None):
            out.mux(stream.encode(resampled))
        out.mux(stream.encode(None))
    return buf.getvalue()


def video_frames(frames: int, height: int, width: int) -> np.ndarray:
    """``(frames, height, width, 3)`` uint8: frame ``i`` is flat grey ``level(i)`` with a white bar
    whose position moves with ``i``, so a decoded frame can be told apart by its mean."""
    out = np.zeros((frames, height, width, 3), dtype=np.uint8)
    for i in range(frames):
        out[i] = frame_level(i, frames)
    return out


def frame_level(i: int, frames: int) -> int:
    return 16 + (200 * i) // max(1, frames - 1)


def encode_video(ext: str, frames: int = 24, fps: int = 12, height: int = 48, width: int = 64,
                 audio: bool = False, gop: int | None = None) -> bytes:
    """``frames`` frames of ``video_frames`` at ``fps`` as a real ``ext`` file (optionally with a tone)."""
    import av

    fmt, codec = VIDEO_FORMATS[ext]
    pixels = video_frames(frames, height, width)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if gop is not None:  # a key frame every gop frames (seeking lands on them)
            stream.codec_context.gop_size = gop
        if codec == "libx264":
            stream.options = {"crf": "10", "preset": "ultrafast"}
        else:
            stream.bit_rate = 2_000_000
        sound = out.add_stream("aac" if fmt == "mp4" else "libopus" if fmt == "webm" else "mp2", rate=48000) if audio else None
        if sound is not None:
            sound.layout = "stereo"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(pixels[i], format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        if sound is not None:
            samples = tone(frames / fps, 48000, 2)
            resampler = av.AudioResampler(format=sound.format.name, layout="stereo", rate=48000)
            size = sound.codec_context.frame_size or 1024
            for start in range(0, samples.shape[1], size):
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + size]), format="fltp", layout="stereo")
                frame.sample_rate, frame.pts, frame.time_base = 48000, start, Fraction(1, 48000)
                for r in resampler.resample(frame):
                    out.mux(sound.encode(r))
            out.mux(sound.encode(None))
    return buf.getvalue()


def mp3_with_cover(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """An MP3 with cover art (an ID3 picture: a PNG "video" stream marked as an attached picture)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp3") as out:
        sound = out.add_stream("libmp3lame", rate=rate)
        sound.layout = "mono"
        picture = out.add_stream("png")
        picture.width, picture.height, picture.pix_fmt = 8, 8, "rgb24"
        picture.disposition = av.stream.Disposition.attached_pic
        image = av.VideoFrame.from_ndarray(np.zeros((8, 8, 3), dtype=np.uint8), format="rgb24")
        image.pts, image.time_base = 0, Fraction(1, 1)
        for packet in picture.encode(image) + picture.encode(None):
            out.mux(packet)
        resampler = av.AudioResampler(format=sound.format.name, layout="mono", rate=rate)
        frame = av.AudioFrame.from_ndarray(tone(seconds, rate), format="fltp", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for resampled in resampler.resample(frame):
            out.mux(sound.encode(resampled))
        out.mux(sound.encode(None))
    return buf.getvalue()


def wav_file(fmt: bytes, data: bytes) -> bytes:
    """A RIFF WAV of the ``fmt`` chunk body ``fmt`` (``struct.pack("<HHIIHH", tag, channels, rate,
    byte_rate, block_align, bits)``) and the sample bytes ``data``, written by hand: any header."""
    import struct

    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wave64_file(fmt: bytes, data: bytes) -> bytes:
    """``fmt`` and ``data`` as Sony Wave64 (GUIDs for chunk ids, 64-bit sizes): a WAV that FFmpeg
    (PyAV) decodes and numpy does not."""
    import struct

    tail = bytes.fromhex("f3acd3118cd100c04f8edb8a")

    def chunk(tag: bytes, body: bytes) -> bytes:
        return tag + tail + struct.pack("<Q", 24 + len(body)) + body + bytes(-len(body) % 8)

    body = b"wave" + tail + chunk(b"fmt ", fmt) + chunk(b"data", data)
    return b"riff" + bytes.fromhex("2e91cf11a5d628db04c10000") + struct.pack("<Q", 24 + len(body)) + body
