"""tarkeys: make the CURVE keys that encrypt and authenticate tarserve -> tarrecv traffic."""

from __future__ import annotations

import click

from ..transport.curve import generate_keys
from .common import TarprocCommand, common_options, say, shared_option

EPILOG = """\b
Examples:
  tarkeys ~/.tarproc/keys
  tarserve 'train-{0000..0147}.tar' --to zpush://trainer:7880 --curve-keys ~/.tarproc/keys --size 224
  tarrecv zpull://0.0.0.0:7880 --curve-keys ~/.tarproc/keys

\b
Writes DIR/server.key and server.key_secret (tarserve's pair: it is the CURVE server),
DIR/client.key and client.key_secret (the receivers' pair) and DIR/authorized_clients/client.key
(the client keys tarserve accepts; add more public keys there for more client pairs). Secret
files are mode 0600 and DIR 0700. Copy DIR to the senders and the receivers (or give the senders
server.key_secret and authorized_clients/, the receivers client.key_secret and server.key). A
receiver without the keys completes no handshake and receives nothing; the traffic is encrypted.
"""


@click.command("tarkeys", cls=TarprocCommand, epilog=EPILOG)
@click.argument("directory", type=click.Path(file_okay=False), metavar="DIR")
@shared_option("--overwrite", "force", is_flag=True,
               help="Replace existing keys (receivers with the old keys stop working).")
@common_options
def main(directory: str, force: bool, quiet: bool) -> None:
    """Generate CURVE key pairs for tarserve (server) and tarrecv/Receiver (client) in DIR."""
    written = generate_keys(directory, force=force)
    if not quiet:
        for path in written:
            say(f"tarkeys: wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarkeys")
