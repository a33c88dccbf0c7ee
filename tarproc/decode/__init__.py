"""Decode and augment images: a stage yielding samples or batches of arrays (cpu, dali-cpu, gpu).

::

    from tarproc import read_samples
    from tarproc.decode import AugmentSpec, IMAGENET_MEAN, IMAGENET_STD, batches

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                       layout="CHW", seed=1)
    for keys, images, samples in batches(read_samples("train-{0000..0147}.tar"), spec, batch_size=256):
        ...  # images: (256, 3, 224, 224) float32

The exact semantics of the spec (windows, interpolation, randomness) are in ``tarproc.decode.spec``;
the backends are in ``tarproc.decode.cpu`` (simplejpeg + Pillow, process pool) and
``tarproc.decode.dali`` (NVIDIA DALI on the CPU or the GPU, ``pip install tarproc[gpu]``).

Audio and video fields (``pip install 'tarproc[media]'``: PyAV, whose wheels bundle FFmpeg; PCM WAV
needs nothing) are rooms of their own: ``tarproc.decode.media`` (``probe``: what a field holds,
from its headers; ``poster_frame``), ``tarproc.decode.audio`` (``AudioSpec``, ``decode_audio``:
float32 ``(channels, samples)`` at a chosen rate, cropped or padded) and ``tarproc.decode.video``
(``VideoSpec``, ``decode_video``: N frames at a chosen rate and size); ``decode_media_samples`` is
their stage over samples.
"""

from __future__ import annotations

from ..errors import DecodeError
from .audio import AudioSpec, decode_audio
from .cpu import CpuDecoder, ImageError, decode_image, image_size
from .dali import DaliDecoder, dali_available, gpu_count
from .media import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS, MediaInfo, decode_media_samples, poster_frame, probe
from .spec import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AugmentSpec,
    Plan,
    color_matrix,
    parse_jitter,
    parse_pair,
    parse_triple,
    plan_key,
)
from .stage import (
    DECODE_ON_ERROR,
    DEFAULT_FIELDS,
    DEVICES,
    Batch,
    DecodeStats,
    batches,
    decode_samples,
    decoded_batches,
    make_decoder,
    npy_bytes,
    resolve_device,
)
from .video import VideoSpec, decode_video

__all__ = [
    "AUDIO_EXTENSIONS", "VIDEO_EXTENSIONS", "AudioSpec", "MediaInfo", "VideoSpec", "decode_audio", "decode_video",
    "decode_media_samples", "poster_frame", "probe",
    "DECODE_ON_ERROR", "DEFAULT_FIELDS", "DEVICES", "IMAGENET_MEAN", "IMAGENET_STD", "AugmentSpec", "Batch",
    "CpuDecoder", "DaliDecoder", "DecodeError", "DecodeStats", "ImageError", "Plan", "batches", "dali_available",
    "decode_image", "decode_samples", "decoded_batches", "gpu_count", "image_size", "make_decoder", "npy_bytes",
    "color_matrix", "parse_jitter", "parse_pair", "parse_triple", "plan_key", "resolve_device",
]
