"""``tarshow --serve``: a local, read-only web viewer of tar shards (aiohttp).

``serve(urls)`` listens on 127.0.0.1 until Ctrl-C or SIGTERM; ``make_app(urls)`` is the
``aiohttp.web.Application`` itself, for tests and embedding. The page pages through the samples
of all shards by random access through their indexes (``catalog.Catalog``), jumps to a key,
filters (``cls=3``, ``json.meta.lang=en``), shows every field of a sample, and plays media
straight from the tar by byte range.

Routes (GET and HEAD only):

- ``/`` the page, ``/static/viewer.js``, ``/static/viewer.css``
- ``/api/page?start=S&n=N&filter=F``: up to N samples from position S (across all shards) that
  pass the filter, with short previews of their text fields; ``next`` is where the next page starts.
  A filter on a field no sample has is a 400 saying so (the shards' indexes know their fields).
  ``problems``: the shards that can't be read; ``field_problems``: the latest broken fields found
  (``FIELD_PROBLEMS`` at most), each with the ``tarfirst`` command that pulls it out
- ``/api/sample/SHARD/POS``: every field of one sample (text and JSON in full up to 1 MiB)
- ``/api/find?key=K``: where a key is
- ``/api/problems``: what the summary of every sample has found so far (``make_app(summary=...)``,
  ``tarshow --serve --summary``; ``summary.BackgroundSummary.snapshot``): each kind of problem
  with its count and examples (shard, key, field, why, the ``tarfirst`` command), the progress,
  and at the end the totals; ``{"enabled": false, ...}`` without it
- ``/media/SHARD/POS/FIELD``: one field's bytes, with ``Range`` (206, 416) and a Content-Type
  from the field's extension (``/media/SHARD/POS?field=FIELD`` for a field named ``.`` or ``..``,
  which a browser would take out of a path)

Every field on a page or a sample's page carries ``problem``: why an image would not show (no
image in it, cut short, an unreadable header), null when none is found; a label field carries
``label``, ``3 (dog)``, when class names are known (``classes=``, or a ``classes.txt`` beside the
first shard).

Nothing else can be read through it: a shard is its number in the list, a sample its position in
the shard, a field a name looked up in that sample's index entry; a path with ``..``, an encoded
slash, dot or backslash is refused (400) before any of that (but in a ``/media`` field name, which
is decoded once and only ever looked up), numbers are bounded, and a request whose ``Host`` is not
a loopback name is refused (403) while listening on loopback (DNS rebinding). Errors answer a
one-line text (4xx for the request, 502 for a shard that can't be read, 503 when
``max_media_streams`` fields are being sent already), never a traceback. A field is sent from the
shard a piece at a time, so a client that doesn't read holds a few hundred KiB, not the field
(``media``: the ``/media`` streaming and its bounds). The page loads nothing from other hosts
(Content-Security-Policy), and media come with a sandboxing policy, so an SVG or HTML field can't
run script in the viewer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from ..classnames import class_names_beside, label_name
from ..content import tarfirst_command
from ..errors import OptionError, SourceError, TarprocError, TransportError
from ..fieldspec import LABEL_FIELDS
from ..sources import local_path
from .catalog import (
    DAMAGE_READ_LIMIT,
    MAX_TEXT,
    PREVIEW_BYTES,
    SNIFF_LIMIT,
    TEXT_KINDS,
    Catalog,
    Condition,
    Located,
    field_type,
    image_problem,
    parse_filter,
    sniffed_type,
    wants_image_check,
)
from .media import (
    MAX_FIELD_CHARS,
    MAX_MEDIA_STREAMS,
    MediaStreams,
    cap_send_buffer,
    media_field,
    media_url,
    send_field,
)
from .page import CSS, HTML, JS
from .summary import STOP_WAIT, BackgroundSummary, SummaryOptions, disabled_snapshot

T = TypeVar("T")

PROG = "tarshow"
MAX_PAGE = 200  # samples on one page
MAX_START = 10**15  # no dataset has more samples; a bigger number is a bad request
PREVIEW_CHARS = 600  # characters of a text field on a card
FIELD_PROBLEMS = 200  # the latest broken fields the page lists
MAX_WORKERS = 16  # threads reading for the requests at once
SHUTDOWN_WAIT = 2.0  # seconds a stop waits for the requests in progress
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

_BAD_PATH = re.compile(r"\.\.|%2e|%2f|%5c|%00|\\|//", re.IGNORECASE)
# a /media path: what comes before the field is checked as any path, the field segment is decoded
_MEDIA_PATH = re.compile(r"(/media/[0-9]{1,12}/[0-9]{1,12}/)([^/]*)")
_NUMBER = r"[0-9]{1,12}"

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; media-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

CATALOG = web.AppKey("catalog", Catalog)
STATE = web.AppKey("state", dict)


class FieldProblems:
    """The latest broken fields found (``limit`` at most, a field found again moves to the end),
    each as the page lists it: where it is, why, and the ``tarfirst`` command that pulls it out."""

    def __init__(self, limit: int = FIELD_PROBLEMS) -> None:
        self.limit = limit
        self.found: OrderedDict[tuple[int, int, str], dict[str, Any]] = OrderedDict()

    def add(self, catalog: Catalog, sample: dict[str, Any]) -> None:
        """Every field of a described sample (``_describe``) that has a problem."""
        for f in sample["fields"]:
            where = (sample["shard"], sample["pos"], f["name"])
            if f.get("problem") is None:
                self.found.pop(where, None)  # the shard was fixed under the viewer
                continue
            self.found.pop(where, None)
            self.found[where] = {
                "shard": sample["shard"], "pos": sample["pos"], "index": sample["index"], "key": sample["key"],
                "field": f["name"], "problem": f["problem"],
                "command": tarfirst_command(catalog.urls[sample["shard"]], sample["key"], f["name"]),
            }
            while len(self.found) > self.limit:
                self.found.popitem(last=False)

    def latest(self) -> list[dict[str, Any]]:
        return list(self.found.values())


# ---------------------------------------------------------------------------------------------
# the application


def make_app(
    urls: list[str], *, allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES, warm: bool = True,
    log: Callable[[str], None] | None = None, classes: Sequence[str] | None = None,
    max_media_streams: int = MAX_MEDIA_STREAMS, summary: SummaryOptions | bool = False,
) -> web.Application:
    """The viewer as an aiohttp application over these shards (nothing is read until asked).

    Args:
        urls: the shards, in order.
        allowed_hosts: the host names a request's ``Host`` may have (any loopback address is
            accepted too); None accepts any, for a server listening on another address.
        warm: load the shards' ``.idx`` files in the background after start, so that the page
            knows the total count (a shard without one is indexed when a page first reaches it).
        log: where one line per failed request goes (default: stderr).
        classes: class names, line i naming label i (labels show as ``3 (dog)``); None: those of
            a ``classes.txt`` beside the first shard, when there is one (``ClassNamesError`` when
            it can't be read).
        max_media_streams: fields sent at once; a request for one more answers 503.
        summary: also summarize every sample in the background once started, as ``tarshow
            --summary`` does (True, or ``SummaryOptions`` for ``--decode -p N``), for
            ``/api/problems`` and the page's problems panel; stopped with the app.
    """
    catalog = Catalog(urls)
    names = list(classes) if classes is not None else class_names_beside(urls)
    if max_media_streams < 1:
        raise OptionError(f"max_media_streams {max_media_streams}: at least 1")
    if summary is True:
        summary = SummaryOptions()
    background = BackgroundSummary(urls, summary, log or _stderr) if summary else None
    app = web.Application(middlewares=[_guard(allowed_hosts, log or _stderr)], client_max_size=1 << 16)
    app[CATALOG] = catalog
    app[STATE] = {"checked": set(), "stop": threading.Event(), "workers": _Workers(MAX_WORKERS),
                  "classes": names, "problems": FieldProblems(), "streams": MediaStreams(max_media_streams),
                  "summary": background}
    app.router.add_get("/", _page)
    app.router.add_get("/static/viewer.js", _static(JS, "text/javascript; charset=utf-8"))
    app.router.add_get("/static/viewer.css", _static(CSS, "text/css; charset=utf-8"))
    app.router.add_get("/favicon.ico", _no_icon)
    app.router.add_get("/api/page", _api_page)
    app.router.add_get("/api/find", _api_find)
    app.router.add_get("/api/problems", _api_problems)
    app.router.add_get(f"/api/sample/{{shard:{_NUMBER}}}/{{pos:{_NUMBER}}}", _api_sample)
    app.router.add_get(f"/media/{{shard:{_NUMBER}}}/{{pos:{_NUMBER}}}/{{field:[^/]{{1,{MAX_FIELD_CHARS}}}}}", _media)
    app.router.add_get(f"/media/{{shard:{_NUMBER}}}/{{pos:{_NUMBER}}}", _media)
    if warm:
        app.on_startup.append(_start_warming)
    if background is not None:
        app.on_startup.append(_start_summary)
    app.on_cleanup.append(_close)
    return app


async def _start_warming(app: web.Application) -> None:
    # only the shards with an index file: counting the others would read them all (a remote
    # dataset of terabytes); the page counts them as it reaches them
    threading.Thread(target=app[CATALOG].open_all, args=(app[STATE]["stop"],), kwargs={"indexed_only": True},
                     daemon=True, name="tarshow-index").start()


async def _start_summary(app: web.Application) -> None:
    app[STATE]["summary"].start()


async def _close(app: web.Application) -> None:
    app[STATE]["stop"].set()
    background = app[STATE]["summary"]
    if background is not None:
        # the server has stopped answering: wait here for the summary's thread, so that its decode
        # processes are gone before serve() returns (the thread stops between two members)
        if not background.stop():
            _stderr(f"{PROG}: warning: the summary did not stop within {STOP_WAIT:g} s (a read that hangs?)")
    app[CATALOG].close()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _text(status: int, message: str) -> web.Response:
    # a name that isn't UTF-8 (surrogate-escaped) is written escaped, not a failure to answer
    body = (message + "\n").encode("utf-8", "backslashreplace")
    return web.Response(status=status, body=body, content_type="text/plain", charset="utf-8")


def _guard(allowed: frozenset[str] | None, log: Callable[[str], None]) -> Any:
    @web.middleware
    async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        if allowed is not None and not _host_allowed(request.host, allowed):
            return _secure(_text(403, "forbidden: this viewer answers only to a loopback host name"))
        if not _path_allowed(request.raw_path.partition("?")[0]):
            return _secure(_text(400, "bad path"))
        if request.method not in ("GET", "HEAD"):
            return _secure(_text(405, "read-only: only GET and HEAD"))
        try:
            response = await handler(request)
        except web.HTTPException as e:
            if e.status >= 400:
                response = _text(e.status, e.text.strip() if e.text else e.reason)
                for name, value in e.headers.items():  # Content-Range of a 416, Allow of a 405
                    if name.lower() not in ("content-type", "content-length"):
                        response.headers[name] = value
            else:
                raise
        except TarprocError as e:
            log(f"{PROG}: error: {e}")
            response = _text(502, f"error: {e}")
        except Exception as e:  # noqa: BLE001 -- one line, never a traceback, and the server goes on
            detail = str(e).splitlines()[0] if str(e) else ""
            log(f"{PROG}: error: internal error: {type(e).__name__}: {detail} ({request.method} {request.path})")
            response = _text(500, f"internal error: {type(e).__name__}")
        return _secure(response)

    return guard


def _path_allowed(path: str) -> bool:
    """Whether a raw path is free of traversal tricks. A ``/media`` field name is the exception:
    it is one segment, decoded once by ``media_field`` and only looked up in a sample's index
    entry, so that fields such as ``seg..png`` or ``a\\b.txt`` load; only its slash and NUL are
    refused (no field name holds one)."""
    media = _MEDIA_PATH.fullmatch(path)
    if media is None:
        return not _BAD_PATH.search(path)
    return not _BAD_PATH.search(media.group(1)) and media_field(media.group(2)) is not None


SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def _secure(response: web.StreamResponse) -> web.StreamResponse:
    if not response.prepared:  # a streamed field's response carries them already
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        response.headers.setdefault("Content-Security-Policy", PAGE_POLICY)
    return response


def _host_allowed(host: str | None, allowed: frozenset[str]) -> bool:
    if not host:
        return False
    name = host
    if name.startswith("["):  # [::1]:8000
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.lower().rstrip(".")
    if name in allowed:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class _Workers:
    """Daemon threads that run the blocking work (reads, index builds) off the event loop: the
    server keeps answering meanwhile, and a stop is never held up by a long read (the threads of a
    ``ThreadPoolExecutor`` are joined when Python exits)."""

    def __init__(self, size: int) -> None:
        import queue

        self.size = size
        self.jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[..., Any],
               args: tuple[Any, ...]) -> None:
        with self.lock:
            if self.idle == 0 and len(self.threads) < self.size:
                thread = threading.Thread(target=self._work, daemon=True, name=f"tarshow-{len(self.threads)}")
                self.threads.append(thread)
                thread.start()
        self.jobs.put((loop, future, fn, args))

    def _work(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            loop, future, fn, args = self.jobs.get()
            with self.lock:
                self.idle -= 1
            value, error = None, None
            try:
                value = fn(*args)
            except BaseException as e:  # noqa: BLE001 -- handed to the awaiting handler
                error = e
            try:
                loop.call_soon_threadsafe(_settle, future, value, error)
            except RuntimeError:  # the loop closed meanwhile (the server stopped)
                pass


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if not future.done():
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


async def _blocking(request: web.Request, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on one of the app's worker threads."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    request.app[STATE]["workers"].submit(loop, future, fn, args)
    return await future


# ---------------------------------------------------------------------------------------------
# handlers


async def _page(request: web.Request) -> web.Response:
    return web.Response(text=HTML, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-cache"})


def _static(body: str, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=body, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})

    return handler


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 16:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number from {low} to {high}")
    value = int(raw)
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number from {low} to {high}")
    return value


async def _locate(request: web.Request) -> Located:
    catalog = request.app[CATALOG]
    shard, pos = int(request.match_info["shard"]), int(request.match_info["pos"])
    if shard >= len(catalog.urls):
        raise web.HTTPNotFound(text=f"no shard number {shard} (there are {len(catalog.urls)})")
    # the shard's index already in memory: no need to leave the event loop
    at = catalog.locate(shard, pos) if catalog.is_open(shard) else await _blocking(request, catalog.locate, shard, pos)
    if at is None:
        if catalog.errors[shard] is not None:
            raise TarprocError(catalog.errors[shard] or "")
        raise web.HTTPNotFound(text=f"no sample {pos} in shard number {shard} ({catalog.names[shard]})")
    return at


def _problems(catalog: Catalog) -> list[str]:
    return [e for e in catalog.errors if e is not None]


async def _api_page(request: web.Request) -> web.Response:
    catalog = request.app[CATALOG]
    start = _int_param(request, "start", 0, 0, MAX_START)
    n = _int_param(request, "n", 50, 1, MAX_PAGE)
    text = request.query.get("filter", "").strip()
    if len(text) > 1000:
        raise web.HTTPBadRequest(text="filter too long")
    try:
        conditions: list[Condition] | None = parse_filter(text) if text else None
    except OptionError as e:
        raise web.HTTPBadRequest(text=str(e)) from None
    state = request.app[STATE]
    for cond in conditions or ():
        absent = await _blocking(request, catalog.absent_field, cond.path)
        if absent is not None:
            raise web.HTTPBadRequest(text=f"filter {text!r}: {absent}")
    found, next_start = await _blocking(request, catalog.scan, start, n, conditions)
    samples = await _blocking(request, _describe_all, catalog, found, state["classes"])
    for sample in samples:
        state["problems"].add(catalog, sample)
    total, complete = catalog.known()
    return web.json_response({
        "start": start, "n": n, "filter": text, "next": next_start, "total": total, "complete": complete,
        "shards": len(catalog.urls), "problems": _problems(catalog), "samples": samples,
        "field_problems": state["problems"].latest(),
    })


async def _api_sample(request: web.Request) -> web.Response:
    catalog = request.app[CATALOG]
    state = request.app[STATE]
    at = await _locate(request)
    sample = await _blocking(request, _describe, catalog, at, True, state["classes"])
    state["problems"].add(catalog, sample)
    return web.json_response(sample)


async def _api_find(request: web.Request) -> web.Response:
    catalog = request.app[CATALOG]
    key = _query(request, "key")
    if key is None or not key or len(key) > 4096:
        raise web.HTTPBadRequest(text="give the key to find: /api/find?key=KEY")
    found = await _blocking(request, catalog.find_key, key)
    matches = [{"shard": at.shard, "pos": at.pos, "index": at.position} for at in found]
    return web.json_response({"key": key, "matches": matches})


async def _api_problems(request: web.Request) -> web.Response:
    background = request.app[STATE]["summary"]
    # a copy taken under a lock the summary holds only to note a problem: no need to leave the loop
    doc = background.snapshot() if background is not None else disabled_snapshot()
    return web.json_response(doc, headers={"Cache-Control": "no-store"})


def _describe_all(catalog: Catalog, found: list[Located], names: Sequence[str] | None) -> list[dict[str, Any]]:
    return [_describe(catalog, at, False, names) for at in found]


def _describe(catalog: Catalog, at: Located, full: bool, names: Sequence[str] | None = None) -> dict[str, Any]:
    """One sample for the page: its fields in shard order, each with its kind and URL, the text of
    text-like fields (a preview on a card, up to ``MAX_TEXT`` bytes on its own page), ``label``
    (``3 (dog)``) for a label with a class name, and ``problem``: why an image would not show.

    Only the fields of the samples shown are read for that check: their images whole (up to
    ``DAMAGE_READ_LIMIT``), as the browser reads them anyway to show them."""
    entry = catalog.entry(at)
    limit = MAX_TEXT if full else PREVIEW_BYTES
    kinds: dict[str, tuple[str, str]] = {}
    wanted = []
    for field, (_, size) in entry.fields.items():
        kinds[field] = named = field_type(field)
        if (named[0] in TEXT_KINDS and size <= limit) or (named[0] == "binary" and size <= SNIFF_LIMIT) or (
                wants_image_check(field, named[0]) and size <= DAMAGE_READ_LIMIT):
            wanted.append(field)
    data = catalog.read_fields(at, wanted)
    fields = []
    for field, (_, size) in entry.fields.items():
        kind, mime = kinds[field]
        info: dict[str, Any] = {"name": field, "size": size, "kind": kind, "type": mime.partition(";")[0],
                                "url": media_url(at.shard, at.pos, field), "problem": None}
        value = data.get(field)
        if value is not None and kind == "binary":
            kind, mime = sniffed_type(value)
            info.update(kind=kind, type=mime.partition(";")[0])
        if kind == "image":
            # for the page to list it, when the browser finds it can't show the image either
            info["command"] = tarfirst_command(catalog.urls[at.shard], entry.key, field)
        if value is not None and wants_image_check(field, kind):
            info["problem"] = image_problem(value)
        elif value is not None and kind in TEXT_KINDS:
            shown, cut = _text_of(value, kind, full)
            info["text"] = shown
            if cut:
                info["truncated"] = True
            if names and _is_label(field):
                named_label = label_name(shown, names)
                if named_label != shown:
                    info["label"] = named_label
        elif kind in TEXT_KINDS:
            info["truncated"] = True  # too big to read for a page: the size says how big
            info["text"] = ""
        fields.append(info)
    return {"shard": at.shard, "pos": at.pos, "index": at.position, "key": entry.key,
            "shard_name": catalog.names[at.shard], "fields": fields}


def _is_label(field: str) -> bool:
    """A field of class labels: ``cls``, ``label``, ... (``fieldspec.LABEL_FIELDS``), or ``x.cls``."""
    return field in LABEL_FIELDS or field.rpartition(".")[2] in LABEL_FIELDS


def _text_of(value: bytes, kind: str, full: bool) -> tuple[str, bool]:
    text = value.decode("utf-8", "replace")
    if kind == "json":
        try:
            text = json.dumps(json.loads(value), indent=2 if full else 1, ensure_ascii=False)
        except (ValueError, RecursionError):  # not JSON, or nested too deep
            pass
    if not full and len(text) > PREVIEW_CHARS:
        return text[: PREVIEW_CHARS - 1] + "…", True
    return text, False


def _field_of(request: web.Request) -> str:
    """The field a ``/media`` request names, from the raw path or query (aiohttp's decoded one
    leaves a percent escape that is not UTF-8 undecoded: such a name would never be found)."""
    path, _, query = request.raw_path.partition("?")
    if "field" in request.match_info:
        raw: str | None = path.rpartition("/")[2]
    else:  # the query's raw value: decoded once, in media_field
        raw = next((v.replace("+", "%20") for k, _, v in (p.partition("=") for p in query.split("&"))
                    if k == "field"), None)
    field = media_field(raw) if raw is not None else None
    if field is None:
        raise web.HTTPBadRequest(text="give the field: /media/SHARD/POS/FIELD or /media/SHARD/POS?field=FIELD")
    return field


def _query(request: web.Request, name: str) -> str | None:
    """A query parameter, a byte that is not UTF-8 surrogate-escaped (as keys read from a tar are)."""
    from urllib.parse import parse_qsl

    for k, v in parse_qsl(request.rel_url.raw_query_string, errors="surrogateescape"):
        if k == name:
            return v
    return None


# ---------------------------------------------------------------------------------------------
# media, by byte range


async def _media(request: web.Request) -> web.StreamResponse:
    catalog = request.app[CATALOG]
    at = await _locate(request)
    field = _field_of(request)
    span = catalog.field_span(at, field)
    if span is None:
        raise web.HTTPNotFound(text=f"sample {_short(catalog.entry(at).key)} has no field {_short(field)}")
    streams = request.app[STATE]["streams"]
    stream = streams.start(request.transport)
    if stream is None:
        raise web.HTTPServiceUnavailable(
            text=f"busy: {streams.limit} fields are being sent already; ask again when one is done",
            headers={"Retry-After": "1"})
    def read(start: int, end: int, check: bool) -> Awaitable[bytes]:
        return _blocking(request, catalog.read_field, at, field, start, end, check)

    try:
        cap_send_buffer(request)
        return await send_field(request, read, (at.shard, at.pos, field), span[1], request.app[STATE]["checked"],
                                SECURITY_HEADERS)
    finally:
        streams.end(stream)


def _short(name: str, limit: int = 60) -> str:
    """A name for a one-line message: quoted, and cut to ``limit`` characters."""
    return repr(name if len(name) <= limit else name[: limit - 1] + "…")


# ---------------------------------------------------------------------------------------------
# serving


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(urls: list[str], host: str = "127.0.0.1", port: int = 8000, quiet: bool = False, *,
          classes: Sequence[str] | None = None, summary: SummaryOptions | bool = False) -> None:
    """Serve the viewer of these shards on ``http://host:port/`` until Ctrl-C or SIGTERM.

    ``port`` 0 takes any free port (the line on stderr names it). A host that is not a loopback
    address gets a warning: anyone who reaches it can read the shards. Ctrl-C raises
    ``KeyboardInterrupt`` after the server has stopped; SIGTERM, where the caller has no handler of
    its own, stops it and returns. ``quiet``: no line on stderr but warnings and errors.
    ``classes``: class names for the labels (``3 (dog)``); None: a ``classes.txt`` beside the
    first shard, when there is one. ``summary``: summarize every sample in the background and list
    its problems in the page (``make_app``); a stop stops it too.
    """
    if not urls:
        raise OptionError("no shards to serve")
    if not 0 <= port <= 65535:
        raise OptionError(f"--port {port}: a port is a number from 0 to 65535 (0: any free port)")
    for url in urls:
        path = local_path(url)
        if path is not None and url != "-" and not _exists(path):
            raise SourceError("no such file", url)
        if url == "-" or url.startswith("pipe:"):
            raise OptionError(f"{url}: the viewer reads shards at random: give files or URLs, not stdin or pipe:")
    loopback = _is_loopback(host)
    if not loopback:
        _stderr(f"{PROG}: warning: serving on {host}, not on a loopback address: anyone who can reach it can read "
                f"these shards (use --host 127.0.0.1 to keep them to this machine)")
    app = make_app(list(urls), allowed_hosts=LOOPBACK_NAMES if loopback else None, classes=classes,
                   summary=summary)
    loop = asyncio.new_event_loop()
    # a field being sent to a slow client holds the stop for at most SHUTDOWN_WAIT seconds
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_WAIT)
    stops = _Stops(loop)
    try:
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            loop.run_until_complete(site.start())
        except OSError as e:
            hint = " (pick another with --port, or --port 0 for any free port)" if e.errno == 98 else ""
            raise TransportError(f"cannot listen on {host}:{port}: {e.strerror or e}{hint}") from None
        bound = _bound_port(runner, port)
        shown = f"[{host}]" if ":" in host else host
        if not quiet:
            count = len(urls)
            _stderr(f"{PROG}: serving {count} shard{'' if count == 1 else 's'} on http://{shown}:{bound}/ "
                    f"(Ctrl-C to stop)")
        loop.run_forever()
    finally:
        try:
            loop.run_until_complete(runner.cleanup())
        finally:
            stops.restore()
            loop.close()
    stops.resume()


def _exists(path: str) -> bool:
    import os

    return os.path.exists(path)


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


class _Stops:
    """Ctrl-C and SIGTERM stop the loop (through the loop's own signal handling: a handler that
    raised inside the loop could land in a request's task and be lost there); once the server has
    stopped, ``resume()`` hands the signal to the handler the caller had: tarshow's raises to end
    with 130 or 143, Python's default raises ``KeyboardInterrupt`` for Ctrl-C, and where SIGTERM had
    no handler ``serve`` returns."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        import signal

        self.loop = loop
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
            if signum is None or signal.getsignal(signum) is signal.SIG_IGN:
                continue
            self.previous[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, self._stop, signum)

    def _stop(self, signum: int) -> None:
        if not self.received:  # a second Ctrl-C while stopping changes nothing
            self.loop.stop()
        self.received.append(signum)

    def restore(self) -> None:
        import signal

        for signum, handler in self.previous.items():
            self.loop.remove_signal_handler(signum)
            signal.signal(signum, handler)

    def resume(self) -> None:
        if not self.received:
            return
        signum = self.received[0]
        handler = self.previous.get(signum)
        if callable(handler):
            handler(signum, None)
