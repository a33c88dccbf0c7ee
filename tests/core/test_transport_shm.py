"""Batches in shared memory between a sender and a receiver on one host (transport/shm.py)."""

from __future__ import annotations

import gc
import hashlib
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tarhelpers import free_port

from tarproc.errors import WireError
from tarproc.transport import Receiver, decode, encode_batch
from tarproc.transport.shm import HEADER, SharedBlock, SharedRing, available, open_shared

pytestmark = pytest.mark.skipif(not available(), reason="needs Linux memory files and /proc")
IDS = {"sender": "h:1:0", "group": "g", "rank": 0, "senders": 1}


def test_a_block_is_mapped_by_its_receiver_and_given_back_when_let_go() -> None:
    ring = SharedRing(size=2)
    block = ring.take((4, 3), "float32")
    block.array[:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    block.lend()
    view = open_shared(block.descriptor(), block.nbytes, os.getpid())
    array = np.frombuffer(view, np.float32).reshape(4, 3)
    assert array.tolist() == block.array.tolist()
    assert not block.free()  # lent: the sender must not write into it
    assert ring.take((4, 3), "float32") is not block  # a fresh one meanwhile
    row = array[1]  # a view keeps it lent too
    del array, view
    gc.collect()
    assert not block.free()
    del row
    gc.collect()
    assert not block.free()  # the receiver let go; the sender holds it until it is acknowledged
    block.held = False  # (what an acknowledgement does)
    assert block.free()
    assert ring.take((4, 3), "float32") is block  # written into again only now
    ring.close()


def test_open_shared_takes_only_a_lent_tarproc_block_of_that_process(tmp_path) -> None:  # type: ignore[no-untyped-def]
    block = SharedBlock((2, 2), "uint8")
    block.lend()
    good = block.descriptor()
    with pytest.raises(WireError, match="its lease is not this batch's"):
        open_shared({**good, "lease": good["lease"] ^ 2}, block.nbytes, os.getpid())
    with pytest.raises(WireError, match="the header says"):
        open_shared(good, block.nbytes + 10 * HEADER, os.getpid())
    with pytest.raises(WireError, match="process is not known"):
        open_shared(good, block.nbytes, None)
    with pytest.raises(WireError, match="bad shared-memory descriptor"):
        open_shared({"fd": "3", "lease": 1}, 4, os.getpid())
    other = open(tmp_path / "f", "wb+")  # noqa: SIM115 - an fd of this process that is no batch
    other.write(bytes(HEADER + 8))
    other.flush()
    with pytest.raises(WireError, match="not a tarproc batch"):
        open_shared({"fd": other.fileno(), "lease": 1}, 4, os.getpid())
    other.close()
    with pytest.raises(WireError, match="No such file"):
        open_shared({"fd": 10**6, "lease": 1}, 4, os.getpid())
    block.release()


def test_a_batch_in_shared_memory_is_refused_where_none_is_taken() -> None:
    block = SharedBlock((2, 3), "int32")
    block.lend()
    frames = encode_batch(["a", "b"], {"x": block.array}, shared={"x": block.descriptor()}, **IDS, epoch=0, seq=0)
    assert len(frames) == 1  # the tensor has no frame: it is in shared memory
    with pytest.raises(WireError, match="on a socket that takes none"):
        decode(frames)  # a TCP socket, say: its peer may be on another host
    with pytest.raises(WireError, match="process is not known"):
        decode(frames, shm=True)  # bytes: no socket credentials
    block.release()


def base_buffer(array: np.ndarray) -> object:
    """What an array's memory ultimately belongs to."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def received(tmp_path: Path, shard: Path, url: str, keep: bool) -> tuple[list[str], list[str], list[object]]:
    """Keys, image hashes (taken at arrival) and memory owners of a decoded stream; with ``keep``
    every batch is held to the end and hashed again then (a block written into again would show)."""
    receiver = Receiver(url.replace("zpush", "zpull"), timeout=60, wait=60)
    args = [shard, "--to", url, "--device", "cpu", "--size", 16, "--random-crop", "--flip", 0.5, "--mean", "imagenet",
            "--std", "imagenet", "--layout", "CHW", "-b", 4, "--seed", 5, "-q"]
    sender = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarserve", *map(str, args)], stderr=subprocess.PIPE)
    keys, hashes, owners, held = [], [], [], []
    for batch in receiver:
        keys += batch["__key__"]
        hashes.append(hashlib.sha1(batch["image"].tobytes()).hexdigest())
        owners.append(type(base_buffer(batch["image"])))
        if keep:
            held.append(batch["image"])
    assert sender.wait(timeout=60) == 0, sender.stderr.read().decode() if sender.stderr else ""
    if keep:
        assert [hashlib.sha1(a.tobytes()).hexdigest() for a in held] == hashes, "a held batch was written to"
    return keys, hashes, owners


@pytest.mark.parametrize("keep", [False, True])
def test_a_decoded_stream_over_ipc_goes_through_shared_memory_unchanged(tmp_path, keep) -> None:  # type: ignore[no-untyped-def]
    import io

    from PIL import Image
    from tarhelpers import write_tar

    def jpeg(i: int) -> bytes:
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(out, "JPEG")
        return out.getvalue()

    shard = write_tar(tmp_path / "x.tar", [{"__key__": f"k{i:03d}", "jpg": jpeg(i)} for i in range(60)])
    over_tcp = received(tmp_path, shard, f"zpush://127.0.0.1:{free_port()}", keep)
    over_ipc = received(tmp_path, shard, f"zpush+ipc://{tmp_path}/feed", keep)
    assert over_ipc[:2] == over_tcp[:2]  # the same batches, byte for byte
    assert set(over_ipc[2]) == {mmap.mmap} and mmap.mmap not in set(over_tcp[2])


def test_a_forked_child_letting_go_of_a_batch_does_not_give_its_block_back() -> None:
    # the child's copy of the mapping is the parent's memory: only the process that mapped the
    # batch may clear its lease (else the sender writes the next batch under the parent's arrays)
    block = SharedBlock((2, 2), "uint8")
    block.held = False
    block.lend()
    array = np.frombuffer(open_shared(block.descriptor(), block.nbytes, os.getpid()), np.uint8)
    pid = os.fork()
    if pid == 0:  # the child lets go of its copy, and ends
        code = 0
        try:
            del array
            gc.collect()
        except BaseException:  # noqa: BLE001 - report nothing, exit
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert not block.free()  # the parent still holds its arrays over the block
    del array
    gc.collect()
    assert block.free()


def test_open_shared_checks_the_file_it_opened_not_the_name_it_read_before(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a peer can swap its descriptor between the receiver's readlink and open: the file opened
    # is what must be a tarproc batch (a regular file would be mapped writable, and its bytes cleared)
    other = open(tmp_path / "f", "wb+")  # noqa: SIM115 - an fd of this process that is no batch
    other.write((5).to_bytes(8, "little") + bytes(2 * HEADER))
    other.flush()
    real = os.readlink
    peer_path = f"/proc/{os.getpid()}/fd/{other.fileno()}"
    monkeypatch.setattr(os, "readlink", lambda path: "/memfd:tarproc-batch (deleted)" if path == peer_path else real(path))
    with pytest.raises(WireError, match="not a tarproc batch"):
        open_shared({"fd": other.fileno(), "lease": 5}, 8, os.getpid())
    other.close()
    assert (tmp_path / "f").read_bytes()[:8] == (5).to_bytes(8, "little")



class FakeFrame:
    def __init__(self, address: object) -> None:
        self.address = address

    def get(self, name: str) -> object:
        assert name == "Peer-Address"
        return self.address


def test_a_sender_puts_batches_in_shared_memory_only_for_a_receiver_that_can_open_them(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a receiver of another user can't open /proc/PID/fd of the sender: every batch would be
    # rejected there and never acknowledged, the stream stuck; one of unknown credentials neither
    from tarproc.transport import wire

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert wire.may_map_from(FakeFrame("localhost:1000:1000:4242"))
    assert wire.may_map_from(FakeFrame("localhost:0:0:4242"))  # root opens anything
    assert not wire.may_map_from(FakeFrame("localhost:1001:1000:4242"))
    assert not wire.may_map_from(FakeFrame(""))  # libzmq knows no credentials
    assert not wire.may_map_from(FakeFrame("127.0.0.1:5555"))
    assert not wire.may_map_from(b"an ack as bytes")


def test_a_batch_that_cannot_be_mapped_is_a_wire_error() -> None:
    # (a peer's memory file sealed against writing, say): the receiver says so, it does not crash
    import fcntl

    fd = os.memfd_create("tarproc-batch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, (9).to_bytes(8, "little") + bytes(2 * HEADER))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK)
        with pytest.raises(WireError, match="cannot map it"):
            open_shared({"fd": fd, "lease": 9}, 8, os.getpid())
    finally:
        os.close(fd)


def test_only_a_file_that_cannot_shrink_is_mapped() -> None:
    # a peer that truncates its file under the receiver's mapping would kill it with SIGBUS
    import fcntl

    block = SharedBlock((2, 2), "uint8")
    assert fcntl.fcntl(block.fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    with pytest.raises(PermissionError):
        os.ftruncate(block.fd, 0)
    fd = os.memfd_create("tarproc-batch", os.MFD_CLOEXEC)
    try:
        os.write(fd, (9).to_bytes(8, "little") + bytes(2 * HEADER))
        with pytest.raises(WireError, match="may shrink"):
            open_shared({"fd": fd, "lease": 9}, 8, os.getpid())
    finally:
        os.close(fd)
    block.release()
