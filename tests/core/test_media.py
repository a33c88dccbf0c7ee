"""tarproc.decode.media: probe() and poster_frame() on real files encoded with PyAV, and on damaged data."""

from __future__ import annotations

import io
import random
import struct
import sys

import numpy as np
import pytest
from mediahelpers import AUDIO_FORMATS, VIDEO_FORMATS, audio_codec, encode_audio, encode_video, frame_level, has_encoder

from tarproc.decode.media import (
    AUDIO_EXTENSIONS,
    VIDEO_EXTENSIONS,
    MediaInfo,
    media_kind,
    poster_frame,
    probe,
    wav_header,
)
from tarproc.errors import MediaError, MissingDependencyError, OptionError, TarprocError

pytest.importorskip("av")

CODECS = {"wav": "pcm_s16le", "flac": "flac", "ogg": "vorbis", "opus": "opus", "mp3": "mp3", "m4a": "aac"}


def test_extensions_and_kinds() -> None:
    assert AUDIO_EXTENSIONS == {"wav", "flac", "ogg", "oga", "opus", "mp3", "m4a", "aac"}
    assert VIDEO_EXTENSIONS == {"mp4", "m4v", "webm", "mkv", "mov", "avi"}
    assert media_kind("a.b.WAV") == "audio" and media_kind("clip.mp4") == "video" and media_kind("txt") is None
    assert MediaInfo._fields == ("kind", "codec", "duration", "sample_rate", "channels", "fps", "width", "height")
    assert issubclass(MediaError, TarprocError) and issubclass(MissingDependencyError, OptionError)


@pytest.mark.parametrize("ext", sorted(AUDIO_FORMATS))
@pytest.mark.parametrize("channels", [1, 2])
def test_probe_audio(ext: str, channels: int) -> None:
    encoder = audio_codec(ext, channels)[1]
    if not has_encoder(encoder):
        pytest.skip(f"this FFmpeg build has no {encoder} encoder")
    info = probe(encode_audio(ext, seconds=1.5, rate=16000, channels=channels))
    assert info.kind == "audio"
    assert info.codec == ("opus" if encoder == "libopus" else CODECS[ext])
    assert info.sample_rate == (48000 if encoder == "libopus" else 16000)  # Opus always runs at 48 kHz
    assert info.channels == channels
    assert info.duration == pytest.approx(1.5, abs=0.08)  # encoders add a little priming/padding
    assert info.fps is None and info.width is None and info.height is None


@pytest.mark.parametrize("ext", sorted(VIDEO_FORMATS))
def test_probe_video(ext: str) -> None:
    if not has_encoder(VIDEO_FORMATS[ext][1]):
        pytest.skip(f"this FFmpeg build has no {VIDEO_FORMATS[ext][1]} encoder")
    info = probe(encode_video(ext, frames=30, fps=15, height=48, width=80))
    assert info == MediaInfo("video", {"mp4": "h264", "webm": "vp8"}.get(ext, "mpeg4"), info.duration, None, None,
                             15.0, 80, 48)
    assert info.duration == pytest.approx(2.0, abs=0.05)
    with_sound = probe(encode_video(ext, frames=12, fps=12, audio=True))
    assert with_sound.kind == "video" and with_sound.sample_rate == 48000 and with_sound.channels == 2


def _wav(fmt: bytes, data: bytes, declared: int | None = None, extra: bytes = b"", riff: bytes = b"RIFF") -> bytes:
    size = len(data) if declared is None else declared
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra + b"data" + struct.pack("<I", size) + data
    return riff + struct.pack("<I", len(body)) + body


def test_wav_header_variants() -> None:
    pcm16 = struct.pack("<HHIIHH", 1, 2, 8000, 32000, 4, 16)
    assert probe(_wav(pcm16, bytes(16000))) == MediaInfo("audio", "pcm_s16le", 0.5, 8000, 2, None, None, None)
    u8 = struct.pack("<HHIIHH", 1, 1, 11025, 11025, 1, 8)
    assert probe(_wav(u8, bytes(11025))).codec == "pcm_u8"
    f32 = struct.pack("<HHIIHH", 3, 1, 1000, 4000, 4, 32)
    assert probe(_wav(f32, bytes(4000))) [:3] == ("audio", "pcm_f32le", 1.0)
    # WAVE_FORMAT_EXTENSIBLE: the codec is in the sub-format GUID (here: PCM, 24 bits)
    ext = struct.pack("<HHIIHHHHI", 0xFFFE, 1, 1000, 3000, 3, 24, 22, 24, 4) + struct.pack("<H", 1) + bytes(14)
    assert probe(_wav(ext, bytes(3000))).codec == "pcm_s24le"
    # an odd-sized chunk before the data is padded to an even length
    listing = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\x00"
    assert probe(_wav(pcm16, bytes(32000), extra=listing)).duration == 1.0
    # a data size never filled in (written to a pipe) runs to the end
    assert probe(_wav(pcm16, bytes(32000), declared=0xFFFFFFFF)).duration == 1.0
    assert probe(_wav(pcm16, bytes(32000), declared=0)).duration == 1.0
    # RF64: the real size is in the ds64 chunk
    ds64 = b"ds64" + struct.pack("<I", 28) + struct.pack("<QQQI", 0, 16000, 4000, 0)
    body = b"WAVE" + ds64 + b"fmt " + struct.pack("<I", 16) + pcm16 + b"data" + struct.pack("<I", 0xFFFFFFFF) + bytes(16000)
    assert probe(b"RF64" + struct.pack("<I", 0xFFFFFFFF) + body).duration == 0.5
    header = wav_header(_wav(pcm16, bytes(8)))
    assert (header.offset, header.size, header.is_pcm) == (44, 8, True)


def test_wav_needs_no_av(monkeypatch: pytest.MonkeyPatch) -> None:
    flac = encode_audio("flac")
    wav = encode_audio("wav", seconds=0.25, rate=8000)
    mp4 = encode_video("mp4", frames=2)
    monkeypatch.setitem(sys.modules, "av", None)  # import av now fails, as where PyAV is not installed
    assert probe(wav) == MediaInfo("audio", "pcm_s16le", 0.25, 8000, 1, None, None, None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tarproc\[media\]'"):
        probe(flac)
    with pytest.raises(MissingDependencyError):
        poster_frame(mp4)


@pytest.mark.parametrize(("data", "message"), [
    (b"", "no data"),
    (b"hello, this is a caption\n", "looks like text"),
    (b'{"a": 1}', "looks like json"),
    (b"\xff\xd8\xff\xe0" + bytes(100), "looks like jpeg"),
    (b"\x89PNG\r\n\x1a\n" + bytes(100), "looks like png"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt ", "cut short"),
    (b"RIFF\x04\x00\x00\x00WAVE", "cut short before its data chunk"),
    (_wav(struct.pack("<HHIIHH", 1, 0, 8000, 0, 0, 16), b""), "0 channels"),
    (b"RIFF" + struct.pack("<I", 12) + b"WAVEdata" + struct.pack("<I", 0), "before its fmt chunk"),
    (_wav(struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16), bytes(100), declared=16000), "declares 16000 bytes, 100 are present"),
])
def test_probe_bad_data(data: bytes, message: str) -> None:
    with pytest.raises(MediaError, match=message) as caught:
        probe(data)
    assert "\n" not in str(caught.value)


def test_probe_damaged_media() -> None:
    rng = random.Random(7)
    with pytest.raises(MediaError, match="cannot read the media"):
        probe(bytes(rng.getrandbits(8) for _ in range(4000)))
    mp4 = encode_video("mp4", frames=24)
    with pytest.raises(MediaError):  # PyAV writes the moov atom last: the first half has no index
        probe(mp4[: len(mp4) // 2])
    with pytest.raises(MediaError):
        probe(b"\x00\x00\x00\x18ftypisom" + bytes(40))
    with pytest.raises(MediaError):
        probe(b"fLaC" + bytes(10))
    with pytest.raises(MediaError):
        probe(b"OggS" + bytes(30))
    # an mp3 cut anywhere still has headers: probe is header-only and says what they say
    mp3 = encode_audio("mp3", seconds=2.0)
    assert probe(mp3[: len(mp3) // 2]).kind == "audio"


def test_probe_accepts_buffers() -> None:
    wav = encode_audio("wav", seconds=0.1, rate=8000)
    flac = encode_audio("flac", seconds=0.1, rate=8000)
    for data in (bytearray(wav), memoryview(wav), bytearray(flac), memoryview(flac)):
        assert probe(data).sample_rate == 8000


@pytest.mark.parametrize("ext", ["mp4", "webm", "mkv"])
def test_poster_frame(ext: str) -> None:
    video = encode_video(ext, frames=10, fps=10, height=120, width=160)
    image = poster_frame(video, max_size=64)
    assert image.mode == "RGB" and image.size == (64, 48)
    pixels = np.asarray(image, dtype=np.float64)
    assert abs(pixels.mean() - frame_level(0, 10)) < 4  # the first frame, not a later (brighter) one
    assert poster_frame(video).size == (160, 120)  # never enlarged


def test_poster_frame_errors() -> None:
    with pytest.raises(MediaError, match="no video stream"):
        poster_frame(encode_audio("flac"))
    with pytest.raises(MediaError, match="no video stream"):
        poster_frame(encode_audio("wav"))
    with pytest.raises(MediaError, match="bad max_size"):
        poster_frame(encode_video("mp4", frames=2), max_size=0)
    mp4 = encode_video("mp4", frames=24)
    with pytest.raises(MediaError):
        poster_frame(mp4[: len(mp4) // 3])
    with pytest.raises(MediaError, match="looks like text"):
        poster_frame(io.BytesIO(b"hello").getvalue())
