"""Decode audio fields to float32 arrays: a chosen sample rate and channel count, a fixed length.

::

    from tarproc.decode.audio import AudioSpec, decode_audio
    spec = AudioSpec(sample_rate=16000, channels=1, seconds=4.0, random_crop=True, seed=0)
    samples = decode_audio(flac_bytes, spec, key="utt-0001")   # (1, 64000) float32 in -1..1

The exact semantics:

- values are float32, full scale -1..1 (integer PCM divided by 2**(bits-1); unsigned 8-bit
  centred first); the shape is ``(channels, samples)``, as torchaudio's;
- PCM WAV (integers of 8 to 64 bits, floats) is read with numpy alone; everything else is decoded
  by PyAV (FFmpeg: ``pip install 'tarproc[media]'``), and a change of rate is made, after the
  channels, by its ``AudioResampler`` (libswresample's default filter), channel by channel;
- ``channels``: 1 is the mean of the stored channels; from mono, the channel is repeated; from
  more channels to fewer (not 1), the first ones are kept (FL, FR of a 5.1 file); ``None`` keeps
  them, up to ``MAX_CHANNELS`` (64: third-order ambisonics is 16, a 64-capsule microphone array
  64); more is an error (a damaged header claiming 65,535 channels would make gigabytes);
- ``seconds``: the clip is cut (or padded with zeros at its end) to ``round(seconds * sample_rate)``
  samples. The cut starts at 0, or with ``random_crop`` at a random sample drawn uniformly from
  every start that keeps the clip inside the audio, from ``random.Random(f"{seed}/{key}")``: the key
  is the sample's ``plan_key`` (key, plus the epoch after the first), as for the image plans, so a
  resumed run draws the same crops. With a change of rate, the audio counts as
  ``round(samples * sample_rate / stored_rate)`` samples long at the new rate, and only the stretch
  the clip needs (plus the filter's reach) is resampled: the work follows the clip, not the length
  the audio claims (a 3.6 KB WAV at 1 Hz is an hour long);
- audio longer than ``max_seconds`` (default one hour) is an error rather than an allocation of
  gigabytes. Data FFmpeg cannot open (a FLAC or Ogg file cut short, usually) and a WAV holding
  less than its header declares are errors; a stream without a declared length (MP3) cut short
  decodes to what it holds, as FFmpeg decodes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import MediaError, OptionError
from ..media_headers import MAX_AUDIO_CHANNELS
from .media import MAX_SAMPLE_RATE, audio_stream, ffmpeg_reason, import_av, is_wav, open_container, wav_header
from .spec import named_parameters, plan_rng

DEFAULT_MAX_SECONDS = 3600.0
MAX_CHANNELS = MAX_AUDIO_CHANNELS  # one bound: the summary flags what the decoder refuses


@named_parameters
@dataclass(frozen=True)
class AudioSpec:
    """How to decode an audio field (see the module docstring for the exact semantics), e.g.
    ``tarproc.Dataset(urls, decode={"flac;wav": AudioSpec(seconds=4.0)})``.

    Args:
        sample_rate: samples per second out (default 16000); None: as stored (then no ``seconds``).
        channels: 1 (default: the mean), N (the first N; mono repeated), or None: as stored, up to
            ``MAX_CHANNELS`` (64).
        seconds: cut or pad every clip to this length (default None: as long as the audio).
        random_crop: start the clip at a random sample (default False: at 0); needs ``seconds``.
        seed: seeds the random crops with each sample's key (default None; a Dataset gives its own).
        max_seconds: refuse audio longer than this (default 3600).

    Raises:
        OptionError: a value out of range or of the wrong kind, naming it.
        ParameterError: a keyword it doesn't take, saying where it belongs.

    >>> AudioSpec(sample_rate=16000, seconds=2.5).length
    40000
    """

    sample_rate: int | None = 16000
    channels: int | None = 1
    seconds: float | None = None
    random_crop: bool = False
    seed: int | None = None
    max_seconds: float = DEFAULT_MAX_SECONDS

    def __post_init__(self) -> None:
        if self.sample_rate is not None and (isinstance(self.sample_rate, bool) or not isinstance(self.sample_rate, int)
                                             or not 1 <= self.sample_rate <= 1_000_000):
            raise OptionError(f"bad sample_rate {self.sample_rate!r}; give samples per second (1..1000000) or None")
        if self.channels is not None and (isinstance(self.channels, bool) or not isinstance(self.channels, int)
                                          or not 1 <= self.channels <= MAX_CHANNELS):
            raise OptionError(f"bad channels {self.channels!r}; give 1..{MAX_CHANNELS} or None (as stored)")
        for name, value in (("seconds", self.seconds), ("max_seconds", self.max_seconds)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise OptionError(f"bad {name} {value!r}; must be a number of seconds > 0")
        if self.seconds is not None and self.sample_rate is None:
            raise OptionError("seconds needs a sample_rate: a fixed length is a number of samples at one rate")
        if self.seconds is not None and self.seconds > self.max_seconds:
            raise OptionError(f"seconds {self.seconds} is over max_seconds {self.max_seconds}")
        if self.random_crop and self.seconds is None:
            raise OptionError("random_crop needs the clip length (seconds)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise OptionError(f"bad seed {self.seed!r}; must be an integer or None")

    @property
    def length(self) -> int | None:
        """Samples per clip with ``seconds``, else None (each clip as long as its audio)."""
        if self.seconds is None or self.sample_rate is None:
            return None
        return max(1, round(self.seconds * self.sample_rate))

    @property
    def random(self) -> bool:
        return self.random_crop

    def crop_start(self, key: str, samples: int) -> int:
        """Where the clip of the ``samples`` long audio of plan key ``key`` begins.

        >>> spec = AudioSpec(sample_rate=10, seconds=1.0, random_crop=True, seed=3)
        >>> spec.crop_start("k", 100) == spec.crop_start("k", 100), AudioSpec(sample_rate=10, seconds=1.0).crop_start("k", 100)
        (True, 0)
        """
        length = self.length
        if length is None or not self.random_crop or samples <= length:
            return 0
        rng = plan_rng(self.seed, key)
        return rng.randint(0, samples - length)


def decode_audio(data: bytes | bytearray | memoryview, spec: AudioSpec, key: str = "") -> np.ndarray:
    """``(channels, samples)`` float32 of the audio ``data`` as ``spec`` says; ``key``: the plan key
    of the sample (its random crop). Undecodable data is a ``MediaError``; a format that needs
    PyAV without it, a ``MissingDependencyError``."""
    samples, rate = _read_wav(data, spec) if is_wav(data) else (None, 0)
    if samples is None:
        samples, rate = _read_av(data, spec)
    length = spec.length
    if length is not None and spec.sample_rate is not None and spec.sample_rate != rate:
        # cut before resampling: the work follows the clip, not the length the audio claims
        samples = _resampled_clip(samples, rate, spec, key)
        return np.ascontiguousarray(samples, dtype=np.float32)
    samples = _mix(samples, spec.channels)  # before resampling: fewer channels to resample
    if spec.sample_rate is not None and spec.sample_rate != rate:
        samples = _resample(samples, rate, spec.sample_rate)
    if length is not None:
        start = spec.crop_start(key, samples.shape[1])
        samples = _cut(samples, start, length)
    return np.ascontiguousarray(samples, dtype=np.float32)


def _cut(samples: np.ndarray, start: int, length: int) -> np.ndarray:
    """``length`` samples of ``samples`` (C, N) from ``start``, padded with zeros past the end."""
    samples = samples[:, start:start + length]
    if samples.shape[1] < length:
        samples = np.pad(samples, ((0, 0), (0, length - samples.shape[1])))
    return samples


# samples at the lower of the two rates: libswresample's default filter (32 taps) reaches 16 each way;
# from 32 on, a clip resampled alone is the whole audio resampled, sample for sample (16 is not)
_FILTER_REACH = 32


def _resampled_clip(samples: np.ndarray, rate: int, spec: AudioSpec, key: str) -> np.ndarray:
    """The clip of ``spec`` from ``samples`` (C, N) at ``rate``, resampling only the input it needs.

    The stretch resampled starts on an input sample that falls exactly on an output sample (the two
    rates meet every ``rate / gcd`` input samples), so its output samples are those of the whole
    audio resampled, and reaches ``_FILTER_REACH`` samples past the clip on both sides, so the
    filter sees what it would have seen there.
    """
    to = spec.sample_rate
    length = spec.length
    assert to is not None and length is not None
    total = samples.shape[1]
    start = spec.crop_start(key, round(total * to / rate))  # the clip, in samples at the new rate
    g = math.gcd(rate, to)
    step_in, step_out = rate // g, to // g
    reach_in = _FILTER_REACH * max(1, -(-rate // to))  # input samples the filter reaches
    reach_out = -(-reach_in * to // rate)
    block = max(0, start - reach_out) // step_out
    first_in, first_out = block * step_in, block * step_out
    end_in = min(total, -(-(start + length) * rate // to) + reach_in)
    if first_in >= end_in:  # the clip starts past the audio's end: all padding
        return np.zeros((_mix(samples[:, :1], spec.channels).shape[0], length), np.float32)
    window = _mix(samples[:, first_in:end_in], spec.channels)
    return _cut(_resample(window, rate, to), start - first_out, length)


def _read_wav(data: bytes | bytearray | memoryview, spec: AudioSpec) -> tuple[np.ndarray | None, int]:
    """Linear PCM WAV with numpy, at its own rate; None for the codecs PyAV must decode."""
    h = wav_header(data)
    _check_channels(h.channels, spec)
    if not h.is_pcm:
        return None, 0
    width = h.bits // 8
    if h.block_align != width * h.channels:
        raise MediaError(f"bad WAV: block align {h.block_align} for {h.channels} channels of {h.bits} bits")
    frames = h.size // h.block_align
    if frames / h.sample_rate > spec.max_seconds:
        raise MediaError(f"audio of {frames / h.sample_rate:.0f} s is over max_seconds {spec.max_seconds:g}")
    if frames == 0:
        raise MediaError("WAV holds no samples")
    raw = memoryview(data)[h.offset:h.offset + frames * h.block_align]
    if h.bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8  # sign-extend the 24 bits
        values = ints.astype(np.float32) / float(1 << 23)
    else:
        kind = ("f" if h.format_tag == 3 else "u" if h.bits == 8 else "i") + str(width)
        values = _to_float(np.frombuffer(raw, dtype="<" + kind))
    return values.reshape(frames, h.channels).T, h.sample_rate


def _check_channels(stored: int, spec: AudioSpec) -> None:
    """Refuse to keep more than ``MAX_CHANNELS`` stored channels (``channels=None``), before any
    sample is read: a header's count is 16 bits, and 65,535 channels resampled make gigabytes."""
    if spec.channels is None and stored > MAX_CHANNELS:
        raise MediaError(f"audio of {stored:,} channels, more than the {MAX_CHANNELS} that channels=None keeps "
                         "(damage, or give channels=N: the mean, or the first N)")


def _to_float(values: np.ndarray) -> np.ndarray:
    """Samples of any PCM dtype as float32 in -1..1 (unsigned 8-bit centred on 128)."""
    if values.dtype.kind == "f":
        return values.astype(np.float32)
    if values.dtype.kind == "u":
        return ((values.astype(np.float32) - 128.0) / 128.0).astype(np.float32)
    bits = values.dtype.itemsize * 8
    return (values.astype(np.float64 if bits > 16 else np.float32) / float(1 << (bits - 1))).astype(np.float32)


def _frame_samples(frame: Any) -> np.ndarray:
    """A decoded ``av.AudioFrame`` as float32 ``(channels, samples)``, converted by numpy (not by
    libswresample, which crashes on some layouts without a channel order, e.g. 8 unnamed channels)."""
    channels = len(frame.layout.channels)
    if frame.format.name in ("s64", "s64p"):  # PyAV's to_ndarray has no 64-bit integers: read the planes
        count = frame.samples * (1 if frame.format.is_planar else channels)
        planes = [np.frombuffer(plane, dtype=np.int64, count=count) for plane in frame.planes]
        array = np.stack(planes) if frame.format.is_planar else planes[0]
    else:
        array = frame.to_ndarray()
    if not frame.format.is_planar:
        array = array.reshape(-1, channels).T
    return _to_float(array)


def _read_av(data: bytes | bytearray | memoryview, spec: AudioSpec) -> tuple[np.ndarray, int]:
    """The first audio stream decoded by PyAV, at its own rate."""
    av = import_av()
    with open_container(data) as container:
        stream = audio_stream(container)
        if stream is None:
            raise MediaError("no decoder for its audio stream" if container.streams.audio else "no audio stream")
        rate = stream.codec_context.sample_rate
        if not rate or not 0 < rate <= MAX_SAMPLE_RATE:
            raise MediaError(f"bad sample rate {rate} Hz in the audio stream's header")
        _check_channels(stream.codec_context.channels or 0, spec)
        limit = spec.max_seconds * rate
        chunks: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                if frame.sample_rate != rate:
                    raise MediaError(f"the sample rate changes within the audio ({rate} to {frame.sample_rate} Hz)")
                _check_channels(len(frame.layout.channels), spec)
                chunks.append(_frame_samples(frame))
                total += chunks[-1].shape[1]
                if total > limit:
                    raise MediaError(f"audio is over max_seconds {spec.max_seconds:g}")
        except av.FFmpegError as e:
            if not chunks:
                raise MediaError(f"cannot decode the audio: {ffmpeg_reason(e)}") from None
            # damage after some good frames: keep what decoded, as for a stream cut short
        except (ValueError, TypeError) as e:  # PyAV refusing a frame (a sample format it can't convert)
            raise MediaError(f"cannot decode the audio: {ffmpeg_reason(e)}") from None
    if not total:
        raise MediaError("no audio samples decode")
    channels = {c.shape[0] for c in chunks}
    if len(channels) != 1:
        raise MediaError(f"the channel count changes within the audio ({sorted(channels)})")
    return np.concatenate(chunks, axis=1), rate


_RESAMPLE_CHUNK = 1 << 16  # samples per frame handed to the resampler


def _resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """``samples`` (C, N) at ``rate`` resampled to ``to`` by libswresample, each channel as mono."""
    av = import_av()
    out = []
    for channel in samples:
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=to)
        pieces = []
        for start in range(0, channel.shape[0], _RESAMPLE_CHUNK):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(channel[None, start:start + _RESAMPLE_CHUNK]),
                                               format="fltp", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = rate, start, Fraction(1, rate)
            pieces += [f.to_ndarray()[0] for f in resampler.resample(frame)]
        pieces += [f.to_ndarray()[0] for f in resampler.resample(None)]
        out.append(np.concatenate(pieces) if pieces else np.zeros(0, np.float32))
    length = min(len(c) for c in out)
    return np.stack([c[:length] for c in out])


def _mix(samples: np.ndarray, channels: int | None) -> np.ndarray:
    """``samples`` (C, N) with ``channels`` channels (see the module docstring).

    >>> _mix(np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32), 1).tolist()
    [[0.5, 0.5]]
    >>> _mix(np.array([[1.0, 2.0]], dtype=np.float32), 2).tolist()
    [[1.0, 2.0], [1.0, 2.0]]
    """
    have = samples.shape[0]
    if channels is None or channels == have:
        return samples
    if channels == 1:
        return samples.mean(axis=0, keepdims=True, dtype=np.float32)
    if have == 1:
        return np.repeat(samples, channels, axis=0)
    if channels < have:
        return samples[:channels]
    raise MediaError(f"cannot make {channels} channels from {have}")


__all__ = ["DEFAULT_MAX_SECONDS", "MAX_CHANNELS", "AudioSpec", "decode_audio"]
