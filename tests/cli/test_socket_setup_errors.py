"""Socket set-up errors of tarserve, tarrecv, Sender and Receiver, in real processes.

Each is one line on stderr and an exit status (2 for usage, 1 otherwise), within seconds: a
socket left behind by an error used to hang the process for ever in ``Context.term()``. Every
run has a timeout, so a hang fails the test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tarhelpers import free_port

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux processes and ipc sockets")
TIMEOUT = 30  # a hang fails; a set-up error ends in well under a second


def run(name: str, *args: object, cwd: Path | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run([sys.executable, "-m", f"tarproc.cli.{name}", *map(str, args)], capture_output=True,
                              timeout=TIMEOUT, cwd=cwd)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} {' '.join(map(str, args))} hung")
    return done.returncode, done.stderr.decode(errors="replace")


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    # a usage error adds "Try 'COMMAND --help' for help." on a line of its own
    if lines and lines[-1].startswith("Try '"):
        lines = lines[:-1]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err and "addr=" not in err, err
    return lines[0]


@pytest.fixture
def shard(cli, tmp_path) -> Path:  # type: ignore[no-untyped-def]
    return cli.write_tar(tmp_path / "x.tar", [{"__key__": f"k{i}", "txt": b"x"} for i in range(3)])  # type: ignore[no-any-return]


@pytest.fixture
def taken_port():  # type: ignore[no-untyped-def]
    """A TCP port on 127.0.0.1 that something else listens on."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    yield holder.getsockname()[1]
    holder.close()


def sending(shard: Path, *urls: str, extra: tuple[object, ...] = ()) -> tuple[int, str]:
    timeout = () if "--send-timeout" in extra else ("--send-timeout", 5)
    return run("tarserve", "--raw", shard, *timeout, *[a for url in urls for a in ("--to", url)], *extra)


def receiving(*urls: str) -> tuple[int, str]:
    return run("tarrecv", *urls, "--wait", 5)


def test_a_bind_to_an_address_in_use(shard, taken_port) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, f"zrpush://:{taken_port}"), sending(shard, f"zpub://:{taken_port}"),
                      receiving(f"zpull://:{taken_port}"), receiving(f"zrsub://:{taken_port}"),
                      receiving(f"zpull://:{free_port()}", f"zpull://:{taken_port}")):  # the second socket of two
        assert code == 1 and f"cannot bind tcp://127.0.0.1:{taken_port}: the address is in use" in one_line(err)


def test_a_second_sender_process_that_cannot_bind(shard, taken_port, tmp_path) -> None:  # type: ignore[no-untyped-def]
    second = tmp_path / "y.tar"
    second.write_bytes(shard.read_bytes())
    code, err = sending(shard, f"zrpush://:{free_port()}", f"zrpush://:{taken_port}", extra=(second, "-p", 2))
    assert code == 1 and "sender 1: " in one_line(err) and "the address is in use" in err


def test_a_bind_to_an_address_of_another_host(shard) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, "zrpush://192.0.2.1:7999"), receiving("zpull://192.0.2.1:7999")):
        assert code == 1 and "cannot bind tcp://192.0.2.1:7999: not an address of this host" in one_line(err)


def test_a_bind_to_a_name_that_is_no_interface_here(shard) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, "zrpush://nosuch.invalid:7999"), receiving("zpull://nosuch.invalid:7999")):
        assert code == 1 and "no interface or address of this host by that name" in one_line(err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind ports below 1024")
def test_a_bind_that_is_not_permitted(shard) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, "zrpush://:1"), receiving("zpull://:1")):
        assert code == 1 and "permission denied" in one_line(err)


def test_a_malformed_host_to_connect_to(shard) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, "zpush://-bad_host!:7999"), receiving("zrpull://-bad_host!:7999")):
        assert code == 1 and "cannot connect to tcp://-bad_host!:7999: not a valid host name" in one_line(err)


def test_ipc_paths(shard, tmp_path) -> None:  # type: ignore[no-untyped-def]
    long = f"/tmp/{'a' * 120}"
    for code, err in (sending(shard, f"zrpush+ipc://{long}"), receiving(f"zpull+ipc://{long}"),
                      sending(shard, f"zpush+ipc://{long}"), receiving(f"ipc://{long}")):
        assert code == 2 and "the ipc path is 125 bytes, over the 107" in one_line(err)
    missing = tmp_path / "no" / "such" / "feed"
    for code, err in (sending(shard, f"zrpush+ipc://{missing}"), receiving(f"zpull+ipc://{missing}"),
                      sending(shard, f"zpub+ipc://{missing}")):
        assert code == 1 and f"no such directory: {missing.parent}" in one_line(err)


def test_options_zmq_would_refuse_are_usage_errors(shard) -> None:  # type: ignore[no-untyped-def]
    for extra, said in ((("--hwm", 2**31 - 1), "bad high-water mark 2147483647"),
                        (("--heartbeat", "1e300"), "bad heartbeat interval 1e+300 s; must be at most 214748 s"),
                        (("--heartbeat", "1e6"), "bad heartbeat interval"),
                        (("--send-timeout", "1e300"), "bad send timeout")):
        for url in (f"zpush://127.0.0.1:{free_port()}", f"zpub://:{free_port()}"):
            code, err = sending(shard, url, extra=extra)
            assert code == 2 and said in one_line(err)
    code, err = run("tarrecv", f"zpull://:{free_port()}", "--hwm", 2**31)
    assert code == 2 and "--hwm" in err and "Traceback" not in err
    code, err = run("tarrecv", f"zpull://:{free_port()}", "--max-message-size", 2**63)
    assert code == 2 and "--max-message-size" in err and "Traceback" not in err


def test_a_lone_surrogate_in_an_endpoint_host(shard) -> None:  # type: ignore[no-untyped-def]
    for code, err in (sending(shard, "zpush://\udc80x:7999"), receiving("zpull://\udc80x:7999")):
        assert code == 2 and "lone surrogate" in one_line(err)


REFUSED = """
import sys, zmq
from tarproc.errors import TransportError
from tarproc.transport import Receiver, Sender
option = getattr(zmq, sys.argv[1])
real = zmq.Socket.set
def refuse(self, opt, value):
    if opt == option:
        raise zmq.ZMQError(zmq.EINVAL)
    return real(self, opt, value)
zmq.Socket.setsockopt = zmq.Socket.set = refuse  # options set by name (socket.curve_server = ...) too
feed, port = sys.argv[3], sys.argv[4]
def with_keys():
    from tarproc.transport.curve import generate_keys
    generate_keys(feed + "-keys")
    return Sender(f"zpush://127.0.0.1:{port}", curve=feed + "-keys")
make = {"push": lambda: Sender(f"zpush://127.0.0.1:{port}"), "pub": lambda: Sender(f"zrpub+ipc://{feed}"),
        "curve": with_keys,
        "pull": lambda: Receiver([f"zpull+ipc://{feed}-a", f"zpull+ipc://{feed}-b"]),
        "sub": lambda: Receiver(f"zsub://127.0.0.1:{port}")}
try:
    make[sys.argv[2]]()
except TransportError as e:
    print(e)
    sys.exit(3)
"""


@pytest.mark.parametrize(("option", "side"), [("SNDHWM", "push"), ("HEARTBEAT_TIMEOUT", "push"), ("SNDHWM", "pub"),
                                              ("IMMEDIATE", "pub"), ("RCVHWM", "pull"), ("MAXMSGSIZE", "pull"),
                                              ("SUBSCRIBE", "sub"), ("CURVE_SERVER", "curve")])
def test_an_option_zmq_refuses_is_an_error_and_no_hang(option, side, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Any option the socket refuses (here made to) ends the process at once with a TransportError."""
    try:
        done = subprocess.run([sys.executable, "-c", REFUSED, option, side, tmp_path / "feed", str(free_port())],
                              capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{side} hung after {option} was refused")
    assert done.returncode == 3, done.stderr.decode()
    said = done.stdout.decode()
    assert ((f"cannot set {option} to" in said and "Invalid argument" in said) if side != "curve"
            else "cannot set up CURVE encryption (curve_server)" in said), said
