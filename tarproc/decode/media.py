"""Audio and video fields: what they hold (``probe``) and a poster frame, header-only where possible.

``probe(data)`` reads a WAV's RIFF header in pure Python (no dependency) and every other format's
container and stream headers with PyAV (``pip install 'tarproc[media]'``; its wheels bundle
FFmpeg), without decoding the media::

    from tarproc.decode.media import probe
    info = probe(open("speech.flac", "rb").read())
    info.kind, info.codec, info.duration, info.sample_rate, info.channels
    # ('audio', 'flac', 3.52, 16000, 1)

Damaged, cut or non-media data raises ``MediaError`` (one line); a format that needs PyAV when it is
not installed raises ``MissingDependencyError`` with the install hint.

>>> import struct
>>> header = b"RIFF" + struct.pack("<I", 36 + 32000) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
>>> probe(header + b"data" + struct.pack("<I", 32000) + bytes(32000))
MediaInfo(kind='audio', codec='pcm_s16le', duration=1.0, sample_rate=16000, channels=1, fps=None, width=None, height=None)
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import DataWarning, DecodeError, MediaError, MissingDependencyError, OptionError, warner
from ..samples import Sample
from ..sniff import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS, sniff_type

if TYPE_CHECKING:
    from PIL import Image

MEDIA_EXTENSIONS: frozenset[str] = AUDIO_EXTENSIONS | VIDEO_EXTENSIONS
INSTALL_HINT = "pip install 'tarproc[media]'"
MAX_SAMPLE_RATE = 1 << 22  # Hz: a stored rate above this (4 MHz) is damage, not audio

# what the sniffer recognises as something other than audio or video: FFmpeg would open some of
# these (images as one-frame "video", text as subtitles), which is not what a media field means
_NOT_MEDIA = frozenset({
    "jpeg", "png", "gif", "bmp", "tiff", "jpeg2000", "webp", "avif", "heic", "heif", "pdf", "gzip", "zstd",
    "bzip2", "xz", "zip", "npy", "pickle", "hdf5", "tar", "json", "text", "empty",
})


class MediaInfo(NamedTuple):
    """What an audio or video field holds. For video, ``sample_rate`` and ``channels`` are those of
    its first audio track (None without one); ``duration`` is None when the headers don't say."""

    kind: str  # "audio" or "video"
    codec: str  # FFmpeg's codec name: "pcm_s16le", "flac", "vorbis", "opus", "mp3", "aac", "h264", "vp9"
    duration: float | None  # seconds
    sample_rate: int | None
    channels: int | None
    fps: float | None
    width: int | None
    height: int | None


def media_kind(field: str) -> str | None:
    """``"audio"`` or ``"video"`` by a field's last extension, else None.

    >>> media_kind("speech.flac"), media_kind("mp4"), media_kind("jpg")
    ('audio', 'video', None)
    """
    ext = field.rsplit(".", 1)[-1].lower()
    return "audio" if ext in AUDIO_EXTENSIONS else "video" if ext in VIDEO_EXTENSIONS else None


def import_av() -> Any:
    """The ``av`` module (PyAV), or ``MissingDependencyError`` with the install hint."""
    try:
        import av
    except ImportError:
        raise MissingDependencyError(f"audio and video fields need PyAV: {INSTALL_HINT}") from None
    return av


# ---------------------------------------------------------------------------------------------------
# WAV: the RIFF header, in pure Python

_WAV_CODECS = {1: "pcm", 3: "pcm_f", 6: "pcm_alaw", 7: "pcm_mulaw", 2: "adpcm_ms", 0x11: "adpcm_ima_wav",
               0x55: "mp3", 0x50: "mp2"}
_EXTENSIBLE = 0xFFFE


class WavHeader(NamedTuple):
    """A WAV's format and where its samples are: ``data[offset:offset + size]``."""

    format_tag: int
    channels: int
    sample_rate: int
    byte_rate: int
    block_align: int
    bits: int
    offset: int
    size: int
    frames: int | None  # the ``fact`` chunk's sample count (compressed formats), if any

    @property
    def codec(self) -> str:
        name = _WAV_CODECS.get(self.format_tag, f"wav_format_0x{self.format_tag:04x}")
        if name == "pcm":
            return "pcm_u8" if self.bits == 8 else f"pcm_s{self.bits}le"
        if name == "pcm_f":
            return f"pcm_f{self.bits}le"
        return name

    @property
    def is_pcm(self) -> bool:
        """Linear PCM that numpy can read (integers of 8/16/24/32/64 bits, floats of 32/64 bits)."""
        return (self.format_tag == 1 and self.bits in (8, 16, 24, 32, 64)) or (self.format_tag == 3 and self.bits in (32, 64))

    @property
    def duration(self) -> float:
        if self.format_tag in (1, 3, 6, 7):
            return self.size // self.block_align / self.sample_rate
        if self.frames is not None:
            return self.frames / self.sample_rate
        return self.size / self.byte_rate if self.byte_rate else 0.0


def is_wav(data: bytes | bytearray | memoryview) -> bool:
    head = bytes(data[:12])
    return head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE"


def wav_header(data: bytes | bytearray | memoryview) -> WavHeader:
    """The format and data chunk of a WAV (RIFF, RF64 or BW64), read from its header.

    A data chunk whose size is 0 or 0xFFFFFFFF (written to a pipe) runs to the end of the data; one
    that declares more bytes than are there is a ``MediaError`` (the field was cut short).
    """
    view = memoryview(data)
    total = len(view)
    if not is_wav(view):
        raise MediaError("not a WAV file (no RIFF/WAVE header)")
    pos = 12
    fmt: tuple[int, int, int, int, int, int] | None = None
    ds64_size: int | None = None
    frames: int | None = None
    while pos + 8 <= total:
        chunk_id = bytes(view[pos:pos + 4])
        (size,) = struct.unpack_from("<I", view, pos + 4)
        body = pos + 8
        if chunk_id == b"data":
            if fmt is None:
                raise MediaError(f"WAV data chunk at byte {pos} comes before its fmt chunk")
            present = total - body
            if ds64_size is not None and size == 0xFFFFFFFF:
                size = ds64_size
            if size in (0, 0xFFFFFFFF):  # streamed: the length was never filled in
                size = present
            elif size > present:
                raise MediaError(f"WAV cut short: its data chunk declares {size} bytes, {present} are present")
            tag, channels, rate, byte_rate, align, bits = fmt
            return WavHeader(tag, channels, rate, byte_rate, align, bits, body, size, frames)
        if body + size > total:
            raise MediaError(f"WAV cut short in its {chunk_id.decode('latin-1')!r} chunk at byte {pos}")
        if chunk_id == b"fmt ":
            if size < 16:
                raise MediaError(f"WAV fmt chunk of {size} bytes at byte {pos} is too short")
            tag, channels, rate, byte_rate, align, bits = struct.unpack_from("<HHIIHH", view, body)
            if tag == _EXTENSIBLE and size >= 40:
                (tag,) = struct.unpack_from("<H", view, body + 24)  # the sub-format GUID's first two bytes
            if channels == 0 or not 0 < rate <= MAX_SAMPLE_RATE or align == 0:
                raise MediaError(f"bad WAV fmt chunk at byte {pos}: {channels} channels, {rate} Hz, "
                                 f"block align {align}")
            fmt = (tag, channels, rate, byte_rate, align, bits)
        elif chunk_id == b"ds64" and size >= 16:
            (ds64_size,) = struct.unpack_from("<Q", view, body + 8)
        elif chunk_id == b"fact" and size >= 4:
            (frames,) = struct.unpack_from("<I", view, body)
        pos = body + size + (size & 1)  # chunks are padded to an even length
    raise MediaError("WAV has no data chunk" if pos >= total and fmt is not None
                     else "WAV cut short before its data chunk")


# ---------------------------------------------------------------------------------------------------
# everything else: PyAV


def ffmpeg_reason(e: BaseException) -> str:
    """What an error from FFmpeg (PyAV) says, on one line, for a ``MediaError``."""
    reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return " ".join(str(reason).split())


@contextmanager
def open_container(data: bytes | bytearray | memoryview) -> Iterator[Any]:
    """An ``av`` input container over ``data``; data that isn't media is a ``MediaError``."""
    kind = sniff_type(data)
    if kind in _NOT_MEDIA:
        raise MediaError("no data" if kind == "empty" else f"not audio or video (the data looks like {kind})")
    av = import_av()
    try:
        container = av.open(io.BytesIO(bytes(data)), mode="r", metadata_errors="replace")
    except av.FFmpegError as e:
        raise MediaError(f"cannot read the media: {ffmpeg_reason(e)}") from None
    except (ValueError, OSError, EOFError) as e:
        raise MediaError(f"cannot read the media: {ffmpeg_reason(e)}") from None
    try:
        if container.format.name.endswith("_pipe") or container.format.name == "image2":
            raise MediaError(f"not audio or video (FFmpeg reads it as {container.format.name})")
        yield container
    finally:
        container.close()


def audio_stream(container: Any) -> Any:
    """The first audio stream FFmpeg has a decoder for, or None."""
    return next((s for s in container.streams.audio if s.codec_context is not None), None)


def video_stream(container: Any) -> Any:
    """The first video stream that FFmpeg has a decoder for and that is not an attached picture
    (an MP3's cover art), or None."""
    for stream in container.streams.video:
        if stream.codec_context is None:  # a codec this FFmpeg doesn't know (or damage that looks like one)
            continue
        disposition = getattr(stream, "disposition", 0)
        attached = getattr(type(disposition), "attached_pic", None)
        if attached is not None and disposition & attached:
            continue
        return stream
    return None


def _codec_name(stream: Any) -> str:
    """The codec's own name (``mp3``), not the decoder's (``mp3float``)."""
    codec = stream.codec_context.codec
    return str(getattr(codec, "canonical_name", None) or codec.name)


def _duration(container: Any, stream: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def probe(data: bytes | bytearray | memoryview) -> MediaInfo:
    """What the audio or video ``data`` holds, from its headers (no frame is decoded).

    WAV is read in pure Python; other formats need PyAV (``MissingDependencyError`` without it).
    Damaged, cut or non-media data is a ``MediaError``.
    """
    if is_wav(data):
        h = wav_header(data)
        return MediaInfo("audio", h.codec, h.duration, h.sample_rate, h.channels, None, None, None)
    with open_container(data) as container:
        video = video_stream(container)
        audio = audio_stream(container)
        if video is None and audio is None:
            if container.streams.audio or container.streams.video:
                raise MediaError("no decoder for its audio or video stream (an unknown codec, or damage)")
            raise MediaError(f"no audio or video stream (FFmpeg reads it as {container.format.name})")
        rate = channels = None
        if audio is not None:
            rate = audio.codec_context.sample_rate or None
            channels = audio.codec_context.channels or None
        if video is None:
            assert audio is not None
            return MediaInfo("audio", _codec_name(audio), _duration(container, audio), rate, channels,
                             None, None, None)
        fps_rate = video.average_rate or video.guessed_rate or video.base_rate
        ctx = video.codec_context
        return MediaInfo("video", _codec_name(video), _duration(container, video), rate, channels,
                         float(fps_rate) if fps_rate else None, ctx.width or None, ctx.height or None)


def poster_frame(data: bytes | bytearray | memoryview, max_size: int = 256) -> Image.Image:
    """A frame near the start of the video ``data`` (its first key frame), as an RGB PIL image no
    larger than ``max_size`` on either side (aspect ratio kept).

    Needs PyAV; a video that cannot be decoded, or audio without a video track, is a ``MediaError``.
    """
    if max_size < 1:
        raise MediaError(f"bad max_size {max_size}; must be >= 1")
    if is_wav(data):
        raise MediaError("no video stream (the data is WAV audio)")
    with open_container(data) as container:
        stream = video_stream(container)
        if stream is None:
            raise MediaError("no video stream")
        av = import_av()
        try:
            for frame in container.decode(stream):
                image = frame.to_image()
                break
            else:
                raise MediaError("the video has no frame that decodes")
        except av.FFmpegError as e:
            raise MediaError(f"cannot decode the video: {ffmpeg_reason(e)}") from None
    image = image.convert("RGB")
    image.thumbnail((max_size, max_size))
    return image


# ---------------------------------------------------------------------------------------------------
# the stage: samples in, samples with their audio/video fields decoded out

MediaFields = Sequence[tuple[list[str], Any]]  # ([names], AudioSpec | VideoSpec): the first name a sample has


def parse_media_specs(specs: Mapping[str, Any]) -> list[tuple[list[str], Any]]:
    """``{"flac;wav": AudioSpec(...), "mp4": VideoSpec(...)}`` checked and split into field lists.

    >>> from tarproc.decode.audio import AudioSpec
    >>> parse_media_specs({"flac;wav": AudioSpec()})[0][0]
    ['flac', 'wav']
    """
    from .audio import AudioSpec
    from .stage import parse_field_list
    from .video import VideoSpec

    if not isinstance(specs, Mapping) or not specs:
        raise OptionError(f"bad media specs {specs!r}; give a dict of field names to AudioSpec/VideoSpec")
    out = []
    taken: set[str] = set()
    for names, spec in specs.items():
        if not isinstance(names, str):
            raise OptionError(f"bad decode field {names!r}; give field names like 'flac;wav'")
        if not isinstance(spec, (AudioSpec, VideoSpec)):
            raise OptionError(f"bad decode spec for {names!r}: {spec!r}; give an AudioSpec or VideoSpec "
                              "(or, in a Dataset, an AugmentSpec for the image field)")
        listed = parse_field_list(names)
        for name in listed:
            if name in taken:
                raise OptionError(f"field {name!r} is in two decode specs")
            taken.add(name)
        out.append((listed, spec))
    return out


def decode_media_fields(sample: Sample, media: MediaFields, epoch: int = 0) -> Sample:
    """The sample with its audio/video fields decoded (for each spec, the first of its names the
    sample has); a missing field or undecodable data is a ``DecodeError`` naming URL, key and field.
    Random crops and clips are drawn from the spec's seed and ``plan_key(key, epoch)``, as the
    image plans are."""
    from .audio import AudioSpec, decode_audio
    from .spec import plan_key
    from .video import decode_video

    key = str(sample.get("__key__"))
    for names, spec in media:
        name = next((n for n in names if n in sample), None)
        if name is None:
            have = ", ".join(k for k in sample if not k.startswith("__"))
            raise DecodeError(f"no field {'/'.join(names)} (it has: {have})", sample.get("__url__"), sample.get("__key__"))
        value = sample[name]
        if not isinstance(value, (bytes, bytearray, memoryview)):
            continue  # decoded already (by a map)
        try:
            if isinstance(spec, AudioSpec):
                sample[name] = decode_audio(value, spec, plan_key(key, epoch))
            else:
                sample[name] = decode_video(value, spec, plan_key(key, epoch))
        except MediaError as e:
            raise DecodeError(e.message, sample.get("__url__"), sample.get("__key__"), name) from None
    return sample


def decode_media_samples(
    samples: Iterable[Sample],
    specs: Mapping[str, Any],
    *,
    epoch: int = 0,
    on_error: str = "fail",
    stats: Any = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[Sample]:
    """A stage: each sample with its audio/video fields decoded as ``specs`` says (field names to
    ``AudioSpec``/``VideoSpec``). A sample that can't be decoded is a ``DecodeError`` or, with
    ``on_error="skip"``, dropped, counted in ``stats.skipped`` (a ``DecodeStats``) and reported
    through ``warn`` (a callback; default a ``DataWarning``). Specs without a seed draw new random crops on every run.

    ::

        for sample in decode_media_samples(read_samples("speech-{0000..0009}.tar"),
                                           {"flac;wav": AudioSpec(sample_rate=16000, seconds=4.0)}):
            sample["flac"]  # (1, 64000) float32
    """
    if on_error not in ("fail", "skip"):
        raise OptionError(f"bad on_error {on_error!r}; use fail or skip")
    media = parse_media_specs(specs)
    for sample in samples:
        try:
            decoded = decode_media_fields(sample, media, epoch)
        except DecodeError as e:
            if on_error == "fail":
                raise
            if stats is not None:
                stats.skipped += 1
            warner(warn, DataWarning)(f"skipped: {e}")
            continue
        if stats is not None:
            stats.decoded += 1
        yield decoded


__all__ = [
    "AUDIO_EXTENSIONS", "INSTALL_HINT", "MEDIA_EXTENSIONS", "VIDEO_EXTENSIONS", "MediaInfo", "WavHeader", "import_av",
    "decode_media_fields", "decode_media_samples", "is_wav", "media_kind", "open_container", "parse_media_specs",
    "poster_frame", "probe", "wav_header",
]
