"""Sources: turn the URLs users type into readable byte streams.

Grammar: ``-`` (stdin), plain paths, ``file:PATH``, ``pipe:CMD`` (a shell command whose stdout is
the stream), and any fsspec URL (``http(s)://``, ``s3://``, ``gs://``, ``memory://``...). Brace
lists (``train-{0000..0147}.tar``) are expanded and ``::`` joins several lists. Compression (gzip,
zstd, bz2, xz) is detected from the first bytes, whatever the name.

Every stream is a context manager: leaving it closes the file, and for ``pipe:`` always reaps the
child, killing it first if we stopped reading early. A command that exits non-zero after we read
its whole output is an error.
"""

from __future__ import annotations

import io
import itertools
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

from braceexpand import UnbalancedBracesError, braceexpand  # type: ignore[attr-defined]

from ..compression import DecompressingReader, detect, unsupported
from ..errors import CompressionError, OptionError, SourceError, TarprocError
from . import remote
from .prefetch import Ahead, Budget, Prefetcher
from .remote import Identity, Network, configure, describe, settings

if TYPE_CHECKING:  # imported where used (pipe:, the cache): commands start without them
    import subprocess

    from .cache import ShardCache


def expand_urls(args: Iterable[str], list_files: Iterable[str] = ()) -> list[str]:
    """Expand brace lists and ``::`` joins in ``args``, then add the URLs listed in ``list_files``.

    A list file has one URL per line (blank lines and ``#`` comments ignored); ``-`` reads the
    list from stdin.

    >>> expand_urls(["a-{0..2}.tar::b.tar"])
    ['a-0.tar', 'a-1.tar', 'a-2.tar', 'b.tar']
    """
    urls: list[str] = []
    for arg in args:
        for part in arg.split("::"):
            if part:
                urls.extend(expand_braces(part))
    for list_file in list_files:
        for line in read_list_file(list_file):
            urls.extend(expand_urls([line]))
    return urls


MAX_BRACE_URLS = 1_000_000  # URLs one argument may expand to
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d{1,18}))?\}")


def expand_braces(text: str) -> list[str]:
    """``text``'s brace expansion: at most MAX_BRACE_URLS URLs, and balanced braces (OptionError)."""
    # braceexpand builds a range whole: count the ranges' sizes first
    count = 1
    for lo, hi, step in _RANGE.findall(text):
        if max(len(lo), len(hi)) > 18:  # any range of such numbers is too long (or would be)
            count = MAX_BRACE_URLS + 1
            break
        count *= abs(int(hi) - int(lo)) // max(1, abs(int(step or 1))) + 1
    if count > MAX_BRACE_URLS:
        raise OptionError(f"{text!r} expands to more than {MAX_BRACE_URLS:,} URLs; list them in a file (-T FILE)")
    try:
        urls = list(itertools.islice(braceexpand(text), MAX_BRACE_URLS + 1))
    except UnbalancedBracesError:
        raise OptionError(f"unbalanced braces in {text!r}") from None
    if len(urls) > MAX_BRACE_URLS:
        raise OptionError(f"{text!r} expands to more than {MAX_BRACE_URLS:,} URLs; list them in a file (-T FILE)")
    return urls


def read_list_file(path: str, what: str = "list file") -> list[str]:
    """The lines of a list file (``-`` = stdin), stripped, without blank lines and ``#`` comments."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise SourceError(f"cannot read the {what}: {e.strerror}", path) from None
    except UnicodeDecodeError as e:
        raise SourceError(f"the {what} is not UTF-8 text (byte {e.start})", path) from None
    return [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]


def is_fsspec_url(url: str) -> bool:
    """True for ``scheme://...`` URLs other than ``file://`` (handled as a local path)."""
    scheme, sep, _ = url.partition("://")
    return bool(sep) and scheme.replace("+", "").isalnum() and scheme != "file"


def local_path(url: str) -> str | None:
    """The local path a URL names (``file:``, ``file://`` or plain), or None for other schemes."""
    if url.startswith("file://"):
        return url[len("file://") :]
    if url.startswith("file:"):
        return url[len("file:") :]
    if url.startswith("pipe:") or url == "-" or is_fsspec_url(url):
        return None
    return url


class Source:
    """A readable stream from a URL, decompressed if needed; use as a context manager.

    ``read(n)`` returns at most ``n`` bytes and ``b""`` at the end. Read errors of the underlying
    file, process or connection become ``SourceError`` naming the URL and byte offset.
    """

    def __init__(self, url: str, raw: Any, proc: subprocess.Popen[bytes] | None = None, until: int | None = None) -> None:
        self.url = url
        self.raw = raw
        self.proc = proc
        self.offset = 0  # compressed (raw) bytes read
        # reads stop short of this many bytes until they reach it (then go on as asked): a reader
        # that expects to end there reads no more than it needs (a part of a local shard)
        self._until = until
        self._eof = False
        self._closed = False
        try:
            head = self._raw_read(8)
            # a short first read (pipes) still must give enough bytes to detect compression
            while 0 < len(head) < 6:
                more = self._raw_read(8 - len(head))
                if not more:
                    break
                head += more
        except BaseException:
            # interrupted or failed before any 'with' block owns us: still kill and reap a child
            self._eof = False
            self.close()
            raise
        kind = detect(head)
        other = unsupported(head) if kind is None else None
        if other is not None:
            try:
                self.close()
            except TarprocError:
                pass
            name, command = other
            raise CompressionError(f"{name} compressed data, not read here: decompress it first, e.g. "
                                   f"'pipe:{command} FILE'", url)
        self.compression = kind
        self._reader: Any
        if kind is None:
            self._prefix = head
            self._reader = None
        else:
            self._prefix = b""
            self._reader = DecompressingReader(_RawAdapter(self), kind, prefix=head, url=url)

    def _raw_read(self, n: int) -> bytes:
        try:
            data = self.raw.read(n)
        except TarprocError:
            raise
        except Exception as e:  # OSError, aiohttp.ClientPayloadError, botocore errors...
            raise SourceError(f"read failed at byte {self.offset}: {describe(e)}", self.url) from None
        if data is None:  # a non-blocking stream; not expected here
            data = b""
        if not data:
            self._eof = True
        self.offset += len(data)
        return bytes(data) if not isinstance(data, bytes) else data

    def _regular_file(self) -> bool:
        """Whether this is a plain (uncompressed) regular local file (not a fifo, a pipe, a device)."""
        if self._reader is not None or not isinstance(self.raw, io.FileIO):
            return False
        try:
            return stat.S_ISREG(os.fstat(self.raw.fileno()).st_mode)
        except (OSError, ValueError):
            return False

    def member_rereader(self, max_member_size: int, consumed: int) -> Callable[[str, int], bytes | None] | None:
        """For a plain regular local file: a function that reads a member back by name from where
        the reader started, up to a stream offset (a link's target; ``tar.MemberFinder``); else
        None. ``consumed``: the bytes the reader has had so far (read or skipped), so that a reader
        that did not start at the file's first byte (stdin positioned further on) looks there."""
        found = self.file_origin()
        if found is None:
            return None
        from ..tar import MemberFinder

        file, at = found
        return MemberFinder(file.fileno(), at - consumed, max_member_size).find

    def file_origin(self) -> tuple[io.FileIO, int] | None:
        """For a plain (uncompressed) local file: the file, and the file offset of the next byte
        this stream will hand out (what a reader starting now counts as its byte 0: some may have
        been read already), so that data can be left in the file and copied from there
        (``tar.FileRange``); else None."""
        if not self._regular_file():
            return None
        try:
            return self.raw, self.raw.tell() - len(self._prefix)
        except (OSError, ValueError):
            return None

    def skipper(self) -> Callable[[int], int] | None:
        """For a plain (uncompressed) local file: a function that moves ``n`` bytes forward without
        reading them and returns how many it moved (fewer at the end of the file); else None."""
        if not self._regular_file():
            return None
        raw, fd = self.raw, self.raw.fileno()
        size = os.fstat(fd).st_size
        origin = raw.tell() - self.offset  # where the file is is origin + self.offset: one seek a skip

        def skip(n: int) -> int:
            nonlocal size
            held = min(n, len(self._prefix))  # bytes read already to detect compression
            if held:
                self._prefix = self._prefix[held:]
            if n - held > size - origin - self.offset:
                size = os.fstat(fd).st_size  # short of the size seen last: a file written as it is read may have grown
            moved = max(0, min(n - held, size - origin - self.offset))
            if moved:
                raw.seek(moved, os.SEEK_CUR)
                self.offset += moved
            return held + moved

        return skip

    def read(self, n: int = -1) -> bytes:
        if self._reader is not None:
            return self._reader.read(n)  # type: ignore[no-any-return]
        if self._prefix:
            head = self._prefix
            if 0 <= n < len(head):
                self._prefix = head[n:]
                return head[:n]
            self._prefix = b""
            return head
        if self._until is not None:
            if self.offset >= self._until:
                self._until = None
            elif n < 0 or n > self._until - self.offset:
                n = self._until - self.offset
        return self._raw_read(n)

    def close(self) -> None:
        """Close the stream; reap a ``pipe:`` child and check its exit status."""
        if self._closed:
            return
        self._closed = True
        early = not self._eof
        try:
            self.raw.close()
        except Exception:
            pass
        if self.proc is not None:
            _reap(self.proc, self.url, early)

    def __enter__(self) -> Source:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        if exc_type is GeneratorExit or not self._eof:
            # we stopped reading early: a pipe's exit status means nothing then
            self._eof = False
            try:
                self.close()
            except TarprocError:
                pass
            return
        # an error after the whole stream was read: a failed command is the cause worth naming
        try:
            self.close()
        except SourceError as failed:
            raise failed from exc


class _RawAdapter:
    """Gives DecompressingReader access to Source's error-wrapping raw reads."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def read(self, n: int = -1) -> bytes:
        return self.source._raw_read(n)


def _reap(proc: subprocess.Popen[Any], url: str, early: bool) -> None:
    """Wait for a pipe child; stop it first if we stopped reading early (its status is moot then)."""
    if early:
        from ..procgroup import stop_group

        stop_group(proc)
        return
    status = proc.wait()
    if status != 0 and status != 141 and status != -signal.SIGPIPE:
        raise SourceError(f"command exited with status {status} (a pipe: command can't be read again from the byte "
                          "it reached: give the URL itself to have failed reads retried)", url)


def _regular_stdin(stream: Any) -> io.FileIO | None:
    """stdin as an ``io.FileIO`` over its descriptor, which closing leaves open, where it is a
    regular file (``cmd < file``) of which nothing is buffered yet, so that it is read as a local
    file is (``Source.skipper``, ``Source.file_origin``) from where it stands; else None."""
    try:
        fd = stream.fileno()
        if not stat.S_ISREG(os.fstat(fd).st_mode) or stream.tell() != os.lseek(fd, 0, os.SEEK_CUR):
            return None
        return io.FileIO(fd, "rb", closefd=False)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None


def enlarge_pipe(fileobj: Any, size: int = 1 << 20) -> None:
    """Grow a pipe's kernel buffer (Linux): fewer context switches between the two ends.

    Best effort: other platforms, non-pipes and a lower ``/proc/sys/fs/pipe-max-size`` are ignored.
    """
    try:
        import fcntl
        import stat

        fd = fileobj.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ValueError, AttributeError, ImportError):
        pass


def open_source(
    url: str, *, stdin: IO[bytes] | None = None, on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
    offset: int = 0, network: Network | None = None, prefetcher: Prefetcher | None = None, end: int | None = None,
) -> Source:
    """Open a URL for reading; raises ``SourceError`` naming it when it can't be opened.

    ``on_start`` is called with a ``pipe:`` command's process as soon as it starts, before its
    first byte is read, so that another thread can end a command that stalls. ``offset``: start
    reading at that byte of a local file or of a URL whose store takes range requests (not stdin
    or ``pipe:``; the stream's bytes are counted from there). Remote URLs are read as ``network``
    says (default: ``remote.settings()``): retries, read-ahead, the shard cache; ``prefetcher``:
    one that may have opened this source already (``read_samples`` and the Dataset's readers);
    ``end``: where the reader expects to stop in a local file or a remote URL (a hint: it may read on).
    """
    if offset and (url == "-" or url.startswith("pipe:")):
        raise SourceError(f"can't start reading at byte {offset}: stdin and pipe: commands can only be read from the start", url)
    if url == "-":
        stream = stdin if stdin is not None else sys.stdin.buffer
        redirected = _regular_stdin(stream)
        if redirected is not None:  # '< file': read as the file it is (skips, data left in it)
            return Source("-", redirected)
        enlarge_pipe(stream)
        return Source("-", _Unclosable(stream))
    if url.startswith("pipe:"):
        cmd = url[len("pipe:") :]
        if not cmd.strip():
            raise SourceError("pipe: needs a command, e.g. 'pipe:curl -s URL'", url)
        import subprocess

        from ..procgroup import start_group

        # a group of its own: an early stop kills the whole pipeline it starts
        proc = start_group(cmd, shell=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        if on_start is not None:
            on_start(proc)
        assert proc.stdout is not None
        return Source(url, _Unclosable(proc.stdout, closes=True), proc)
    path = local_path(url)
    if path is not None:
        try:
            f = open(path, "rb", buffering=0)
        except FileNotFoundError:
            raise SourceError("no such file", url) from None
        except IsADirectoryError:
            raise SourceError("is a directory, not a tar file", url) from None
        except OSError as e:
            raise SourceError(f"cannot open: {e.strerror}", url) from None
        if offset:
            f.seek(offset)
        return Source(url, f, until=None if end is None or end <= offset else end - offset)
    if prefetcher is None:
        return Source(url, open_remote(url, offset, network, end=end))
    raw = prefetcher.take(url, offset)
    return Source(url, raw if raw is not None else open_remote(url, offset, network, prefetcher.budget, end))


def read_to_end(source: Any, limit: int | None = None, head: bytes = b"") -> bytes:
    """``head`` and what follows it in ``source`` (an open stream), up to ``limit`` bytes in all
    (None: to the end). A source's ``read(n)`` may return less than ``n`` before its end (a pipe,
    a remote read): this reads until it returns nothing. Ask for ``limit + 1`` to tell a source of
    exactly ``limit`` bytes from a longer one.

    >>> read_to_end(io.BytesIO(b"abcdef"), 4, b"<"), read_to_end(io.BytesIO(b"abcdef"))
    (b'<abc', b'abcdef')
    """
    chunks = [head]
    got = len(head)
    while limit is None or got < limit:
        chunk = source.read(1 << 20 if limit is None else min(1 << 20, limit - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def open_remote(url: str, offset: int = 0, network: Network | None = None, budget: Budget | None = None,
                end: int | None = None) -> Any:
    """The raw stream of a remote URL from byte ``offset`` on, for a ``Source``. With a shard
    cache (``network.cache_dir``): read from the cache, the entry, or the copy being filled (by
    this process, started now if nobody fills it, or by another one: ``sources.cache``). Else,
    or when the shard can't have an entry: the store's bytes (retried, reconnected at the byte
    reached, read ahead by a thread within ``budget``, a ``Prefetcher``'s, shared with the shards
    opened ahead, else ``network.prefetch`` bytes). ``end``: where the reader expects to stop
    (``RemoteReader``: nothing further is asked for)."""
    network = network if network is not None else remote.settings()
    cache = shard_cache(network)
    if cache is not None:
        # its version: learned before (the Dataset asks for all at once, at its start), else a HEAD request
        identity = cache.known.get(url) or remote.identify(url, network.timeout, network)
        if identity is not None and cache.cacheable(identity):
            return cache.open(url, identity, network, offset)
    raw: Any = remote.RemoteReader(url, offset, network, end=end)
    if network.prefetch:
        raw = Ahead(raw, network.prefetch, budget)
    return raw


_caches: dict[tuple[str, int | None], ShardCache] = {}


def shard_cache(network: Network) -> ShardCache | None:
    """The process's ``ShardCache`` for ``network.cache_dir`` (None without one)."""
    if network.cache_dir is None:
        return None
    key = (network.cache_dir, network.cache_size)
    cache = _caches.get(key)
    if cache is None:
        from .cache import ShardCache

        cache = _caches[key] = ShardCache(network.cache_dir, network.cache_size)  # a CacheWarning each
    return cache


def finish_fills(network: Network) -> None:
    """Wait for the shard cache's fills this process started (a reader that came to its end:
    what it started is published before the process may exit). Nothing without a cache."""
    cache = shard_cache(network)
    if cache is not None:
        cache.wait()


class _Unclosable:
    """stdin, or a pipe, as a Source's raw stream.

    stdin must stay open after one 'shard' has been read from it (``closes=False``). Reads wait
    for a full chunk: fewer wake-ups between the two ends of a pipe beat lower latency here.
    """

    def __init__(self, stream: IO[bytes], closes: bool = False) -> None:
        self.stream = stream
        self.closes = closes

    def read(self, n: int = -1) -> bytes:
        return self.stream.read(n)

    def close(self) -> None:
        if self.closes:
            self.stream.close()


__all__ = [
    "Identity", "Network", "Prefetcher", "Source", "configure", "expand_braces", "expand_urls", "finish_fills",
    "is_fsspec_url", "local_path", "open_remote", "open_source", "read_list_file", "read_to_end", "settings",
    "shard_cache",
]
