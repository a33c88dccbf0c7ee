"""CURVE encryption and authentication for tarserve/tarrecv: one key directory, made by ``tarkeys``.

The sender is the CURVE server: it holds ``server.key_secret`` and accepts only the clients whose
public keys are in ``authorized_clients/``. A receiver is a client: it needs ``server.key`` and its
own ``client.key_secret``. Copy the whole directory to both sides, or only those files to each.
Without the right keys the handshake fails: both sides stop with an error that says so (see
``Handshakes``), instead of waiting in silence.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OptionError, SinkError, TransportError

SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized_clients"


def generate_keys(directory: str | os.PathLike[str], *, force: bool = False) -> list[Path]:
    """Write a server and a client key pair and authorize the client; returns the files written."""
    import zmq
    import zmq.auth

    if not zmq.has("curve"):
        raise OptionError("this libzmq has no CURVE support")
    root = Path(directory)
    existing = [p for p in (root / f"{SERVER}.key_secret", root / f"{CLIENT}.key_secret") if p.exists()]
    if existing and not force:
        raise SinkError(f"{existing[0]} exists; use --overwrite to replace the keys (old clients stop working)")
    try:
        if not root.exists():  # an existing directory keeps its mode: it may be shared, or "."
            root.mkdir(parents=True)
            os.chmod(root, 0o700)
        if (root / AUTHORIZED).exists():
            shutil.rmtree(root / AUTHORIZED)
        (root / AUTHORIZED).mkdir()
        written: list[Path] = []
        for name in (SERVER, CLIENT):
            public, secret = zmq.auth.create_certificates(str(root), name)
            os.chmod(secret, 0o600)
            written += [Path(public), Path(secret)]
        shutil.copy(root / f"{CLIENT}.key", root / AUTHORIZED / f"{CLIENT}.key")
        written.append(root / AUTHORIZED / f"{CLIENT}.key")
    except OSError as e:
        raise SinkError(f"cannot write keys: {e}", str(root)) from None
    return written


def _load(path: Path) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not path.exists():
        raise OptionError(f"{path}: no such key file (make keys with: tarkeys {path.parent})")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise OptionError(f"{path}: not a CURVE key file ({e})") from None
    return public, secret


def server_keys(directory: str | os.PathLike[str]) -> tuple[bytes, bytes, Path]:
    """The sender's key pair and the directory of authorized client keys."""
    root = Path(directory)
    public, secret = _load(root / f"{SERVER}.key_secret")
    if secret is None:
        raise OptionError(f"{root / f'{SERVER}.key_secret'}: has no secret key")
    if not (root / AUTHORIZED).is_dir():
        raise OptionError(f"{root / AUTHORIZED}: no such directory of authorized client keys")
    return public, secret, root / AUTHORIZED


def client_keys(directory: str | os.PathLike[str]) -> tuple[bytes, bytes, bytes]:
    """A receiver's key pair and the server's public key."""
    root = Path(directory)
    public, secret = _load(root / f"{CLIENT}.key_secret")
    server_public, _ = _load(root / f"{SERVER}.key")
    if secret is None:
        raise OptionError(f"{root / f'{CLIENT}.key_secret'}: has no secret key")
    return public, secret, server_public


class Authenticator:
    """ZAP handler of a sender's context: only authorized client keys get through."""

    def __init__(self, context: Any, authorized: Path) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(context)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=str(authorized))

    def stop(self) -> None:
        self._auth.stop()


def make_server(socket: Any, keys: tuple[bytes, bytes, Path]) -> None:
    public, secret, _ = keys
    _set_keys(socket, curve_secretkey=secret, curve_publickey=public, curve_server=True)


def make_client(socket: Any, keys: tuple[bytes, bytes, bytes]) -> None:
    public, secret, server_public = keys
    _set_keys(socket, curve_secretkey=secret, curve_publickey=public, curve_serverkey=server_public)


def _set_keys(socket: Any, **options: Any) -> None:
    """Set CURVE options; one ZMQ refuses (a libzmq without CURVE, a malformed key) is a
    ``TransportError`` (the socket is already in its owner's list, which closes it)."""
    import zmq

    for name, value in options.items():
        try:
            setattr(socket, name, value)
        except (zmq.ZMQError, TypeError, ValueError) as e:
            raise TransportError(f"cannot set up CURVE encryption ({name}): {e}") from None


# -- failed handshakes ------------------------------------------------------------------------------
#
# Mismatched keys used to show only as silence: ZMQ retries a failed handshake quietly. A socket
# monitor (libzmq >= 4.3) reports each handshake; the sender and the receiver watch theirs and
# stop with a TransportError that says what is wrong, within a second.

_SUCCEEDED, _NO_DETAIL, _PROTOCOL, _AUTH = 0x1000, 0x0800, 0x2000, 0x4000  # zmq.EVENT_HANDSHAKE_*
_CRYPTOGRAPHIC, _MECHANISM_MISMATCH, _KEY_EXCHANGE = 0x11000001, 0x11000002, 0x10000003  # PROTOCOL_ERROR_ZMTP_*


def handshake_events() -> int:
    """The monitor event mask of handshake results, or 0 where libzmq does not report them."""
    import zmq

    return _SUCCEEDED | _NO_DETAIL | _PROTOCOL | _AUTH if zmq.zmq_version_info() >= (4, 3) else 0


HANGUP_GRACE = 5.0  # seconds a connecting end waits for a peer that hung up during its first handshake


@dataclass
class Handshakes:
    """The handshakes of one socket: ``succeeded`` once a peer got through."""

    side: str  # "sender" or "receiver": this end
    curve: bool  # this end uses CURVE
    url: str  # this end's endpoint
    bound: bool  # this end listens (so peers are anyone who connects)
    succeeded: bool = False
    doubt: str | None = None  # a failure that was ignored (see ``failure``), for a timeout's message
    hung_up: tuple[float, str] | None = None  # (when, reason) of a first hang-up not yet judged (``verdict``)

    def verdict(self, event: int, value: int, now: float) -> str | None:
        """``failure``, judged: the reason to stop for, on a socket no peer has got through on yet.

        A peer that hangs up during the handshake may be one with other keys, or one that found out
        first that the keys don't match -- or a receiver killed (stopped, restarted) in the middle
        of it, which a stream must outlive. So a hang-up is judged later: one that ZMQ reconnects
        to (every 0.1 s) and that hangs up again can't get through; one that can't be reached
        again for ``HANGUP_GRACE`` seconds (``overdue``) is taken for what it said; a handshake that
        gets through forgets it."""
        reason = self.failure(event, value)
        if self.succeeded:
            self.hung_up = None
            return None
        if reason is None:
            return None
        if event == _NO_DETAIL and self.hung_up is None:
            self.hung_up, self.doubt = (now, reason), reason
            return None
        return reason

    def overdue(self, now: float) -> str | None:
        """The reason of a hang-up (``verdict``) whose peer has not come back for ``HANGUP_GRACE`` s."""
        if self.hung_up is not None and not self.succeeded and now - self.hung_up[0] >= HANGUP_GRACE:
            return self.hung_up[1]
        return None

    def failure(self, event: int, value: int) -> str | None:
        """The reason, in one line, when ``event`` is a handshake that failed over keys (None for
        a success, and for garbage from something that is not a ZMQ peer: a port scan)."""
        if event == _SUCCEEDED:
            self.succeeded = True
            return None
        role = "receiver" if self.side == "sender" else "sender"
        peer = f"a {role} connected to {self.url}" if self.bound else f"the {role} at {self.url}"
        same = "give both sides the same --curve-keys directory"
        if event == _PROTOCOL and value == _MECHANISM_MISMATCH:
            if self.curve:
                return f"{peer} does not use CURVE: {same}"
            return f"{peer} uses CURVE and this {self.side} does not: give it --curve-keys"
        if event == _NO_DETAIL and self.bound and not (self.curve and self.side == "receiver"):
            # a port scan, or a peer that found out before us that the keys don't match
            hint = "with other CURVE keys" if self.curve else "using CURVE (then give --curve-keys here too)"
            self.doubt = (f"{peer} hung up during the handshake: a {role} {hint}, a tarproc that speaks wire "
                          "format v1 (PUSH/PULL sockets; run the same version on both sides), or not a ZMQ peer")
            return None
        if event == _NO_DETAIL:
            # the peer hung up: a CURVE server that can't open our hello (another key pair) does,
            # and so does a peer that found out first that the keys don't match. A port this end
            # listens on hears that from port scans too: ignored there, except by a CURVE
            # receiver (for which it is the only sign of a sender with other keys)
            other = "tarserve" if role == "sender" else "tarrecv"
            if self.curve:
                return (f"{peer} hung up during the CURVE handshake: it has other keys (another tarkeys "
                        f"directory) or none, or it is not a {other}; {same}")
            return f"{peer} hung up during the handshake: it uses CURVE (give --curve-keys), or it is not a {other}"
        if not self.curve:
            return None  # a plain socket sees other failures only from garbage
        if event == _AUTH:
            if self.side == "sender":
                return f"the CURVE key of {peer} is not authorized (not in this sender's authorized_clients/): {same}"
            return f"{peer} refused this receiver's CURVE key (status {value}): {same}"
        if event == _PROTOCOL and value in (_CRYPTOGRAPHIC, _KEY_EXCHANGE):
            return f"the CURVE handshake with {peer} failed: it has other keys (another tarkeys directory); {same}"
        return None
