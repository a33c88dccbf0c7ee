"""ZMQ endpoint URLs in tensorcom's grammar.

``zpush://host:port`` connects a PUSH socket, ``zpull://host:port`` binds a PULL socket,
``zpub`` binds a PUB, ``zsub`` connects a SUB; the ``zr`` variants (``zrpush``, ``zrpull``,
``zrpub``, ``zrsub``) swap bind and connect. ``+ipc`` selects the ipc transport
(``zpull+ipc:///tmp/feed``). Brace lists give several endpoints (``zpush://h:788{0..3}``).

A bind with no host (``zpull://:7880``) binds 127.0.0.1 only: listening on every interface
(``zpull://*:7880`` or ``0.0.0.0``) has to be asked for. A plain ZMQ address (``tcp://host:port``,
``ipc:///path``) means the default pattern: a sender's PUSH connects, a receiver's PULL binds.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from ..errors import OptionError
from ..sources import expand_braces

PATTERNS = {
    # scheme: (socket type, binds)
    "zpush": ("push", False),
    "zpull": ("pull", True),
    "zpub": ("pub", True),
    "zsub": ("sub", False),
    "zrpush": ("push", True),
    "zrpull": ("pull", False),
    "zrpub": ("pub", False),
    "zrsub": ("sub", True),
}
SENDING = ("push", "pub")
RECEIVING = ("pull", "sub")
# the longest path of a Unix socket (sockaddr_un.sun_path, less its terminating NUL)
IPC_PATH_MAX = 103 if sys.platform == "darwin" or "bsd" in sys.platform else 107
_URL = re.compile(r"^(?P<scheme>z[a-z]+)(?P<ipc>\+ipc)?://(?P<rest>.*)$")


@dataclass(frozen=True)
class Endpoint:
    """One socket: its ZMQ type, whether it binds, and the ZMQ address (``tcp://…``/``ipc://…``)."""

    url: str
    kind: str
    bind: bool
    address: str

    @property
    def sends(self) -> bool:
        return self.kind in SENDING


def parse_endpoint(url: str) -> Endpoint:
    """One URL without braces.

    >>> parse_endpoint("zpush://trainer:7880")
    Endpoint(url='zpush://trainer:7880', kind='push', bind=False, address='tcp://trainer:7880')
    >>> parse_endpoint("zpull://:7880").address
    'tcp://127.0.0.1:7880'
    >>> parse_endpoint("zpull+ipc:///tmp/feed").address
    'ipc:///tmp/feed'
    """
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as e:
        raise OptionError(f"bad ZMQ URL {url!r}: character {e.start} is not text (a lone surrogate)") from None
    match = _URL.match(url)
    if not match or match["scheme"] not in PATTERNS:
        raise OptionError(
            f"bad ZMQ URL {url!r}; expected zpush|zpull|zpub|zsub (or zr…, +ipc)://host:port, e.g. zpull://:7880"
        )
    kind, bind = PATTERNS[match["scheme"]]
    rest = match["rest"]
    if match["ipc"]:
        if not rest:
            raise OptionError(f"bad ZMQ URL {url!r}: no ipc path")
        if len(rest.encode()) > IPC_PATH_MAX:
            raise OptionError(f"bad ZMQ URL {url!r}: the ipc path is {len(rest.encode())} bytes, over the "
                              f"{IPC_PATH_MAX} a Unix socket's path may have; use a shorter one")
        return Endpoint(url, kind, bind, f"ipc://{rest}")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"bad ZMQ URL {url!r}: expected host:port with a port from 1 to 65535")
    if host in ("", "localhost"):
        host = "127.0.0.1"
    elif host == "0.0.0.0":
        host = "*"
    if host == "*" and not bind:
        raise OptionError(f"bad ZMQ URL {url!r}: a connecting socket needs a host name, not '*'")
    return Endpoint(url, kind, bind, f"tcp://{host}:{port}")


def parse_endpoints(urls: str | list[str] | tuple[str, ...], *, sending: bool) -> list[Endpoint]:
    """Every endpoint of ``urls`` (brace lists expanded), all sending or all receiving.

    >>> [e.address for e in parse_endpoints("zpush://h:788{0..1}", sending=True)]
    ['tcp://h:7880', 'tcp://h:7881']
    """
    if isinstance(urls, str):
        urls = [urls]
    default = "zpush" if sending else "zpull"
    endpoints = [parse_endpoint(_with_pattern(one, default)) for url in urls for one in expand_braces(url)]
    if not endpoints:
        raise OptionError("no ZMQ URL given")
    wrong = [e.url for e in endpoints if e.sends != sending]
    if wrong:
        want = "zpush/zpub (or zrpush/zrpub)" if sending else "zpull/zsub (or zrpull/zrsub)"
        raise OptionError(f"{wrong[0]}: this side {'sends' if sending else 'receives'}; use {want}")
    kinds = {e.kind for e in endpoints}
    if len(kinds) > 1:
        raise OptionError(f"mixed socket patterns in {', '.join(e.url for e in endpoints)}: use PUSH/PULL or PUB/SUB")
    addresses = [e.address for e in endpoints]
    if len(set(addresses)) != len(addresses):
        raise OptionError(f"the same endpoint twice in {', '.join(urls)}")
    return endpoints


def _with_pattern(url: str, default: str) -> str:
    """``tcp://h:p`` -> ``zpush://h:p``, ``ipc:///x`` -> ``zpush+ipc:///x`` (for a sender)."""
    if url.startswith("tcp://"):
        return f"{default}://{url[6:]}"
    if url.startswith("ipc://"):
        return f"{default}+ipc://{url[6:]}"
    return url


def is_zmq_url(text: str) -> bool:
    """Whether ``text`` looks like a ZMQ URL (so a command can tell it from an input)."""
    if text.startswith(("tcp://", "ipc://")):
        return True
    match = _URL.match(text)
    return bool(match) and match["scheme"] in PATTERNS  # type: ignore[index]
