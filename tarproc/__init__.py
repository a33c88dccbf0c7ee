"""tarproc: Unix-style tools and a streaming core for sharded tar datasets (WebDataset layout).

The core never imports click; the commands in ``tarproc.cli`` are thin layers over it.

>>> import tarproc
>>> callable(tarproc.read_samples)
True
"""

from __future__ import annotations

from .errors import (
    CompressedShardError,
    CompressionError,
    DecodeError,
    DuplicateError,
    IndexFileError,
    OptionError,
    SampleError,
    SinkError,
    SourceError,
    TarFormatError,
    TarprocError,
)
from .index import IndexedShard, ShardIndex, build_index
from .samples import group_samples, read_samples, split_name
from .shards import ShardInfo, ShardWriter, parse_size
from .sinks import open_sink
from .sort import SortStats, sort_samples
from .sources import expand_urls, open_source
from .tario import ReadStats, TarWriter, iter_members

__version__ = "0.1.0"

__all__ = [
    "CompressedShardError",
    "CompressionError",
    "DecodeError",
    "DuplicateError",
    "IndexFileError",
    "IndexedShard",
    "OptionError",
    "ReadStats",
    "SampleError",
    "ShardInfo",
    "ShardWriter",
    "SinkError",
    "SortStats",
    "SourceError",
    "TarFormatError",
    "TarWriter",
    "ShardIndex",
    "TarprocError",
    "__version__",
    "build_index",
    "expand_urls",
    "group_samples",
    "iter_members",
    "open_sink",
    "open_source",
    "parse_size",
    "read_samples",
    "sort_samples",
    "split_name",
]
