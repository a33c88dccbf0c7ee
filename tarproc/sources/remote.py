"""Remote shards read as one stream that survives dropped connections.

A ``RemoteReader`` reads an object from a byte on. When a read fails in a way that may pass (a
reset, a timeout, a body shorter than announced, a 5xx or 429 answer), it waits (exponential
backoff with jitter), reopens the object **at the byte reached** with a range request and goes on;
one warning line per retry names the URL and the byte. A read slower than a floor (``min_speed``
bytes/s over ``speed_time`` seconds, as curl's ``--speed-limit``) is such a failure too, and so is a
refused connection to a host this process has reached before (a store or proxy restarting); a refusal
from a host never reached is a wrong address, said at once. The tar reader above checks the stitched
stream as it checks any other (headers, checksums, the end-of-archive blocks). When the retries are
used up, the failure is the one-line ``SourceError`` naming the URL and byte.

``http(s)://`` is read with the standard library (``urllib``: ``HTTP(S)_PROXY`` and redirects as
usual); every other scheme through fsspec (``s3://``, ``gs://``...: its options come from fsspec's
configuration, e.g. ``FSSPEC_S3_ENDPOINT_URL``, or the store's own, e.g. ``AWS_ENDPOINT_URL``).
A server that ignores range requests is read from the start again and the bytes before the one
reached skipped, said once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ..errors import NetworkWarning, OptionError, SourceError, TarprocError, warn

DEFAULT_RETRIES = 5
DEFAULT_TIMEOUT = 60.0  # seconds a connect or a single read may take
DEFAULT_PREFETCH = 32 << 20  # bytes read ahead of each reader, for remote shards
DEFAULT_MIN_SPEED = 1024  # bytes/s: a read slower than this over DEFAULT_SPEED_TIME is retried
DEFAULT_SPEED_TIME = 30.0
BACKOFF_FIRST = 0.5  # seconds before the first retry; doubled each time, with jitter
BACKOFF_MAX = 30.0
_CHUNK = 1 << 20
_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class Network:
    """How remote shards are read: retries, timeouts, read-ahead and the shard cache.

    A frozen value, checked when it is made (``OptionError`` naming the field). Give it to
    ``tarproc.Dataset(urls, network=Network(...))``; the commands make theirs from ``--retries``,
    ``--timeout``, ``--prefetch``, ``--cache``, ``--cache-size``, ``--min-speed`` and
    ``--speed-time``. Local files and ``pipe:`` commands ignore it.

    Attributes:
        retries: attempts after a failed read or open (default 5; 0: none). A read that fails in a
            way that may pass (a reset, a timeout, a short body, a 5xx or 429 answer, a read under
            ``min_speed``) waits, then goes on at the byte reached with a range request; each retry
            is a ``NetworkWarning``. The count starts again after a retry that gets
            ``min_speed * speed_time`` bytes further.
        timeout: seconds a connect or a single read may wait (default 60; None: no limit; > 0).
            ``http(s)://`` only: fsspec stores take their own (``FSSPEC_S3='{"config_kwargs": ...}'``).
        prefetch: bytes read ahead of each reader, in the shard it reads and its next ones (up to
            4, opened meanwhile), all together (default 32 MiB; 0: no read-ahead).
        cache_dir: a folder of this machine for verified copies of remote shards
            (``DIR/shards``: each shard downloaded once per node, later epochs read the copies;
            see ``tarproc.sources.cache``); the Dataset also keeps its sample counts there
            (``DIR/counts``). Default None: no shard cache (the counts go to
            ``$TARPROC_CACHE_DIR``, else ``~/.cache/tarproc``).
        cache_size: bytes the copies in ``cache_dir`` may take, the least recently used evicted
            first (default None: no bound; > 0; needs ``cache_dir``).
        backoff: seconds before the first retry, doubled at each next one with jitter, at most 30
            (default 0.5); a ``Retry-After`` answer waits what it asks.
        min_speed: bytes per second under which a read is a failure when it lasts ``speed_time``
            seconds (the time spent waiting in reads, averaged), retried as a cut connection is
            (default 1024; 0: no floor), as curl's ``--speed-limit``.
        speed_time: the seconds of ``min_speed`` (default 30; > 0).

    >>> Network(retries=8, cache_dir="/nvme/tarproc").prefetch
    33554432
    >>> Network(timeout=0)
    Traceback (most recent call last):
    ...
    tarproc.errors.OptionError: bad timeout 0; must be > 0 seconds (or None: no limit)
    """

    retries: int = DEFAULT_RETRIES
    timeout: float | None = DEFAULT_TIMEOUT
    prefetch: int = DEFAULT_PREFETCH
    cache_dir: str | None = None
    cache_size: int | None = None
    backoff: float = BACKOFF_FIRST
    min_speed: int = DEFAULT_MIN_SPEED
    speed_time: float = DEFAULT_SPEED_TIME

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise OptionError(f"bad retries {self.retries!r}; must be a number >= 0")
        if self.timeout is not None and not self.timeout > 0:
            raise OptionError(f"bad timeout {self.timeout!r}; must be > 0 seconds (or None: no limit)")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise OptionError(f"bad prefetch {self.prefetch!r}; must be a number of bytes >= 0")
        if self.cache_size is not None and (not isinstance(self.cache_size, int) or self.cache_size <= 0):
            raise OptionError(f"bad cache_size {self.cache_size!r}; must be a number of bytes > 0 (or None)")
        if self.cache_size is not None and self.cache_dir is None:
            raise OptionError("cache_size bounds the shard cache: give cache_dir too")
        if isinstance(self.min_speed, bool) or not isinstance(self.min_speed, int) or self.min_speed < 0:
            raise OptionError(f"bad min_speed {self.min_speed!r}; must be a number of bytes per second >= 0 "
                              "(0: no floor)")
        if (isinstance(self.speed_time, bool) or not isinstance(self.speed_time, (int, float))
                or not (self.speed_time > 0 and math.isfinite(self.speed_time))):
            raise OptionError(f"bad speed_time {self.speed_time!r}; must be > 0 seconds")


_settings = Network()


def configure(**changes: Any) -> Network:
    """Change this process's default ``Network`` (what ``open_source`` uses when given none); the
    commands call it with their ``--retries``, ``--timeout``, ``--prefetch``, ``--cache`` and
    ``--min-speed``."""
    global _settings
    _settings = dataclasses.replace(_settings, **changes)
    return _settings


def settings() -> Network:
    """This process's default ``Network``."""
    return _settings


def warn_stderr(message: str) -> None:
    """Where a reader's warnings go when the caller gives no ``warn``: a ``NetworkWarning``
    (``tarproc.errors.warn``); the commands print it as ``tarcat: warning: URL: ...``."""
    warn(message, NetworkWarning)


_reached: set[str] = set()  # hosts (netloc) that answered a request of this process
_reached_lock = threading.Lock()


def _netloc(url: str) -> str:
    return url.split("/", 3)[2] if "//" in url else url


def mark_reached(url: str) -> None:
    """Note that ``url``'s host has answered this process. From then on a refused connection to it
    is a server restarting, retried, not a wrong address (said at once). A process that reads for
    another (a Dataset's worker) calls it for the hosts its parent reached."""
    netloc = _netloc(url)
    with _reached_lock:
        _reached.add(netloc)


def _new_locks_in_child() -> None:
    """A forked child (a DataLoader worker) may inherit these locks held by another thread: new ones."""
    global _reached_lock, _said_lock
    _reached_lock, _said_lock = threading.Lock(), threading.Lock()


def _was_reached(url: str) -> bool:
    with _reached_lock:
        return _netloc(url) in _reached


class Identity(NamedTuple):
    """What names a remote object's version: its size and its ETag (or last-modified time)."""

    size: int
    stamp: str | None


class _Transient(Exception):
    """A failure worth a retry (a 5xx answer, a short body), with its own description."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait  # the server's Retry-After, when it gave one


def describe(e: BaseException) -> str:
    """One short line about an exception from a library (some put whole responses in there)."""
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return _one_line(str(text)) or type(e).__name__


def _one_line(text: str, last: bool = False) -> str:
    """The first (or ``last``) line of ``text`` that says something, at most 200 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = (lines[-1] if last else lines[0]) if lines else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _transient(e: BaseException) -> bool:
    """Whether a failure may pass: not a missing object, a bad certificate or a bad URL (a refusal
    may: from a host that answered before, ``RemoteReader`` retries it)."""
    if isinstance(e, _Transient):
        return True
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotImplementedError, ValueError,
                      ImportError, TypeError, TarprocError)):
        return False
    import socket

    ssl = sys.modules.get("ssl")  # loaded where it failed
    if ssl is not None and isinstance(e, ssl.SSLCertVerificationError):  # a certificate won't change
        return False
    if isinstance(e, socket.gaierror):  # a name that doesn't resolve won't start to; a busy resolver may
        return e.errno == socket.EAI_AGAIN
    return isinstance(e, Exception)


# -- opening at a byte: http(s) with urllib, the rest with fsspec -----------------------------------


class _Opened(NamedTuple):
    stream: Any  # .read(n), .close()
    start: int  # the byte its first read returns
    identity: Identity | None


def _open_http(url: str, offset: int, timeout: float | None, window: int | None = None) -> _Opened:
    """``url``'s bytes from ``offset`` on, up to ``window`` (exclusive) when given."""
    import http.client
    import urllib.error
    import urllib.request

    headers = {"User-Agent": "tarproc", "Accept-Encoding": "identity"}
    if offset or window is not None:
        headers["Range"] = f"bytes={offset}-{window - 1 if window is not None else ''}"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - the user's URL
    except urllib.error.HTTPError as e:
        e.close()
        raise _http_error(e, url, offset) from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, BaseException):
            raise reason from None  # the OSError underneath: a timeout, a reset, a refusal
        raise SourceError(f"cannot open: {_one_line(str(reason))}", url) from None
    except http.client.InvalidURL as e:
        raise SourceError(f"cannot open: {describe(e)}", url) from None
    length = response.headers.get("Content-Length")
    total: int | None = None
    start = 0
    if response.status == 206:
        content_range = response.headers.get("Content-Range", "")
        first, _, size = content_range.removeprefix("bytes ").partition("/")
        start = int(first.partition("-")[0]) if first.partition("-")[0].isdigit() else -1
        if start != offset:
            response.close()
            raise SourceError(f"asked for the bytes from {offset} on, the server sent {content_range[:100]!r}", url)
        total = int(size) if size.isdigit() else None
    elif length is not None and length.isdigit():
        total = int(length)
    stamp = response.headers.get("ETag") or response.headers.get("Last-Modified")
    stream: Any = _Response(response, timeout)
    if response.geturl().startswith("http://") and not response.chunked and response.length:  # not after a
        stream = _SocketBody(response, timeout)  # redirect to https: the socket holds TLS records there
    return _Opened(stream, start, Identity(total, stamp) if total is not None else None)


def _http_error(e: Any, url: str, offset: int) -> Exception:
    """What an HTTP error answer means here: a failure to retry (``_Transient``) or a one-line
    ``SourceError``."""
    reason = str(e.reason or "")
    last = _one_line(reason, last=True)
    if e.code == 416:
        return SourceError(f"can't start reading at byte {offset}: past the end (HTTP 416)", url)
    if e.code in _RETRY_STATUS:
        retry_after = e.headers.get("Retry-After") if e.headers else None
        return _Transient(f"HTTP {e.code} {last}".rstrip(), _seconds(retry_after))
    if e.code == 404:
        return SourceError("not found (HTTP 404)", url)
    if 300 <= e.code < 400 and "\n" in reason.strip():  # urllib's words for a loop: lines, the last the answer's
        return SourceError(f"cannot open: a redirect loop or too many redirects (last answer: HTTP {e.code} {last})",
                           url)
    return SourceError(f"cannot open: HTTP {e.code} {last}".rstrip(), url)


class _Response:
    """An ``http.client`` answer (chunked, TLS, no length) read one receive at a time (``read1``),
    each bounded by the timeout, and no more receives once a read has lasted the timeout: a server
    that sends a byte now and then can't hold a read forever."""

    def __init__(self, response: Any, timeout: float | None) -> None:
        self.response = response
        self.timeout = timeout

    def read(self, n: int) -> bytes:
        parts = []
        began = time.monotonic()
        while n > 0:
            data = self.response.read1(n)
            if not data:
                break
            parts.append(data)
            n -= len(data)
            if self.timeout is not None and time.monotonic() - began >= self.timeout:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self.response.close()


class _SocketBody:
    """A plain-HTTP response body of known length, read from the socket with one system call a
    read (``MSG_WAITALL``: the GIL is let go once for 512 KiB, not once for each 64 KiB that came
    in; a read-ahead thread then keeps up with the tar reader). The timeout is the kernel's
    (``SO_RCVTIMEO``): on Linux it bounds the whole call, and a read that has some bytes when it
    expires returns them, so a server that sends a byte now and then can't hold a read forever."""

    def __init__(self, response: Any, timeout: float | None) -> None:
        import socket
        import struct

        self.response = response
        self.left = int(response.length)
        fp = response.fp
        self.prefix = fp.read(len(fp.peek(1))) if self.left else b""  # what http.client had buffered
        self.left -= len(self.prefix)
        self.sock = socket.socket(fileno=os.dup(fp.fileno()))
        self.sock.setblocking(True)
        if timeout is not None:
            seconds = int(timeout)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                 struct.pack("ll", seconds, int((timeout - seconds) * 1e6)))

    def read(self, n: int) -> bytes:
        if self.prefix:
            data, self.prefix = self.prefix[:n], self.prefix[n:]
            return data
        if self.left <= 0:
            return b""
        import socket

        try:
            data = self.sock.recv(min(n, self.left), socket.MSG_WAITALL)
        except BlockingIOError:  # SO_RCVTIMEO passed without a byte
            raise TimeoutError("timed out") from None
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.sock.close()
        self.response.close()


def _backoff(network: Network, attempt: int, e: BaseException, first_wait: float | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (from 1): doubled each time from ``network.backoff``,
    with jitter (``first_wait`` instead for the first), at least the server's Retry-After, at most
    ``BACKOFF_MAX``."""
    import random

    wait = network.backoff * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
    if attempt == 1 and first_wait is not None:
        wait = first_wait
    return min(BACKOFF_MAX, max(wait, getattr(e, "wait", None) or 0.0))


def _seconds(value: str | None) -> float | None:
    """A Retry-After header: seconds, or an HTTP date."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    import email.utils

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def url_to_fs(url: str) -> tuple[Any, str]:
    """fsspec's filesystem and path for a URL; ``SourceError`` naming it when there is none."""
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise SourceError(f"no filesystem for this URL ({describe(e)})", url) from None
    except Exception as e:
        raise SourceError(f"cannot open: {describe(e)}", url) from None
    return fs, path


def _open_fsspec(url: str, offset: int, timeout: float | None, window: int | None = None) -> _Opened:
    fs, path = url_to_fs(url)
    try:
        f = fs.open(path, "rb")
    except FileNotFoundError as e:
        cause = e.__cause__ or e.__context__
        raise SourceError(f"not found ({describe(cause)})" if cause else "not found", url) from None
    except (PermissionError, ValueError, NotImplementedError) as e:
        raise SourceError(f"cannot open: {describe(e)}", url) from None
    if offset:
        f.seek(offset)
    details = getattr(f, "details", None) or {}
    size = getattr(f, "size", None)
    identity = None
    if type(size) is int:
        lowered = {str(k).lower(): v for k, v in details.items()}
        stamp = next((f"{k}={lowered[k]}" for k in ("etag", "md5", "crc32c", "generation", "lastmodified",
                                                     "last_modified", "mtime", "updated") if lowered.get(k)), None)
        identity = Identity(size, stamp)
    return _Opened(f, offset, identity)


def identify(url: str, timeout: float | None = DEFAULT_TIMEOUT, network: Network | None = None,
             warn: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> Identity | None:
    """A remote object's size and ETag (or modification time), asking the store (a HEAD request);
    None when it can't be had (no size given, or a failure the read that follows will name). For
    the cache, which must know a version before reading. A failure that may pass (a 5xx answer, a
    reset, a refusal from a host that answered before) is retried as a read is (``network``'s
    retries and backoff, default ``settings()``), one warning line each."""
    network = network if network is not None else _settings
    attempt = 0
    while True:
        try:
            return _identify_once(url, timeout)
        except Exception as e:  # noqa: BLE001 - None, or a retry: the read that follows says what failed
            refused = isinstance(e, ConnectionRefusedError) and not _was_reached(url)
            passing = isinstance(e, (_Transient, OSError))  # not a library's own error (no credentials...)
            if not passing or not _transient(e) or refused or attempt >= network.retries:
                return None
            attempt += 1
            wait = _backoff(network, attempt, e)
            (warn or warn_stderr)(f"{url}: asking its size failed ({describe(e)}); retry {attempt} of "
                                  f"{network.retries} in {wait:.1f} s")
            sleep(wait)


def _identify_once(url: str, timeout: float | None) -> Identity | None:
    if url.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "tarproc",
                                                                      "Accept-Encoding": "identity"})
        try:
            response = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310
        except urllib.error.HTTPError as e:
            e.close()
            if e.code in _RETRY_STATUS:
                raise _Transient(f"HTTP {e.code} {e.reason}", _seconds(e.headers.get("Retry-After") if e.headers
                                                                       else None)) from None
            return None
        except urllib.error.URLError as e:
            if isinstance(e.reason, BaseException):
                raise e.reason from None
            return None
        with response:
            mark_reached(url)
            length = response.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return None
            return Identity(int(length), response.headers.get("ETag") or response.headers.get("Last-Modified"))
    try:
        opened = _open_fsspec(url, 0, timeout)
    except SourceError:
        return None
    opened.stream.close()
    mark_reached(url)
    return opened.identity


# -- the reader -------------------------------------------------------------------------------------

_ignoring_range: set[str] = set()  # servers said once to ignore range requests (netloc)
_said_lock = threading.Lock()


class RemoteReader:
    """A remote object's bytes from ``offset`` on, reopened at the byte reached after a failure.

    ``read(n)`` returns at most ``n`` bytes, ``b""`` at the end; ``pos`` is the next byte's place
    in the object. ``identity`` (size and ETag) is what the first answer said, None if
    it said no size. ``end``: where the reader expects to stop (exclusive): an HTTP server is asked
    for the bytes up to there only, and asked again for the rest if the reader goes on past it.
    """

    def __init__(self, url: str, offset: int = 0, network: Network | None = None,
                 warn: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep,
                 end: int | None = None) -> None:
        self.url = url
        self.pos = offset
        self.end = end if end is not None and end > offset else None
        self._window: int | None = None  # the end of what the open request asked (None: the object's)
        self._cancelled = False
        self.network = network if network is not None else _settings
        self.warn = warn if warn is not None else warn_stderr
        self.sleep = sleep
        self._http = url.startswith(("http://", "https://"))
        self._stream: Any = None
        self._since_open = 0  # bytes read since the last (re)open
        self._failures = 0  # failed attempts in a row: since the last open that gave enough bytes
        # the bytes after a reopen that end a run of failures: a server that gives a few bytes at
        # each attempt, then drips, isn't read from forever
        self._enough = max(1, int(self.network.min_speed * self.network.speed_time))
        self._waited = 0.0  # seconds spent in reads since the speed was last checked
        self._got = 0  # bytes they returned
        self.identity: Identity | None = None
        self._with_retries(lambda: 0, opening=True)

    def _open(self) -> None:
        opener = _open_http if self._http else _open_fsspec
        window = self.end if self._http and self.end is not None and self.pos < self.end else None
        opened = opener(self.url, self.pos, self.network.timeout, window)
        mark_reached(self.url)
        stream = opened.stream
        self._window = window if opened.start == self.pos else None  # a server ignoring ranges sends all
        if self.identity is None:
            self.identity = opened.identity
        elif opened.identity is not None and opened.identity != self.identity:
            stream.close()
            raise SourceError(f"changed on the server while it was read (at byte {self.pos}: was {self.identity}, "
                              f"now {opened.identity}); read it again", self.url)
        if opened.start < self.pos:  # a server that ignores range requests: skip to the byte reached
            netloc = _netloc(self.url)
            with _said_lock:
                first = netloc not in _ignoring_range
                _ignoring_range.add(netloc)
            if first:
                self.warn(f"{self.url}: the server ignores range requests: reading from the start and skipping "
                          f"{self.pos:,} bytes to reach byte {self.pos} (said once per server)")
            left = self.pos - opened.start
            while left:
                data = stream.read(min(left, _CHUNK))
                if not data:
                    raise _Transient(f"the answer ended at byte {self.pos - left}, before byte {self.pos}")
                left -= len(data)
        self._stream = stream
        self._since_open = 0
        self._waited, self._got = 0.0, 0

    def _with_retries(self, action: Callable[[], _T], opening: bool = False) -> _T:
        while True:
            try:
                if self._stream is None:
                    self._open()
                return action()
            except BaseException as e:
                self._drop()
                if not isinstance(e, Exception):
                    raise
                if isinstance(e, SourceError):
                    raise
                if self._cancelled:  # closed by a read-ahead's reader: no more attempts
                    raise SourceError(f"closed while reading byte {self.pos}", self.url) from None
                doing = "open failed" if opening else "read failed"
                if not _transient(e) or (isinstance(e, ConnectionRefusedError) and not _was_reached(self.url)):
                    # nothing listens there; a refusal from a host that answered before is a server restarting
                    raise SourceError(f"{doing} at byte {self.pos}: {describe(e)}", self.url) from None
                attempt = self._failures
                if attempt >= self.network.retries:
                    self._failures = 0  # said: a later read (the reader's, after its read-ahead's) tries anew
                    tries = f" ({attempt + 1} attempts)" if attempt else ""
                    raise SourceError(f"{doing} at byte {self.pos}{tries}: {describe(e)}", self.url) from None
                attempt = self._failures = attempt + 1
                # a connection that had been giving: reopen at once
                wait = _backoff(self.network, attempt, e, 0.0 if self._since_open else None)
                self.warn(f"{self.url}: {doing} at byte {self.pos} ({describe(e)}); retry {attempt} of "
                          f"{self.network.retries} in {wait:.1f} s, from byte {self.pos}")
                self.sleep(wait)

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = _CHUNK
        data = self._with_retries(lambda: self._read_some(n))
        self._advance(len(data))
        return data

    def _advance(self, got: int) -> None:
        self.pos += got
        self._since_open += got
        if self._failures and self._since_open >= self._enough:
            self._failures = 0

    def _limit(self, n: int) -> int:
        """``n``, or fewer where the window asked of the server ends (past it: ask for the rest)."""
        if self._window is not None:
            if self.pos >= self._window:  # the reader goes on past the end it gave: ask for the rest
                self.end = self._window = None
                self._drop()
                self._open()
            else:
                n = min(n, self._window - self.pos)
        return n

    def _read_some(self, n: int) -> bytes:
        n = self._limit(n)
        began = time.monotonic()
        data = self._stream.read(n)
        self._check(len(data), began, n)
        return bytes(data)

    def _check(self, got: int, began: float, asked: int) -> None:
        """After a read of ``got`` bytes begun at ``began``: a failure to retry where the stream ended
        short, or where reads have been slower than the floor for ``speed_time`` seconds."""
        if not got and asked and self.identity is not None and self.pos < self.identity.size:
            raise _Transient(f"the connection ended at byte {self.pos} of {self.identity.size:,}")
        floor = self.network.min_speed
        if not floor:
            return
        # only the time spent waiting in reads counts: a reader that is slow to ask isn't a slow server
        self._waited += time.monotonic() - began
        self._got += got
        if self._waited >= self.network.speed_time:
            slow = self._got < floor * self._waited
            self._waited, self._got = 0.0, 0
            if slow:
                raise _Transient(f"slower than {floor:,} bytes/s for {self.network.speed_time:g} s")

    def cancel(self) -> None:
        """No more attempts: a failed read raises at once (another thread is closing this stream)."""
        self._cancelled = True

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                pass

    def close(self) -> None:
        self._drop()


__all__ = ["Identity", "Network", "RemoteReader", "configure", "identify", "mark_reached", "settings"]

os.register_at_fork(after_in_child=_new_locks_in_child)
