"""tarproc: Unix-style tools and a streaming core for sharded tar datasets (WebDataset layout).

The core never imports click; the commands in ``tarproc.cli`` are thin layers over it.

>>> import tarproc
>>> callable(tarproc.read_samples), callable(tarproc.IndexedShard)
(True, True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    CacheWarning,
    CompressedShardError,
    CompressionError,
    DatasetError,
    DataWarning,
    DecodeError,
    DuplicateError,
    IndexFileError,
    JobError,
    NetworkWarning,
    OptionError,
    ParameterError,
    SampleError,
    ShardCountError,
    SinkError,
    SourceError,
    TarFormatError,
    TarprocError,
    TarprocWarning,
    TransportError,
    WireError,
)
from .samples import group_samples, read_samples, split_name
from .shards import ShardInfo, ShardWriter, parse_size
from .sinks import open_sink
from .sources import Network, expand_urls, open_source
from .tar import ReadPolicy, ReadStats, TarWriter, iter_members

if TYPE_CHECKING:
    from .dataset import Dataset, Loader, Mix
    from .index import IndexedShard, ShardIndex, build_index
    from .pcat import parallel_samples
    from .process import map_samples, shell_samples
    from .sort import SortStats, sort_samples
    from .transport import EpochEnd, Receiver, Sender

__version__ = "0.1.0"

# imported on first use, so that commands which don't need them start faster
_LAZY = {
    "IndexedShard": "index",
    "ShardIndex": "index",
    "build_index": "index",
    "map_samples": "process",
    "parallel_samples": "pcat",
    "shell_samples": "process",
    "SortStats": "sort",
    "sort_samples": "sort",
    "Receiver": "transport",
    "Sender": "transport",
    "EpochEnd": "transport",
    "Dataset": "dataset",
    "Loader": "dataset",
    "Mix": "dataset",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tarproc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "CacheWarning",
    "CompressedShardError",
    "CompressionError",
    "Dataset",
    "DatasetError",
    "DataWarning",
    "DecodeError",
    "DuplicateError",
    "EpochEnd",
    "IndexFileError",
    "IndexedShard",
    "JobError",
    "Loader",
    "Mix",
    "Network",
    "NetworkWarning",
    "OptionError",
    "ParameterError",
    "ReadPolicy",
    "ReadStats",
    "Receiver",
    "SampleError",
    "Sender",
    "ShardCountError",
    "ShardInfo",
    "ShardWriter",
    "SinkError",
    "SortStats",
    "SourceError",
    "TarFormatError",
    "TarWriter",
    "ShardIndex",
    "TarprocError",
    "TarprocWarning",
    "TransportError",
    "WireError",
    "__version__",
    "build_index",
    "expand_urls",
    "group_samples",
    "iter_members",
    "map_samples",
    "parallel_samples",
    "open_sink",
    "open_source",
    "parse_size",
    "read_samples",
    "shell_samples",
    "sort_samples",
    "split_name",
]
