"""tarproc.decode.media: probe() and poster_frame() on real files encoded with PyAV, and on damaged data."""

from __future__ import annotations

import io
import random
import struct
import sys
import tracemalloc
from typing import Any

import numpy as np
import pytest
from mediahelpers import (
    AUDIO_FORMATS,
    VIDEO_FORMATS,
    audio_codec,
    encode_audio,
    encode_video,
    frame_level,
    has_encoder,
    mp3_with_cover,
    wave64_file,
)

from tarproc.decode import video as video_module
from tarproc.decode.audio import AudioSpec, decode_audio
from tarproc.decode.media import (
    AUDIO_EXTENSIONS,
    VIDEO_EXTENSIONS,
    MediaInfo,
    decode_media_samples,
    media_kind,
    poster_frame,
    probe,
    wav_header,
)
from tarproc.decode.spec import plan_key
from tarproc.decode.video import VideoSpec, decode_video
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


def test_cover_art_is_not_video() -> None:
    song = mp3_with_cover(seconds=1.0)
    assert probe(song) == MediaInfo("audio", "mp3", pytest.approx(1.0, abs=0.05), 16000, 1, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(MediaError, match="no video stream"):
        poster_frame(song)
    with pytest.raises(MediaError, match="no video stream"):
        decode_video(song, VideoSpec(frames=1))
    assert decode_audio(song, AudioSpec(sample_rate=16000)).shape[1] == pytest.approx(16000, rel=0.1)


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
    (_wav(struct.pack("<HHIIHH", 1, 1, 3_000_000_000, 0, 2, 16), bytes(4)), "3000000000 Hz"),
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


# ---------------------------------------------------------------------------------------------------
# decode_audio / decode_video


def _peak(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x))
    return float(np.fft.rfftfreq(len(x), 1 / rate)[np.argmax(spectrum)])


def _check_tone(audio: np.ndarray, rate: int, freqs: list[float], rms: float = 0.5 / np.sqrt(2), tol: float = 0.05) -> None:
    """Each channel is the sine of its frequency, at the amplitude written (lossy codecs within tol)."""
    middle = audio[:, audio.shape[1] // 4: 3 * audio.shape[1] // 4]
    assert [round(_peak(c, rate)) for c in middle] == pytest.approx(freqs, abs=2)
    assert [float(np.sqrt((c ** 2).mean())) for c in middle] == pytest.approx([rms] * len(freqs), abs=tol)


@pytest.mark.parametrize("ext", sorted(AUDIO_FORMATS))
@pytest.mark.parametrize("rate", [16000, 22050, 8000])
def test_decode_audio_formats_and_rates(ext: str, rate: int) -> None:
    data = encode_audio(ext, seconds=1.0, rate=16000, channels=2)
    audio = decode_audio(data, AudioSpec(sample_rate=rate, channels=None))
    assert audio.dtype == np.float32 and audio.shape[0] == 2 and audio.flags.c_contiguous
    assert audio.shape[1] == pytest.approx(rate, rel=0.05)  # one second (encoders pad a little)
    _check_tone(audio, rate, [440, 880])


def test_decode_wav_exact_and_without_av(monkeypatch: pytest.MonkeyPatch) -> None:
    signal = np.array([[0.0, 0.5, -0.5, 1.0 - 2 ** -15, -1.0]], dtype=np.float32)
    wav = encode_audio("wav", rate=8000, signal=signal)
    monkeypatch.setitem(sys.modules, "av", None)  # the same rate needs no PyAV
    assert decode_audio(wav, AudioSpec(sample_rate=8000)).tolist() == signal.tolist()
    assert decode_audio(wav, AudioSpec(sample_rate=None, channels=2)).tolist() == [signal[0].tolist()] * 2
    with pytest.raises(MissingDependencyError, match="tarproc"):
        decode_audio(wav, AudioSpec(sample_rate=16000))  # a new rate needs the resampler


@pytest.mark.parametrize(("tag", "bits", "dtype", "scale"), [(1, 8, np.uint8, None), (1, 16, "<i2", 2 ** 15),
                                                           (1, 24, None, 2 ** 23), (1, 32, "<i4", 2 ** 31),
                                                           (1, 64, "<i8", 2 ** 63), (3, 32, "<f4", 1), (3, 64, "<f8", 1)])
def test_decode_wav_sample_formats(tag: int, bits: int, dtype: object, scale: int | None) -> None:
    values = np.array([0.0, 0.25, -0.25, -1.0, 0.5, -0.5])  # 3 frames of 2 channels
    if bits == 8:
        raw = (values * 128 + 128).astype(np.uint8).tobytes()
    elif bits == 24:
        ints = (values * scale).astype(np.int64)
        raw = b"".join(int(i).to_bytes(3, "little", signed=True) for i in ints)
    else:
        raw = (values * scale).astype(dtype).tobytes()
    fmt = struct.pack("<HHIIHH", tag, 2, 1000, 1000 * 2 * bits // 8, 2 * bits // 8, bits)
    audio = decode_audio(_wav(fmt, raw), AudioSpec(sample_rate=1000, channels=None))
    assert audio.tolist() == values.reshape(3, 2).T.tolist()


@pytest.mark.parametrize("channels", [3, 8, 10])
def test_decode_many_unnamed_channels(channels: int) -> None:
    """WAVs of channels without a layout, resampled (libswresample crashed on 8 unnamed channels)."""
    rng = np.random.default_rng(channels)
    values = (rng.uniform(-0.5, 0.5, (800, channels)) * 32767).astype("<i2")
    fmt = struct.pack("<HHIIHH", 1, channels, 8000, 8000 * 2 * channels, 2 * channels, 16)
    wav = _wav(fmt, values.tobytes())
    assert decode_audio(wav, AudioSpec(sample_rate=16000, channels=None)).shape == (channels, 1600)
    mono = decode_audio(wav, AudioSpec(sample_rate=8000, channels=1))
    assert np.allclose(mono[0], values.mean(axis=1) / 32768, atol=1e-6)
    assert decode_audio(wav, AudioSpec(sample_rate=4000, channels=2)).shape == (2, 400)


def test_decode_audio_channels() -> None:
    stereo = encode_audio("flac", seconds=0.5, rate=8000, channels=2)
    mono = decode_audio(stereo, AudioSpec(sample_rate=8000, channels=1))
    both = decode_audio(stereo, AudioSpec(sample_rate=8000, channels=None))
    assert mono.shape == (1, 4000) and np.allclose(mono[0], both.mean(axis=0), atol=1e-6)
    assert decode_audio(stereo, AudioSpec(sample_rate=8000, channels=2)).shape == (2, 4000)
    up = decode_audio(encode_audio("flac", seconds=0.5, rate=8000, channels=1), AudioSpec(sample_rate=8000, channels=2))
    assert up.shape == (2, 4000) and np.array_equal(up[0], up[1])
    with pytest.raises(MediaError, match="cannot make 3 channels from 2"):
        decode_audio(stereo, AudioSpec(sample_rate=8000, channels=3))


def test_decode_audio_crop_and_pad() -> None:
    ramp = (np.arange(1000, dtype=np.float32) / 2000)[None]  # sample i is i / 2000: the offset of a crop
    wav = encode_audio("wav", rate=1000, signal=ramp)
    head = decode_audio(wav, AudioSpec(sample_rate=1000, seconds=0.3))
    assert head.shape == (1, 300) and round(float(head[0, 0]) * 2000) == 0
    padded = decode_audio(wav, AudioSpec(sample_rate=1000, seconds=1.5))
    assert padded.shape == (1, 1500) and not padded[0, 1000:].any() and padded[0, 999] > 0.49
    spec = AudioSpec(sample_rate=1000, seconds=0.3, random_crop=True, seed=11)
    starts = {round(float(decode_audio(wav, spec, f"k{i}")[0, 0]) * 2000) for i in range(20)}
    assert len(starts) > 15 and all(0 <= s <= 700 for s in starts)  # drawn over every start that fits
    a = decode_audio(wav, spec, plan_key("k", 0))
    assert np.array_equal(a, decode_audio(wav, spec, plan_key("k", 0)))  # the same key: the same crop
    assert not np.array_equal(a, decode_audio(wav, spec, plan_key("k", 1)))  # the next epoch: a new one
    crop = decode_audio(wav, spec, "k")
    start = round(float(crop[0, 0]) * 2000)
    assert start == spec.crop_start("k", 1000) and np.allclose(crop[0], ramp[0, start:start + 300], atol=1e-4)
    # a crop of audio shorter than the clip: all of it, padded
    assert decode_audio(wav, AudioSpec(sample_rate=1000, seconds=2.0, random_crop=True, seed=1), "k").shape == (1, 2000)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sample_rate": 0}, "bad sample_rate"), ({"sample_rate": 16000.0}, "bad sample_rate"),
    ({"channels": 0}, "bad channels"), ({"seconds": -1.0}, "bad seconds"), ({"seconds": float("nan")}, "bad seconds"),
    ({"sample_rate": None, "seconds": 1.0}, "needs a sample_rate"), ({"random_crop": True}, "needs the clip length"),
    ({"seed": "x"}, "bad seed"), ({"max_seconds": 0}, "bad max_seconds"),
    ({"seconds": 10.0, "max_seconds": 5.0}, "over max_seconds"),
])
def test_audio_spec_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        AudioSpec(**kwargs)  # type: ignore[arg-type]


def test_decode_audio_bad_data() -> None:
    spec = AudioSpec(sample_rate=16000)
    flac = encode_audio("flac", seconds=1.0)
    with pytest.raises(MediaError, match="looks like text"):
        decode_audio(b"not audio at all\n", spec)
    with pytest.raises(MediaError):
        decode_audio(flac[:30], spec)
    with pytest.raises(MediaError, match="no audio stream"):
        decode_audio(encode_video("mp4", frames=2), spec)
    with pytest.raises(MediaError, match="cut short"):
        decode_audio(_wav(struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16), bytes(10), declared=100), spec)
    with pytest.raises(MediaError, match="over max_seconds"):
        decode_audio(encode_audio("wav", seconds=2.0, rate=8000), AudioSpec(sample_rate=8000, max_seconds=1.0))
    with pytest.raises(MediaError, match="over max_seconds"):
        decode_audio(flac, AudioSpec(sample_rate=16000, max_seconds=0.5))
    with pytest.raises(MediaError, match="cannot read the media"):
        decode_audio(flac[: len(flac) // 2], spec)
    mp3 = encode_audio("mp3", seconds=1.0)
    cut = decode_audio(mp3[: len(mp3) // 2], spec)  # no declared length: an mp3 cut short decodes what it holds
    assert 4000 < cut.shape[1] < 12000


def _peak_bytes(call: Any) -> int:
    """The most memory (numpy arrays included) that ``call()`` held at once."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_clip_is_resampled_alone_so_the_work_follows_the_clip() -> None:
    """A 600-byte WAV at 1 Hz claims ten minutes: resampled whole to 16 kHz it was 9.6 M samples
    (an hour of it, 1.8 GB and 7 s) before the one-second clip was cut."""
    fmt = struct.pack("<HHIIHH", 1, 1, 1, 1, 1, 8)
    wav = _wav(fmt, bytes(range(100, 160)) * 10)
    spec = AudioSpec(sample_rate=16000, seconds=1.0)
    assert decode_audio(wav, spec).shape == (1, 16000)
    # whole: 9.6 M float32 samples, 38 MB an array (over 100 MB at the peak); the clip and the
    # filter's reach each side (32 samples at 1 Hz: 2 x 0.5 M samples at 16 kHz) are a few MB
    assert _peak_bytes(lambda: decode_audio(wav, spec)) < 24 << 20
    crop = AudioSpec(sample_rate=16000, seconds=1.0, random_crop=True, seed=4)
    assert _peak_bytes(lambda: decode_audio(wav, crop, "k")) < 24 << 20


@pytest.mark.parametrize(("rate", "to"), [(8000, 16000), (44100, 16000), (22050, 16000), (16000, 44100), (7919, 16000)])
def test_a_clip_resampled_alone_is_the_clip_of_the_whole_resampled(rate: int, to: int) -> None:
    signal = np.random.default_rng(rate).uniform(-0.5, 0.5, (2, 3 * rate)).astype(np.float32)
    wav = _wav(struct.pack("<HHIIHH", 3, 2, rate, rate * 8, 8, 32), signal.T.tobytes())
    whole = decode_audio(wav, AudioSpec(sample_rate=to, channels=None))
    spec = AudioSpec(sample_rate=to, channels=None, seconds=0.5, random_crop=True, seed=1)
    starts = set()
    for key in (f"k{i}" for i in range(6)):
        start = spec.crop_start(key, round(3 * rate * to / rate))  # the audio's length at the new rate
        starts.add(start)
        clip = whole[:, start:start + spec.length]
        assert np.allclose(decode_audio(wav, spec, key), clip, atol=1e-6)
    assert len(starts) > 1
    head = decode_audio(wav, AudioSpec(sample_rate=to, channels=1, seconds=4.0))  # past the end: padded
    assert head.shape == (1, 4 * to) and not head[0, 3 * to + 50:].any()
    assert np.allclose(head[0, :3 * to - 50], whole.mean(axis=0)[:3 * to - 50], atol=1e-6)


def test_more_channels_than_channels_none_keeps_are_refused_before_reading() -> None:
    """A 262 KB WAV whose header says 65,535 channels: kept and resampled, 3.9 GiB."""
    fmt = struct.pack("<HHIIHH", 1, 65535, 1, 65535, 65535, 8)
    wav = _wav(fmt, bytes(range(256)) * 1024)
    spec = AudioSpec(sample_rate=16000, channels=None, seconds=1.0)
    with pytest.raises(MediaError, match="audio of 65,535 channels, more than the 64 that channels=None keeps"):
        decode_audio(wav, spec)
    assert _peak_bytes(lambda: pytest.raises(MediaError, decode_audio, wav, spec)) < 1 << 20
    assert decode_audio(wav, AudioSpec(sample_rate=16000, channels=2, seconds=1.0)).shape == (2, 16000)
    assert decode_audio(wav, AudioSpec(sample_rate=16000, channels=1, seconds=1.0)).shape == (1, 16000)
    with pytest.raises(MediaError, match="65,535 channels"):  # a format PyAV decodes: the same check
        decode_audio(_wav(struct.pack("<HHIIHH", 6, 65535, 1, 65535, 65535, 8), bytes(65535 * 4)), spec)
    stored = np.random.default_rng(0).integers(-1000, 1000, (100, 64)).astype("<i2")
    wav64 = _wav(struct.pack("<HHIIHH", 1, 64, 8000, 8000 * 128, 128, 16), stored.tobytes())
    assert decode_audio(wav64, AudioSpec(sample_rate=8000, channels=None)).shape == (64, 100)  # 64 is kept


def test_64_bit_integer_pcm_decodes_in_wav_and_through_pyav() -> None:
    """PyAV converts no 64-bit integer frames (its ValueError escaped decode_audio): numpy reads them."""
    values = np.array([0.0, 0.25, -0.25, -1.0, 0.5, -0.5])
    fmt = struct.pack("<HHIIHH", 1, 2, 1000, 16000, 16, 64)
    raw = (values * 2 ** 63).astype("<i8").tobytes()
    for data in (_wav(fmt, raw), wave64_file(fmt, raw)):
        audio = decode_audio(data, AudioSpec(sample_rate=1000, channels=None))
        assert audio.tolist() == values.reshape(3, 2).T.tolist()
    assert probe(wave64_file(fmt, raw)).codec == "pcm_s64le"


def test_a_frame_pyav_cannot_convert_is_a_media_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tarproc.decode import audio

    def refuse(frame: Any) -> np.ndarray:
        raise ValueError("Conversion from 's64' format to numpy array is not supported.")

    monkeypatch.setattr(audio, "_frame_samples", refuse)
    with pytest.raises(MediaError, match="cannot decode the audio: Conversion from 's64'"):
        decode_audio(encode_audio("flac", 0.1, 8000), AudioSpec(sample_rate=8000))


def _frame_indices(clip: np.ndarray, frames: int) -> list[int]:
    """Which stored frames ``clip`` (THWC) shows, by each frame's grey level."""
    levels = np.array([frame_level(i, frames) for i in range(frames)])
    return [int(np.argmin(np.abs(levels - f.mean()))) for f in clip]


@pytest.mark.parametrize("ext", sorted(VIDEO_FORMATS))
def test_decode_video(ext: str) -> None:
    video = encode_video(ext, frames=24, fps=12, height=48, width=64)
    clip = decode_video(video, VideoSpec(frames=6))
    assert clip.shape == (6, 48, 64, 3) and clip.dtype == np.uint8
    assert _frame_indices(clip, 24) == [0, 1, 2, 3, 4, 5]
    slow = decode_video(video, VideoSpec(frames=6, fps=4, size=(24, 40)))
    assert slow.shape == (6, 24, 40, 3) and _frame_indices(slow, 24) == [0, 3, 6, 9, 12, 15]
    fast = decode_video(video, VideoSpec(frames=6, fps=24))
    assert _frame_indices(fast, 24) == [0, 0, 1, 1, 2, 2]
    long = decode_video(video, VideoSpec(frames=30, layout="TCHW"))  # longer than the video: its last frame stays
    assert long.shape == (30, 3, 48, 64) and _frame_indices(long.transpose(0, 2, 3, 1), 24) == list(range(24)) + [23] * 6


def test_decode_video_random_clip_and_seek(monkeypatch: pytest.MonkeyPatch) -> None:
    video = encode_video("mp4", frames=40, fps=5, height=32, width=32, gop=5)  # 8 s, a key frame a second
    spec = VideoSpec(frames=4, fps=2, random_clip=True, seed=3)
    starts = set()
    for i in range(12):
        key = plan_key(f"k{i}", 0)
        picked = _frame_indices(decode_video(video, spec, key), 40)
        start = spec.clip_start(key, 8.0, 40)
        assert 0 <= start <= 6.0
        assert picked == [int((start + j / 2) * 5 + 1e-6) for j in range(4)], (start, picked)
        starts.add(picked[0])
    assert len(starts) > 6
    with_seek = [decode_video(video, spec, plan_key(f"k{i}", 0)) for i in range(6)]
    monkeypatch.setattr(video_module, "_SEEK_AFTER", float("inf"))  # decode from the start instead
    for i, clip in enumerate(with_seek):
        assert np.array_equal(clip, decode_video(video, spec, plan_key(f"k{i}", 0)))
    native = VideoSpec(frames=5, random_clip=True, seed=0)
    for i in range(5):
        picked = _frame_indices(decode_video(video, native, f"n{i}"), 40)
        assert picked == list(range(picked[0], picked[0] + 5)) and picked[0] <= 35
    a = decode_video(video, spec, plan_key("k", 0))
    assert not np.array_equal(a, decode_video(video, spec, plan_key("k", 1)))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"frames": 0}, "bad frames"), ({"fps": 0}, "bad fps"), ({"fps": float("inf")}, "bad fps"),
    ({"size": (0, 3)}, "bad size"), ({"size": 64}, "bad size"), ({"layout": "HWC"}, "bad layout"),
    ({"size": (100, 100), "max_pixels": 50}, "over max_pixels"), ({"seed": 1.5}, "bad seed"),
])
def test_video_spec_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        VideoSpec(**kwargs)  # type: ignore[arg-type]


def test_decode_video_bad_data() -> None:
    spec = VideoSpec(frames=2)
    mp4 = encode_video("mp4", frames=12, height=64, width=64)
    with pytest.raises(MediaError):
        decode_video(mp4[: len(mp4) // 2], spec)
    with pytest.raises(MediaError, match="no video stream"):
        decode_video(encode_audio("flac"), spec)
    with pytest.raises(MediaError, match="no video stream"):
        decode_video(encode_audio("wav"), spec)
    with pytest.raises(MediaError, match="over the limit"):
        decode_video(mp4, VideoSpec(frames=2, max_pixels=64 * 63))
    with pytest.raises(MediaError, match="looks like jpeg"):
        decode_video(b"\xff\xd8\xff\xe0" + bytes(64), spec)


def test_decode_media_samples_stage() -> None:
    from tarproc.decode.stage import DecodeStats
    from tarproc.errors import DecodeError

    good = encode_audio("flac", seconds=0.5, rate=8000)
    samples = [{"__key__": f"k{i}", "__url__": "s.tar", "flac": good if i != 1 else b"junk!" * 20,
                "mp4": encode_video("mp4", frames=3)} for i in range(3)]
    specs = {"wav;flac": AudioSpec(sample_rate=8000, seconds=0.25), "mp4": VideoSpec(frames=2, size=(8, 8))}
    with pytest.raises(DecodeError, match=r"s\.tar: cannot decode field 'flac' of sample 'k1': not audio or video"):
        list(decode_media_samples([dict(s) for s in samples], specs))
    stats, said = DecodeStats(), []
    out = list(decode_media_samples([dict(s) for s in samples], specs, on_error="skip", stats=stats, warn=said.append))
    assert [s["__key__"] for s in out] == ["k0", "k2"] and (stats.decoded, stats.skipped) == (2, 1)
    assert out[0]["flac"].shape == (1, 2000) and out[0]["mp4"].shape == (2, 8, 8, 3) and "k1" in said[0]
    with pytest.raises(DecodeError, match=r"no field ogg \(it has: flac, mp4\)"):
        list(decode_media_samples([dict(samples[0])], {"ogg": AudioSpec()}))
    for bad, message in (({"flac": 3}, "bad decode spec"), ({}, "bad media specs"), ({"a;b": AudioSpec(), "b": AudioSpec()},
                                                                                    "two decode specs")):
        with pytest.raises(OptionError, match=message):
            list(decode_media_samples([], bad))  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="bad on_error"):
        list(decode_media_samples([], specs, on_error="skip-shard"))


def test_damaged_media_only_raise_media_errors() -> None:
    """Seeded damage (bytes changed, cut, spliced) to real files: every outcome is a result or a
    TarprocError, never another exception (an unknown codec's stream has no decoder context)."""
    rng = random.Random(2)
    files = [encode_audio(e, 0.3, 8000) for e in ("flac", "mp3", "opus", "m4a")]
    files += [encode_video(e, frames=4, height=16, width=16) for e in ("mp4", "webm", "mkv")]
    calls = (lambda d: probe(d), lambda d: decode_audio(d, AudioSpec(16000)),
             lambda d: decode_video(d, VideoSpec(2, fps=4, size=(8, 8))), lambda d: poster_frame(d, 8))
    for data in files:
        for _ in range(25):
            damaged = bytearray(data)
            if rng.random() < 0.5:
                for _ in range(rng.randint(1, 20)):
                    damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            else:
                at = rng.randrange(len(damaged))
                damaged = damaged[:at] + damaged[at + rng.randint(1, 400):]
            for call in calls:
                try:
                    call(bytes(damaged))
                except TarprocError:
                    pass
