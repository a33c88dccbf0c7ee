"""CURVE encryption and authentication for tarserve/tarrecv: one key directory, made by ``tarkeys``.

The sender is the CURVE server: it holds ``server.key_secret`` and accepts only the clients whose
public keys are in ``authorized_clients/``. A receiver is a client: it needs ``server.key`` and its
own ``client.key_secret``. Copy the whole directory to both sides, or only those files to each.
Without the right keys a receiver's handshake fails and it receives nothing.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import OptionError, SinkError

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
        raise SinkError(f"{existing[0]} exists; use --force to replace the keys (old clients stop working)")
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
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_server = True


def make_client(socket: Any, keys: tuple[bytes, bytes, bytes]) -> None:
    public, secret, server_public = keys
    socket.curve_secretkey = secret
    socket.curve_publickey = public
    socket.curve_serverkey = server_public
