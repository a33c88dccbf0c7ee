"""Shared fixtures for the tarproc tests.

Test modules are imported with ``--import-mode=importlib`` and cannot import each other, so the
shared helpers live here and are handed out through fixtures:

- ``reader``: runs a test once with the C fast path (``tarproc._speedups``) and once with the
  pure-Python reference path (``tarproc.tar.reader._scan`` monkeypatched to None; ``_read_members``
  reads that module global on every loop, so the patch takes effect immediately).
- ``kit``: helpers to build tar bytes by hand (headers with any field, pax records, end blocks),
  to read a stream into a list or an error outcome, and to run GNU tar.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import inspect
import io
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tarhelpers import built, c_or_python, release_ports

import tarproc.tar as tario
import tarproc.tar.reader as tar_reader
from tarproc.errors import TarprocError

BLOCK = 512
RECORD = 10240
_C_SCAN = tar_reader._scan  # what the import found: the C fast path, or None when not built


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gnutar: needs the GNU tar command line tool")
    # A suite started with Ctrl-C ignored (a background job of a shell without job control, nohup)
    # would pass that on to every command the tests start, and the Ctrl-C tests would meet commands
    # that can't be interrupted: the commands get the default Ctrl-C, as from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _quick_dataloader_shutdown()


def _quick_dataloader_shutdown() -> None:
    """torch's DataLoader, shutting its workers down, waits up to MP_STATUS_CHECK_INTERVAL (5 s)
    for each to exit. An iterator left to the cyclic garbage collector (``pytest.raises`` keeps
    the exception of a worker, whose traceback holds the iterator) can no longer tell its workers
    to stop -- the collector finalizes its index queues' feeder threads first -- so each of them
    costs the whole wait: 90 s of this suite. A worker that is told exits in milliseconds: 1 s."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        import torch.utils.data._utils as torch_data_utils

        torch_data_utils.MP_STATUS_CHECK_INTERVAL = 1.0  # read by the shutdown's joins only


# The test tiers (docs/development.md): `make test-fast` leaves out the tests marked here. The marks
# go by file, fixture and source, so that a new test in one of these places is marked too.
_BY_FILE = {
    "browser": {"view/test_report_browser.py", "view/test_viewer_browser.py"},
    "slurm": {"interop/test_slurm.py"},
    "gpu": {"interop/test_dali.py", "interop/test_dali_decode.py"},
    "torch": {"interop/test_torchrun.py", "interop/test_remote_torchrun.py", "interop/test_training.py"},
    # the slowest files: real process trees killed and restarted, many processes, fuzzing
    "slow": {"cli/test_tarserve_stop.py", "cli/test_tarserve_delivery.py", "cli/test_socket_setup_errors.py",
             "core/test_index_fuzz.py", "core/test_wire_fuzz.py", "interop/test_hostile_server.py"},
}
_BY_FIXTURE = {"browser": {"browser"}, "slurm": {"slurm"}}
# in a test function's source: an import, an importorskip, a "torch" loader
_BY_SOURCE = {
    "torch": re.compile(r"""^\s*import [\w., ]*\btorch\b|^\s*from torch\b|"torch\"""", re.M),
    "gpu": re.compile(r"nvidia\.dali|wds2idx"),
}
# in a module's own lines: a module-wide importorskip
_MODULE_WIDE = {"torch": re.compile(r"""^(\w+ = )?pytest\.importorskip\("torch"\)""", re.M)}
_TESTS = Path(__file__).parent


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _scripts_of(module: Any, text: str) -> str:
    """The module's string constants (SCRIPT, CONSUMER...) that ``text`` names: scripts a test runs."""
    names = set(re.findall(r"\b[A-Z][A-Z0-9_]+\b", text))
    return "\n".join(value for name, value in vars(module).items() if name in names and isinstance(value, str))


def _markers_of(item: pytest.Item, module_text: str) -> Iterator[str]:
    path = Path(str(item.path))
    where = path.relative_to(_TESTS).as_posix() if path.is_relative_to(_TESTS) else ""
    fixtures = set(getattr(item, "fixturenames", ()))
    function_text = _source(getattr(item, "function", None))
    module = getattr(item, "module", None)
    if module is not None:
        function_text += _scripts_of(module, function_text)
    for marker, files in _BY_FILE.items():
        if where in files or fixtures & _BY_FIXTURE.get(marker, set()):
            yield marker
        elif marker in _BY_SOURCE and _BY_SOURCE[marker].search(function_text):
            yield marker
        elif marker in _MODULE_WIDE and _MODULE_WIDE[marker].search(module_text):
            yield marker
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "dali" in callspec.id:  # a test run once per device, "dali-cpu" among them
        yield "gpu"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    module_texts: dict[Any, str] = {}
    for item in items:
        module = getattr(item, "module", None)
        if module not in module_texts:
            # the module's own lines, outside its functions: where a module-wide importorskip is
            lines = _source(module).splitlines() if module is not None else []
            module_texts[module] = "\n".join(line for line in lines if not line.startswith((" ", "\t")))
        for marker in set(_markers_of(item, module_texts[module])):
            item.add_marker(marker)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The datasets' count cache (tarproc.dataset.counts) in a folder of the test run's, never the user's."""
    os.environ["TARPROC_CACHE_DIR"] = str(tmp_path_factory.mktemp("tarproc-cache"))


@pytest.fixture(autouse=True)
def _release_ports() -> Iterator[None]:
    """The ports ``tarhelpers.free_port`` held for a test are let go when it ends."""
    yield
    release_ports()


@pytest.fixture(autouse=True)
def _network_defaults() -> Any:
    """Each test starts from the default ``sources.Network`` (a command's --retries etc. set it for
    the process), with short waits between retries (tests of the waits set their own)."""
    from tarproc.sources import remote

    saved = remote.settings()
    remote.configure(**{**dataclasses.asdict(remote.Network()), "backoff": 0.01})
    yield
    remote._settings = saved


class ChunkedReader:
    """A ``read(n)`` that returns short, irregular pieces, like a pipe or a socket does."""

    def __init__(self, data: bytes, seed: int = 0, max_piece: int = 700) -> None:
        self._data = data
        self._pos = 0
        self._rng = random.Random(seed)
        self._max = max_piece

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = len(self._data)
        take = min(n, self._rng.randint(1, self._max))
        out = self._data[self._pos : self._pos + take]
        self._pos += len(out)
        return out


class TarKit:
    """Hand-made tar bytes and small reading helpers (see the module docstring)."""

    BLOCK = BLOCK
    RECORD = RECORD
    ChunkedReader = ChunkedReader

    # -- building ------------------------------------------------------------------------------

    @staticmethod
    def header(
        name: bytes | str,
        size: int = 0,
        *,
        typeflag: bytes = b"0",
        size_field: bytes | None = None,
        magic: bytes = b"ustar\x0000",
        prefix: bytes = b"",
        linkname: bytes = b"",
        mtime: int = 0,
        chksum: str = "unsigned",
    ) -> bytes:
        """One 512-byte header. ``chksum``: "unsigned" (%06o NUL space), "signed", "7digits", "bad"."""
        if isinstance(name, str):
            name = name.encode("utf-8")
        assert len(name) <= 100 and len(prefix) <= 155 and len(linkname) <= 100
        h = bytearray(BLOCK)
        h[0 : len(name)] = name
        h[100:108] = b"0000644\x00"
        h[108:116] = b"0000000\x00"
        h[116:124] = b"0000000\x00"
        h[124:136] = size_field if size_field is not None else b"%011o\x00" % size
        assert len(h) == BLOCK
        h[136:148] = b"%011o\x00" % mtime
        h[148:156] = b" " * 8
        h[156:157] = typeflag
        h[157 : 157 + len(linkname)] = linkname
        h[257 : 257 + len(magic)] = magic
        h[345 : 345 + len(prefix)] = prefix
        assert len(h) == BLOCK
        if chksum == "signed":
            value = sum(b - 256 if b > 127 else b for b in h)
            field = b"%06o\x00 " % value
        elif chksum == "7digits":
            field = b"%07o\x00" % sum(h)
        elif chksum == "bad":
            field = b"%06o\x00 " % (sum(h) + 1)
        else:
            field = b"%06o\x00 " % sum(h)
        h[148:156] = field
        return bytes(h)

    @staticmethod
    def pad(data: bytes) -> bytes:
        return data + bytes(-len(data) % BLOCK)

    @classmethod
    def member(cls, name: bytes | str, data: bytes, **kw: Any) -> bytes:
        """A header plus data plus padding."""
        return cls.header(name, len(data), **kw) + cls.pad(data)

    @staticmethod
    def pax_records(records: dict[str, str] | Iterable[tuple[str, str]]) -> bytes:
        """``"%d %s=%s\\n"`` records, the length counting itself."""
        items = records.items() if isinstance(records, dict) else records
        out = b""
        for key, value in items:
            body = b" " + key.encode() + b"=" + value.encode() + b"\n"
            length = len(body) + 1
            while len(str(length).encode() + body) != length:
                length += 1
            out += str(length).encode() + body
        return out

    @classmethod
    def pax(cls, records: dict[str, str], *, typeflag: bytes = b"x", name: str = "PaxHeaders/x") -> bytes:
        data = cls.pax_records(records)
        return cls.member(name, data, typeflag=typeflag)

    @staticmethod
    def end(body_len: int) -> bytes:
        """Two zero blocks and padding to a full record, for ``body_len`` bytes of members."""
        n = 2 * BLOCK
        n += -(body_len + n) % RECORD
        return bytes(n)

    @classmethod
    def archive(cls, *parts: bytes) -> bytes:
        body = b"".join(parts)
        return body + cls.end(len(body))

    @staticmethod
    def writer_tar(members: Iterable[tuple[str, bytes]]) -> bytes:
        buf = io.BytesIO()
        with tario.TarWriter(buf) as w:
            for name, data in members:
                w.add(name, data)
        return buf.getvalue()

    # -- reading -------------------------------------------------------------------------------

    @staticmethod
    def read_all(
        data: bytes | Any, url: str | None = "mem.tar", *, keyed: bool = False, chunked: int | None = None, **kw: Any
    ) -> list[Any]:
        if isinstance(data, (bytes, bytearray)):
            stream: Any = ChunkedReader(bytes(data), seed=chunked) if chunked is not None else io.BytesIO(data)
        else:
            stream = data
        fn = tario.iter_keyed_members if keyed else tario.iter_members
        return list(fn(stream, url, **kw))

    @classmethod
    def outcome(cls, data: bytes, url: str | None = "mem.tar", **kw: Any) -> tuple[Any, ...]:
        """("ok", items) or ("error", type name, offset, reason) -- comparable across paths."""
        try:
            return ("ok", cls.read_all(data, url, **kw))
        except TarprocError as e:
            return ("error", type(e).__name__, getattr(e, "offset", None), getattr(e, "reason", str(e)))

    # -- GNU tar ---------------------------------------------------------------------------------

    @staticmethod
    def gnu_tar(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        tar = shutil.which("tar")
        if tar is None:
            pytest.skip("GNU tar is not installed")
        env = dict(os.environ, LC_ALL="C.UTF-8")  # names are UTF-8 bytes, whatever the caller's locale
        proc = subprocess.run([tar, *args], capture_output=True, env=env)
        if check and proc.returncode != 0:
            raise AssertionError(f"tar {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
        return proc


@pytest.fixture(scope="session")
def kit() -> type[TarKit]:
    return TarKit


@pytest.fixture(params=["c-fastpath", "pure-python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the C fast path and with the pure-Python reference reader."""
    return c_or_python(request, monkeypatch, tar_reader, "_scan", _C_SCAN)


@pytest.fixture
def c_scan() -> Any:
    """The C scanner, skipping the test when it is not built."""
    return built(_C_SCAN)


@pytest.fixture
def no_source_date_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written archives must not depend on the caller's environment."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


# -------------------------------------------------------------------------------------------
# an HTTP server on 127.0.0.1 (interop tests, and the dataset's counts over HTTP)


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files of the server's directory (no range requests, as Python's server); ``/half/NAME``
    announces the full length of NAME but sends half of it and closes the connection;
    ``/error/NAME`` answers 500, to HEAD too. GET requests are recorded in ``server.requests``."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.server.requests.append(self.path)  # type: ignore[attr-defined]
        if self.path.startswith("/half/"):
            path = Path(self.directory) / self.path[len("/half/") :]
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if self.path.startswith("/error/"):
            self.send_error(500, "server exploded")
            return
        super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self.path.startswith("/error/"):
            self.send_error(500, "server exploded")
            return
        super().do_HEAD()


@pytest.fixture
def http_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "www"
    root.mkdir()

    with _serving(_Handler, root, requests=[]) as server:
        yield SimpleNamespace(root=root, url=f"http://127.0.0.1:{server.server_address[1]}", requests=server.requests)


@contextlib.contextmanager
def _serving(handler_class: Any, root: Path, **attributes: Any) -> Iterator[http.server.ThreadingHTTPServer]:
    """A threading HTTP server on 127.0.0.1 serving ``root`` with ``handler_class``, with
    ``attributes`` set on it (what its handler records or reads), stopped on leaving."""

    def handler(*args: Any, **kw: Any) -> Any:
        return handler_class(*args, directory=str(root), **kw)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    for name, value in attributes.items():
        setattr(server, name, value)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with Range support (206); records each GET's Range header."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        rng = self.headers.get("Range")
        self.server.log.append((self.path, rng))  # type: ignore[attr-defined]
        path = Path(self.directory) / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        if rng and rng.startswith("bytes=") and not self.server.ignore_ranges:  # type: ignore[attr-defined]
            lo, hi = rng[len("bytes=") :].split("-")
            a, b = int(lo), min(int(hi) if hi else len(data) - 1, len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
            body = data[a : b + 1]
        else:
            self.send_response(200)
            body = data
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def range_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An HTTP server on 127.0.0.1 with Range support: (server, root dir, base URL); ``server.log``
    records each GET's (path, Range), ``server.ignore_ranges = True`` makes it answer 200 to all."""
    root = tmp_path / "www"
    root.mkdir()

    with _serving(_RangeHandler, root, log=[], ignore_ranges=False) as server:
        yield server, root, f"http://127.0.0.1:{server.server_address[1]}"
