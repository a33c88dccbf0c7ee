"""Writing samples into shards: ``ShardWriter`` and size parsing.

A shard is closed before a sample would take it past ``maxsize`` bytes (counting headers, padding
and the end blocks, i.e. the tar bytes as written before compression) or past ``maxcount`` samples,
unless the shard is still empty (a sample bigger than ``maxsize`` gets a shard of its own). A sample
is never split across shards and no shard is ever empty. Every shard is written atomically.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .compression import compression_for_name
from .errors import OptionError, SinkError, TarprocError
from .samples import Sample
from .sinks import Sink, open_sink
from .sources import local_path
from .tar import TarWriter, sample_members, tar_end_size

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text: str | int | float) -> int:
    """Parse a byte count: ``1e9``, ``1G``, ``500MB``, ``64MiB``, ``2GiB``, ``1048576``.

    K/M/G/T are powers of 1000; Ki/Mi/Gi/Ti powers of 1024; a trailing B is optional.

    >>> parse_size("1e9"), parse_size("500MB"), parse_size("2GiB")
    (1000000000, 500000000, 2147483648)
    """
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+]?[0-9]+)?)\s*([kKmMgGtT][iI]?)?[bB]?\s*", text)
    if not m:
        raise OptionError(f"bad size {text!r}; expected e.g. 1e9, 1G, 500MB or 64MiB")
    number = float(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if not number < 2**63:
        raise OptionError(f"size {text!r} is too large")
    return int(number)


DIRECTORY_SHARD_NAME = "shard-%06d.tar"  # the shards' names inside a directory given as the output
# the suffixes of a tar name, longest first (the sink compresses by the same suffix)
_TAR_SUFFIXES = (".tar.zstd", ".tar.bz2", ".tar.zst", ".tar.gz", ".tar.xz", ".tbz2", ".tzst", ".tar", ".tgz",
                 ".txz", ".tbz")


def shard_pattern(output: str) -> str:
    """A printf pattern for shard names, from an output name (tarsplit's ``-o``):

    - a name with a ``%`` field is a pattern, used as is: ``train-%06d.tar.gz``;
    - an existing local directory, or any name ending in ``/``, gets ``DIRECTORY_SHARD_NAME`` inside it;
    - a name ending in a tar suffix (``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.zst``, ``.tar.xz``,
      ``.tar.bz2``...) gets the shard number before that suffix, which also chooses the compression;
    - any other name is a prefix: ``-%06d.tar`` is added.

    A name that would give shard files starting with ``-`` (``-o .tar``, ``-o out/-%d.tar``) is an
    ``OptionError``, and so is a compression suffix without ``.tar`` (``val.gz``).

    >>> shard_pattern("out/train"), shard_pattern("val.tar.gz"), shard_pattern("y.tgz")
    ('out/train-%06d.tar', 'val-%06d.tar.gz', 'y-%06d.tgz')
    >>> shard_pattern("s3://bucket/val/"), shard_pattern("x-%03d.tar.zst")
    ('s3://bucket/val/shard-%06d.tar', 'x-%03d.tar.zst')
    """
    if output == "-":
        raise OptionError("shards are files: -o needs a name pattern or prefix, not '-'")
    lower = output.lower()
    suffix = next((s for s in _TAR_SUFFIXES if lower.endswith(s)), None)
    if "%" in output:
        pattern = output
    elif output.endswith("/") or _is_local_directory(output):
        pattern = output.rstrip("/") + "/" + DIRECTORY_SHARD_NAME
    elif suffix is not None:
        stem, tail = output[: -len(suffix)], output[-len(suffix):]
        pattern = stem + "-%06d" + tail
    elif compression_for_name(output) is not None:  # a compressed name that is not a tar's
        kind = output.rsplit(".", 1)[1]
        raise OptionError(
            f"bad shard name {output!r}: shards are tar files; write {output[: -len(kind) - 1]}.tar.{kind} "
            f"for compressed shards, or give a pattern such as train-%06d.tar.{kind}"
        )
    else:
        pattern = output + "-%06d.tar"
    try:
        first, second = pattern % 0, pattern % 1
    except (TypeError, ValueError):
        raise OptionError(f"bad shard name pattern {output!r}; expected one %d-style field, e.g. train-%06d.tar") from None
    if first == second or "\x00" in first:
        raise OptionError(f"bad shard name pattern {output!r}: it must give each shard its own name, e.g. train-%06d.tar")
    name = first.rsplit("/", 1)[-1]
    if not output.startswith("pipe:") and (not name or name.startswith("-")):
        raise OptionError(
            f"bad shard name {output!r}: the shards would be named like {name!r}; give a name before the "
            f"number (train-%06d.tar, train.tar.gz) or a directory (out/)"
        )
    return pattern


def _is_local_directory(output: str) -> bool:
    path = local_path(output)
    return path is not None and path != "" and os.path.isdir(path)


@dataclass
class ShardInfo:
    """What was written to one shard (one line of the manifest)."""

    shard: str
    samples: int
    bytes: int  # bytes of the file as written (after compression)
    tar_bytes: int  # uncompressed tar bytes
    sha256: str | None
    first_key: str
    last_key: str
    closed_by: str  # "maxsize", "maxcount" or "end"

    def to_json(self) -> str:
        import json  # json, shlex and subprocess are imported where used: commands start without them

        return json.dumps(asdict(self), sort_keys=False)


class ShardWriter:
    """Write samples into numbered shards, closing each at ``maxsize`` bytes or ``maxcount`` samples.

    ``pattern`` names the shards as ``shard_pattern`` reads it (a ``%d`` pattern, a tar name, a
    directory or a prefix).

    ``on_shard`` is called with each finished shard's ``ShardInfo``; ``post`` is a shell command run
    on each finished shard (``{}`` is replaced by its quoted URL, else the URL is appended), and a
    failure stops writing with ``SinkError``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with ShardWriter(os.path.join(d, "s-%03d.tar"), maxcount=2) as w:
    ...     for i in range(5):
    ...         w.write({"__key__": f"k{i}", "txt": b"x"})
    >>> sorted(os.listdir(d))
    ['s-000.tar', 's-001.tar', 's-002.tar']
    """

    def __init__(
        self,
        pattern: str,
        *,
        maxsize: int | None = None,
        maxcount: int | None = None,
        start: int = 0,
        maxshards: int | None = None,
        post: str | None = None,
        on_shard: Callable[[ShardInfo], None] | None = None,
        digest: bool = False,
        writer_options: dict[str, Any] | None = None,
        compression: str | None = "auto",
    ) -> None:
        if maxsize is not None and maxsize <= 0:
            raise OptionError("maxsize must be positive")
        if maxcount is not None and maxcount <= 0:
            raise OptionError("maxcount must be positive")
        if maxshards is not None and maxshards <= 0:
            raise OptionError("maxshards must be positive")
        self.pattern = shard_pattern(pattern)
        self.maxsize = maxsize
        self.maxcount = maxcount
        self.index = start
        self.maxshards = maxshards
        self.post = post
        self.on_shard = on_shard
        self.digest = digest
        self.writer_options = writer_options or {}
        self.compression = compression
        self.shards: list[ShardInfo] = []
        self._sink: Sink | None = None
        self._tar: TarWriter | None = None
        self._first_key = ""  # of the shard being written

    def _open(self, first_key: str) -> TarWriter:
        if self.maxshards is not None and len(self.shards) >= self.maxshards:
            raise TarprocError(
                f"input has more samples than {self.maxshards} shard(s) can hold (--maxshards); "
                f"stopped before sample {first_key!r}"
            )
        url = self.pattern % self.index
        self.index += 1
        self._sink = open_sink(url, compression=self.compression, digest=self.digest)
        self._tar = TarWriter(self._sink, **self.writer_options)
        self._first_key = first_key
        return self._tar

    def _close(self, reason: str) -> None:
        assert self._sink is not None and self._tar is not None
        sink, tar = self._sink, self._tar
        self._sink = self._tar = None
        try:
            tar.close()
        except BaseException:
            sink.abort()
            raise
        sink.commit()
        info = ShardInfo(
            sink.url, tar.samples, sink.bytes, tar.offset, sink.sha256, self._first_key, tar.last_key or "", reason
        )
        self.shards.append(info)
        if self.post:
            self._run_post(info.shard)
        if self.on_shard is not None:
            self.on_shard(info)

    def _run_post(self, url: str) -> None:
        assert self.post is not None
        import shlex
        import subprocess

        quoted = shlex.quote(url)
        cmd = self.post.replace("{}", quoted) if "{}" in self.post else f"{self.post} {quoted}"
        # our stdin is the input being split and our stdout may carry data: keep the command off both
        status = subprocess.run(cmd, shell=True, stdin=subprocess.DEVNULL, stdout=2).returncode
        if status != 0:
            raise SinkError(f"--post command failed with status {status}: {cmd}", url)

    def write(self, sample: Sample) -> None:
        """Add one sample, opening and closing shards as the limits require."""
        key, members = sample_members(sample)
        size = sum(TarWriter.member_size(name, len(data)) for name, data in members)
        tar = self._tar
        if tar is not None and tar.samples:
            if self.maxcount is not None and tar.samples >= self.maxcount:
                self._close("maxcount")
            elif self.maxsize is not None and tar.offset + size + tar_end_size(tar.offset + size) > self.maxsize:
                self._close("maxsize")
        tar = self._tar or self._open(key)
        try:
            tar.write_members(key, members)
        except BaseException:
            self.abort()
            raise

    def close(self) -> list[ShardInfo]:
        """Finish the last shard; returns the list of shards written."""
        if self._tar is not None:
            self._close("end")
        return self.shards

    def abort(self) -> None:
        """Throw away the shard being written (finished shards stay)."""
        if self._sink is not None:
            self._sink.abort()
        self._sink = self._tar = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
