"""Making ZMQ sockets so that no set-up error can hang the process.

``zmq.Context.term()`` waits for every socket of the context to be closed. A socket made and
then left behind by an error (an option ZMQ refuses, a bind to an address in use) makes the
process hang for ever at its end. So a socket is registered in its owner's list the moment it
exists, before any option is set (``open_socket``), every option error is a one-line
``TransportError`` naming the endpoint (``set_option``), and a bind or connect that fails says
why in words (``attach``). On an error path the owner closes its sockets with linger 0
(``close_sockets``) and, when the context is its own, destroys it: whatever else it made, term
can't wait for it.

Values that ZMQ takes as C ints (milliseconds, high-water marks) are checked before a socket is
made (``check_int``): a bad one is an ``OptionError``, a usage error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import threading
from typing import Any

from ..errors import OptionError, TransportError
from .urls import Endpoint

MAX_C_INT = 2**31 - 1  # ZMQ's int options (milliseconds, high-water marks)
MAX_INT64 = 2**63 - 1  # ZMQ's int64 options (MAXMSGSIZE)


def check_int(value: int, name: str, *, high: int = MAX_C_INT) -> None:
    """An ``OptionError`` when ``value`` (already an int) does not fit the ZMQ option it is for."""
    if not 0 <= value <= high:
        raise OptionError(f"{name} {value} is out of range: ZMQ takes 0 to {high}")


def check_milliseconds(seconds: float, name: str, *, factor: int = 1) -> None:
    """An ``OptionError`` when ``seconds × factor`` in milliseconds is no ZMQ C int."""
    limit = MAX_C_INT / 1000 / factor
    if not seconds <= limit:  # nan too
        raise OptionError(f"bad {name} {seconds:g} s; must be at most {int(limit)} s")


def open_socket(context: Any, kind: int, owned: list[Any]) -> Any:
    """A new socket of ``kind``, already in ``owned`` (the list its owner closes)."""
    sock = context.socket(kind)
    owned.append(sock)
    return sock


def set_option(sock: Any, option: int, value: Any, endpoint: Endpoint) -> None:
    """``sock.setsockopt(option, value)``; any failure is a ``TransportError`` naming the endpoint."""
    import zmq

    try:
        sock.setsockopt(option, value)
    except (zmq.ZMQError, OverflowError, TypeError, ValueError) as e:
        name = _option_name(option)
        reason = _words(e) if isinstance(e, zmq.ZMQError) else str(e)
        raise TransportError(f"cannot set {name} to {value!r} on the socket for {endpoint.address}: {reason}",
                             endpoint.url) from None


def attach(sock: Any, endpoint: Endpoint) -> None:
    """Bind or connect ``sock`` as ``endpoint`` says; a failure is a ``TransportError`` naming it."""
    import zmq

    try:
        if endpoint.bind:
            sock.bind(endpoint.address)
        else:
            sock.connect(endpoint.address)
    except zmq.ZMQError as e:
        verb = "bind" if endpoint.bind else "connect to"
        raise TransportError(f"cannot {verb} {endpoint.address}: {_bind_reason(e, endpoint)}", endpoint.url) from None


def close_sockets(sockets: list[Any], linger: int = 0) -> None:
    """Close every socket of ``sockets`` (those already closed too: closing twice is harmless)."""
    for sock in sockets:
        if sock is not None:
            try:
                sock.close(linger)
            except Exception:  # noqa: BLE001 - a linger ZMQ refuses: closed at once, never left open
                sock.close(0)


def destroy(context: Any, wait: float = 2.0) -> None:
    """Close every socket ``context`` made, linger 0, and terminate it, waiting ``wait`` seconds at
    most (an error path's end). An interrupt that came while a socket was being made can leave one
    ZMQ knows and Python does not: term would wait for it for ever, so it waits in a thread."""
    for sock in list(getattr(context, "_sockets", ()) or ()):
        with contextlib.suppress(Exception):
            sock.close(0)
    ender = threading.Thread(target=_term, args=(context,), name="tarproc-zmq-term", daemon=True)
    ender.start()
    ender.join(wait)


def _term(context: Any) -> None:
    with contextlib.suppress(Exception):
        context.term()


def monitor_event(monitor: Any, flags: int = 0) -> tuple[int, int]:
    """(event, value) of the next message on a socket monitor (``get_monitor_socket``): what
    ``zmq.utils.monitor.recv_monitor_message`` gives, without its import of asyncio (a tenth of a
    second at every start of a sender or receiver process)."""
    frames = monitor.recv_multipart(flags)
    if len(frames) != 2 or len(frames[0]) != 6:
        raise TransportError(f"unexpected socket monitor message of {len(frames)} frames")
    event, value = struct.unpack("=Hi", frames[0])
    return event, value


def _option_name(option: int) -> str:
    import zmq

    try:
        return zmq.SocketOption(option).name
    except ValueError:
        return f"socket option {option}"


def _words(e: Any) -> str:
    """A ZMQ error's reason without pyzmq's ``(addr='…')`` tail."""
    code = e.errno or 0
    if 0 < code < 1000:  # a system errno: its plain words
        return os.strerror(code)
    import zmq

    return str(zmq.strerror(code))


def _bind_reason(e: Any, endpoint: Endpoint) -> str:
    ipc = endpoint.address.startswith("ipc://")
    code = e.errno
    if code == errno.EADDRINUSE:
        return "the address is in use (another tarrecv or tarserve there?)"
    if code == errno.EADDRNOTAVAIL:
        return "not an address of this host"
    if code == errno.EACCES:
        return ("permission denied (is the directory writable?)" if ipc
                else "permission denied (ports below 1024 need privileges)")
    if code == errno.ENOENT and ipc:
        return f"no such directory: {os.path.dirname(endpoint.address[len('ipc://'):]) or '.'}"
    if code == errno.ENODEV and not ipc:
        return "no interface or address of this host by that name"
    if code == errno.ENAMETOOLONG:
        return "the path is too long for a Unix socket"
    if code == errno.EINVAL and not ipc:
        return "not a valid host name or address"
    return _words(e)
