"""Test servers on 127.0.0.1 that misbehave on purpose, standard library only.

``FaultServer`` serves the files of a directory over HTTP/1.1 (keep-alive, ranges, ETag) and can be
told to cut, fail, stall or drip given requests, to stop listening for a while (connections refused),
and answers every path under ``/loop/`` with a redirect to itself. ``CuttingProxy`` is a TCP proxy
that resets a connection after a number of server-to-client bytes (put it in front of any server,
e.g. moto's S3). Used by the tests and by the remote-reading benchmark.
"""

from __future__ import annotations

import os
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*")


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    range: str | None
    status: int  # 0 until the answer starts
    sent: int  # body bytes, counted as they are handed to the kernel


@dataclass
class _Fault:
    kind: str  # "cut", "fail", "stall", "drip" or "refuse"
    path: str
    times: int
    after: int = 0
    status: int = 503
    seconds: float = 0.0
    retry_after: float | None = None
    reset: bool = False

    def matches(self, method: str, path: str) -> bool:
        return (self.path == "*" or self.path == path) and (method == "GET" or self.kind == "fail")


def _reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0, so the peer gets a reset."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _parse_range(value: str, size: int) -> tuple[int, int] | None:
    """(first, last) of a single byte range, first >= size when unsatisfiable; None to ignore it."""
    m = _RANGE.fullmatch(value)
    if not m or not (m[1] or m[2]):
        return None
    if not m[1]:  # suffix range: the last N bytes
        n = int(m[2])
        return (size, size) if n == 0 else (max(0, size - n), size - 1)
    first = int(m[1])
    if m[2] and int(m[2]) < first:
        return None
    return first, min(int(m[2]), size - 1) if m[2] else size - 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: FaultServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # never print tracebacks to stderr


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.owner._conns.add(self.connection)
        self._rec = Request("", "", None, 0, 0)

    def finish(self) -> None:
        self.server.owner._conns.discard(self.connection)
        super().finish()

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def _answer(self, method: str) -> None:
        fs = self.server.owner
        path = urlsplit(self.path).path
        header = self.headers.get("Range")
        self._rec = Request(method, path, header, 0, 0)
        with fs._lock:
            fs.requests.append(self._rec)
        if fs.latency > 0:
            time.sleep(fs.latency)
        if fs._take(method, path, ("refuse",)) is not None:
            fs.refuse()  # this connection is served; the next ones are refused
        if path.startswith("/loop/"):
            self._simple(method, 302, b"see there\n", {"Location": self.path})
            return
        fault = fs._take(method, path, ("fail",))
        if fault is not None:
            body = f"injected {fault.status}\n".encode()
            extra = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
            self._simple(method, fault.status, body, extra)
            return
        f = fs._file(path)
        if f is None:
            self._simple(method, 404, b"not found\n")
            return
        with f:
            self._send_file(method, path, f, None if fs.ignore_range else header)

    def _simple(self, method: str, status: int, body: bytes, extra: dict[str, str] | None = None) -> None:
        self._rec.status = status
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method == "GET":
            self._rec.sent = len(body)
            self.wfile.write(body)

    def _send_file(self, method: str, path: str, f: BinaryIO, header: str | None) -> None:
        fs = self.server.owner
        st = os.fstat(f.fileno())
        size = st.st_size
        first, last = 0, size - 1
        span = None if header is None else _parse_range(header, size)
        if span is not None:
            first, last = span
            if first >= size:
                self._simple(method, 416, b"range not satisfiable\n", {"Content-Range": f"bytes */{size}"})
                return
        status = self._rec.status = 200 if span is None else 206
        self.send_response(status)
        self.send_header("Content-Type", "application/x-tar")
        self.send_header("Content-Length", str(last - first + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        if not fs.ignore_range:
            self.send_header("Accept-Ranges", "bytes")
        if fs.etag:
            self.send_header("ETag", f'"{size:x}-{st.st_mtime_ns:x}"')
            self.send_header("Last-Modified", formatdate(st.st_mtime, usegmt=True))
        self.end_headers()
        if method == "GET":
            self._body(f, first, last - first + 1, fs._take(method, path, ("cut", "stall", "drip")))

    def _body(self, f: BinaryIO, offset: int, length: int, fault: _Fault | None) -> None:
        try:
            upto = length if fault is None else min(length, fault.after)
            self._pump(f, offset, upto)
            if fault is not None and fault.kind == "cut":
                self._cut(fault.reset)
                return
            if fault is not None and fault.kind == "drip":
                while self._rec.sent < length:
                    if not self._wait(fault.seconds):
                        self.close_connection = True
                        return
                    self._pump(f, offset + self._rec.sent, 1)
                return
            if fault is not None and not self._wait(fault.seconds):
                self.close_connection = True
                return
            self._pump(f, offset + self._rec.sent, length - self._rec.sent)
        except OSError:
            self.close_connection = True

    def _pump(self, f: BinaryIO, offset: int, count: int) -> None:
        """sendfile `count` bytes from `offset`, paced to `rate` when set; counted before they go out."""
        rate = self.server.owner.rate
        out, src = self.connection.fileno(), f.fileno()
        start, done = time.monotonic(), 0
        while done < count:
            n = count - done if not rate else min(count - done, max(1, int(rate / 50)))
            self._rec.sent += n  # so the record is complete before the client has the bytes
            try:
                k = os.sendfile(out, src, offset + done, n)
            except OSError:
                self._rec.sent -= n
                raise
            self._rec.sent += k - n
            if k == 0:  # the file shrank: the Content-Length can't be met
                raise ConnectionAbortedError("file shrank")
            done += k
            if rate and (delay := start + done / rate - time.monotonic()) > 0:
                time.sleep(delay)

    def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`; False as soon as the client has closed."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if select.select([self.connection], [], [], min(left, 0.05))[0]:
                if not self.connection.recv(1, socket.MSG_PEEK):
                    return False
                time.sleep(max(0.0, end - time.monotonic()))  # a pipelined request: just wait
                break
        return True

    def _cut(self, reset: bool) -> None:
        self.close_connection = True
        self.rfile.close()  # drop its reference, so close() really closes the socket
        if reset:
            _reset(self.connection)
        else:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.connection.close()


class FaultServer:
    """Serves the files under `root` on 127.0.0.1:<free port>; context manager, also start()/stop()."""

    def __init__(
        self, root: str | Path, *, latency: float = 0.0, ignore_range: bool = False, rate: float | None = None,
        etag: bool = True,
    ) -> None:
        self.root = Path(root).resolve()
        self.latency = latency
        self.ignore_range = ignore_range
        self.rate = rate
        self.etag = etag  # False: answers say neither an ETag nor a Last-Modified time
        self.refusing = threading.Event()  # set while nothing listens (connections are refused)
        self._listening = threading.Lock()  # held while the listening socket is closed or opened
        self._resume_timer: threading.Timer | None = None
        self._stopped = False
        self.requests: list[Request] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread: threading.Thread | None = None
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultServer:
        """Serve in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
            self._thread.daemon = True
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections, close the socket."""
        with self._listening:
            self._stopped = True
            if self._resume_timer is not None:
                self._resume_timer.cancel()
            self._stop_listening()
        for sock in list(self._conns):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _stop_listening(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None

    def refuse(self, after: str | None = None) -> None:
        """Stop listening: connections are refused until ``resume()`` (those open are served on).
        With ``after``: when the next GET of that path comes (it is served; the next connection is
        refused). ``refusing`` is set while it lasts."""
        if after is not None:
            self._add(_Fault("refuse", after, 1))
            return
        with self._listening:
            if self.refusing.is_set():
                return
            self._stop_listening()
            self._server.socket.close()
            self.refusing.set()

    def resume(self) -> None:
        """Listen again, on the same port."""
        with self._listening:
            if not self.refusing.is_set() or self._stopped:
                return
            server = self._server
            server.socket = socket.socket(server.address_family, server.socket_type)
            server.server_bind()  # SO_REUSEADDR: the port is free again at once
            server.server_activate()
            self.refusing.clear()
            self.start()

    def refuse_for(self, seconds: float) -> None:
        """Refuse connections now, and listen again after ``seconds``."""
        self.refuse()
        with self._listening:
            self._resume_timer = threading.Timer(seconds, self.resume)
            self._resume_timer.daemon = True
            self._resume_timer.start()

    def _file(self, path: str) -> BinaryIO | None:
        file = (self.root / unquote(path).lstrip("/")).resolve()
        try:
            return open(file, "rb") if file.is_relative_to(self.root) and file.is_file() else None
        except OSError:
            return None

    def _add(self, fault: _Fault) -> None:
        if fault.times > 0:
            with self._lock:
                self._faults.append(fault)

    def cut(self, path: str, after: int, times: int = 1, reset: bool = False) -> None:
        """The next `times` GETs of `path` ("*": any) send `after` body bytes, then close the connection
        (the client reads a short body), or with `reset` reset it (the client may lose what it had
        received but not read yet)."""
        self._add(_Fault("cut", path, times, after=after, reset=reset))

    def fail(self, path: str, status: int = 503, times: int = 1, retry_after: float | None = None) -> None:
        """The next `times` GETs or HEADs of `path` answer `status` (with Retry-After when given)."""
        self._add(_Fault("fail", path, times, status=status, retry_after=retry_after))

    def stall(self, path: str, after: int, seconds: float, times: int = 1) -> None:
        """The next `times` GETs of `path` send `after` body bytes, pause `seconds`, then go on."""
        self._add(_Fault("stall", path, times, after=after, seconds=seconds))

    def drip(self, path: str, after: int, every: float, times: int = 1) -> None:
        """The next `times` GETs of `path` send `after` body bytes, then one byte every `every`
        seconds (until the body is sent or the client goes away)."""
        self._add(_Fault("drip", path, times, after=after, seconds=every))

    def clear(self) -> None:
        """Drop the faults not yet used."""
        with self._lock:
            self._faults.clear()

    def gets(self, path: str | None = None) -> list[Request]:
        """The GET requests (of `path` when given)."""
        with self._lock:
            return [r for r in self.requests if r.method == "GET" and (path is None or r.path == path)]

    def _take(self, method: str, path: str, kinds: tuple[str, ...]) -> _Fault | None:
        """Consume the first fault matching this request if it is of one of `kinds`."""
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.matches(method, path):
                    if fault.kind not in kinds:
                        return None
                    fault.times -= 1
                    if fault.times <= 0:
                        del self._faults[i]
                    return fault
        return None


class CuttingProxy:
    """A TCP proxy on 127.0.0.1:<free port> to `target` ("127.0.0.1:PORT"); context manager.

    The first `times` connections whose server-to-client bytes exceed `cut_after` get exactly
    `cut_after` of them, then both sides are reset; later connections pass untouched.
    """

    def __init__(self, target: str, *, cut_after: int, times: int = 1) -> None:
        host, _, port = target.split("://")[-1].rstrip("/").rpartition(":")
        self._target = (host, int(port))
        self.cut_after = cut_after
        self.times = times
        self.cuts = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread: threading.Thread | None = None
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def start(self) -> CuttingProxy:
        """Accept connections in a daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._accept, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, end the relays, close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._listener.close()

    def __enter__(self) -> CuttingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._listener], [], [], 0.05)[0]:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._target, timeout=10)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = {client: upstream, upstream: client}
        reading = {client, upstream}
        down, armed = 0, True
        try:
            while reading and not self._stop.is_set():
                for src in select.select(list(reading), [], [], 0.1)[0]:
                    data = src.recv(1 << 16)
                    if not data:  # half-close: pass the EOF on
                        reading.discard(src)
                        peer[src].shutdown(socket.SHUT_WR)
                        continue
                    if src is upstream and armed and down + len(data) > self.cut_after:
                        armed = False
                        with self._lock:
                            cut = self.cuts < self.times
                            if cut:
                                self.cuts += 1
                        if cut:
                            client.sendall(data[: self.cut_after - down])
                            _reset(client)
                            _reset(upstream)
                            return
                    if src is upstream:
                        down += len(data)
                    peer[src].sendall(data)
        except OSError:  # one side failed: reset the other too
            _reset(client)
            _reset(upstream)
        finally:
            client.close()
            upstream.close()
