"""The viewer's ``/media``: one field's bytes, by byte range, with what a slow client may hold bounded.

A field is sent from the shard in ``MEDIA_CHUNK`` pieces, the next read only once the client has
taken the last; the connection's kernel buffer is held to ``MEDIA_SEND_BUFFER`` and at most
``MAX_MEDIA_STREAMS`` fields are sent at once (``MediaStreams``), so a client that doesn't read
holds a few hundred KiB, not the field. ``parse_range`` reads a ``Range`` header (RFC 9110);
``media_url`` and ``media_field`` write and read a field name in a URL.

Apart from ``server`` (the application, its API and its guard) because this is the part with
bounds of its own to keep; the ``/media`` handler in ``server`` finds the sample and calls
``send_field``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from .catalog import field_type, sniffed_type

MEDIA_CHUNK = 128 << 10  # bytes read at a time when sending a field (what a client that doesn't read holds)
MEDIA_SEND_BUFFER = 128 << 10  # the kernel's send buffer of a connection sending a field (Linux doubles it)
MAX_MEDIA_STREAMS = 64  # fields being sent at once; one more is a 503 (a browser opens six at a time)
MAX_FIELD_CHARS = 4096  # a longer /media field name is no field of a tar the viewer reads
MEDIA_POLICY = "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; media-src 'self'"
_DOT_SEGMENTS = (".", "..")  # names a browser removes from a URL path (and so does %2E%2E)

FieldReader = Callable[[int, int, bool], Awaitable[bytes]]
"""``read(start, end, check)``: bytes ``[start, end)`` of one field (see ``send_field``)."""


class MediaStreams:
    """The fields being sent, ``limit`` at most at once (one more is a 503), and what they hold
    in this process: the bytes read from the shard that wait in their connection's buffer for a
    client that doesn't read (at most a piece above the buffer's high mark: ``send_field``)."""

    def __init__(self, limit: int = MAX_MEDIA_STREAMS) -> None:
        self.limit = limit
        self.active: dict[int, Any] = {}  # stream number -> its connection's transport
        self._next = 0

    def start(self, transport: Any) -> int | None:
        """A number for a new stream, None when ``limit`` are being sent already."""
        if len(self.active) >= self.limit:
            return None
        self._next += 1
        self.active[self._next] = transport
        return self._next

    def end(self, stream: int) -> None:
        self.active.pop(stream, None)

    def held(self) -> int:
        """Bytes of the streams in their connections' buffers, not yet taken by the kernel."""
        return sum(t.get_write_buffer_size() for t in list(self.active.values()) if t is not None)

    def stalled(self) -> int:
        """Streams waiting for a client to read (their connection's buffer above its high mark)."""
        return sum(t.get_write_buffer_size() > t.get_write_buffer_limits()[1]
                   for t in list(self.active.values()) if t is not None)


def media_url(shard: int, pos: int, field: str) -> str:
    r"""The URL of a field's bytes: the name percent-encoded as one path segment (a byte that is
    not UTF-8, surrogate-escaped, as itself), or as a query for ``.`` and ``..``, segments that a
    browser takes out of a path. ``media_field`` reads either back.

    >>> media_url(0, 3, "seg..png"), media_url(0, 3, "a\\b.txt"), media_url(1, 0, "..")
    ('/media/0/3/seg..png', '/media/0/3/a%5Cb.txt', '/media/1/0?field=..')
    """
    from urllib.parse import quote

    quoted = quote(field.encode("utf-8", "surrogateescape"), safe="")
    if field in _DOT_SEGMENTS:
        return f"/media/{shard}/{pos}?field={quoted}"
    return f"/media/{shard}/{pos}/{quoted}"


def media_field(raw: str) -> str | None:
    r"""The field name a ``/media`` URL's raw segment or ``field`` query value names, decoded once
    (a percent escape that is not UTF-8 surrogate-escaped, as names read from a tar are); None for
    what is no field name: empty, too long, or holding a slash or NUL.

    >>> media_field("seg..png"), media_field("a%5Cb.txt"), media_field("t%FFxt"), media_field("a%2Fb")
    ('seg..png', 'a\\b.txt', 't\udcffxt', None)
    """
    from urllib.parse import unquote

    field = unquote(raw, errors="surrogateescape")
    if not field or len(field) > MAX_FIELD_CHARS or "/" in field or "\0" in field:
        return None
    return field


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The one byte range ``[start, end)`` a ``Range`` header asks for, None to send the whole
    (no header, not a single ``bytes`` range, or malformed: RFC 9110 says to ignore it), and
    ``web.HTTPRequestRangeNotSatisfiable`` for a range outside ``size`` bytes.

    >>> parse_range("bytes=0-99", 1000), parse_range("bytes=900-", 1000), parse_range("bytes=-10", 1000)
    ((0, 100), (900, 1000), (990, 1000))
    >>> parse_range("bytes=5-2000", 1000), parse_range("bytes=0-1,5-9", 1000), parse_range("items=0-1", 1000)
    ((5, 1000), None, None)
    """
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    first, last = first.strip(), last.strip()
    if not dash or not (first.isascii() and last.isascii()) or len(first) > 20 or len(last) > 20:
        return None
    if first == "":
        if not last.isdigit():
            return None
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise _unsatisfiable(size)
        return max(size - suffix, 0), size
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    start = int(first)
    end = int(last) + 1 if last else size
    if last and end <= start:
        return None  # last < first: invalid, ignored
    if start >= size:
        raise _unsatisfiable(size)
    return start, min(end, size)


def _unsatisfiable(size: int) -> web.HTTPRequestRangeNotSatisfiable:
    return web.HTTPRequestRangeNotSatisfiable(
        text=f"range not satisfiable: the field has {size} bytes", headers={"Content-Range": f"bytes */{size}"}
    )


def cap_send_buffer(request: web.Request) -> None:
    """Fix the kernel's send buffer of this connection at ``MEDIA_SEND_BUFFER``: left to grow, it
    takes up to 4 MiB (Linux ``tcp_wmem``) of a field from a client that doesn't read."""
    import socket

    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:  # set, it no longer grows (autotuning is off for the socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MEDIA_SEND_BUFFER)
    except OSError:  # a system that won't: the pieces and the stream bound still hold
        pass


async def send_field(request: web.Request, read: FieldReader, where: tuple[int, int, str], size: int,
                     checked: set[tuple[int, int, str]], security_headers: Mapping[str, str]) -> web.StreamResponse:
    """A field's bytes, or the range asked for, read from the shard a piece at a time: the next
    piece only once the client has taken the last (``write`` waits while the connection's buffer
    is over its high mark), so a client that doesn't read holds a piece, not the field.

    Args:
        request: the ``/media`` request (its ``Range``, ``If-Range`` and method).
        read: ``read(start, end, check)``, bytes ``[start, end)`` of the field (``check``: check its
            headers against the index first), off the event loop.
        where: ``(shard, position, field)``, the field; ``where[2]`` is its name.
        size: the field's size in bytes.
        checked: the fields whose headers were checked already (this one is added after its first read).
        security_headers: the headers every response of the viewer carries.
    """
    field = where[2]
    # no validators are sent, so an If-Range never matches: the whole field, as RFC 9110 says
    wanted = None if "If-Range" in request.headers else parse_range(request.headers.get("Range"), size)
    start, end = wanted if wanted is not None else (0, size)
    check = where not in checked
    first = await read(start, min(start + MEDIA_CHUNK, end), check)
    if check:
        if len(checked) > 100_000:
            checked.clear()
        checked.add(where)
    kind, mime = field_type(field)
    if kind == "binary" and size:
        head = first[:512] if start == 0 else await read(0, min(size, 512), False)
        kind, mime = sniffed_type(head)
    headers = {
        **security_headers,
        "Content-Type": mime,
        "Accept-Ranges": "bytes",
        "Cache-Control": "private, max-age=300",
        "Content-Security-Policy": MEDIA_POLICY,
    }
    if kind == "binary":
        headers["Content-Disposition"] = "attachment"
    response = web.StreamResponse(status=200 if wanted is None else 206, headers=headers)
    if wanted is not None:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    response.content_length = end - start
    await response.prepare(request)
    try:
        if request.method != "HEAD":
            piece = first
            pos = start + len(first)
            while True:
                await response.write(piece)  # waits while the connection's buffer is over its high mark
                del piece
                if pos >= end:
                    break
                stop = min(pos + MEDIA_CHUNK, end)
                piece = await read(pos, stop, False)
                pos = stop
        await response.write_eof()
    except ConnectionError:  # the client went away (a closed tab, a seek in a video): nothing to tell
        pass
    return response
