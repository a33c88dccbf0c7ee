"""The library's warnings arrive through ``warnings`` as their category (``tarproc.errors``); a
``warn=`` callback, where a caller gives one, takes them instead; a command prints each as one
``PROG: warning: MESSAGE`` line, from a worker process too."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import pytest
from faultserver import FaultServer
from tarhelpers import wait_for, write_tar

from tarproc import ReadPolicy, read_samples
from tarproc.errors import CacheWarning, DataWarning, NetworkWarning, TarprocWarning
from tarproc.index import IndexedShard, build_index
from tarproc.process import shell_samples
from tarproc.sources import Network
from tarproc.sources.cache import ShardCache
from tarproc.sources.remote import Identity

REPO = Path(__file__).resolve().parents[2]


def dup_shard(path: Path, tag: str = "") -> Path:
    """A shard whose sample 'a' (+ ``tag``) has its field 'cls' twice, then a sample 'b' (+ ``tag``)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in ((f"a{tag}.txt", b"x"), (f"a{tag}.cls", b"1"), (f"a{tag}.cls", b"2"), (f"b{tag}.txt", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def caught(category: type[Warning], run) -> list[str]:  # type: ignore[no-untyped-def]
    """The messages of ``category`` that ``run()`` gives, each shown (as the commands show them)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        run()
    assert all(issubclass(w.category, TarprocWarning) for w in got), [str(w.message) for w in got]
    return [str(w.message) for w in got if issubclass(w.category, category)]


def test_a_duplicate_with_dup_warn_is_a_data_warning_or_goes_to_the_callback(tmp_path: Path) -> None:
    shard = str(dup_shard(tmp_path / "dup.tar"))
    said = caught(DataWarning, lambda: list(read_samples(shard, policy=ReadPolicy(dup="warn"))))
    assert len(said) == 1 and "duplicate field 'cls' in sample 'a'" in said[0]
    mine: list[str] = []
    assert caught(TarprocWarning, lambda: list(read_samples(shard, policy=ReadPolicy(dup="warn"), warn=mine.append))) == []
    assert mine == said


def test_a_skipped_shard_and_a_stale_index_are_data_warnings(tmp_path: Path) -> None:
    good = write_tar(tmp_path / "good.tar", [{"__key__": "k", "txt": b"x"}])
    said = caught(DataWarning, lambda: list(read_samples([str(tmp_path / "missing.tar"), str(good)],
                                                         policy=ReadPolicy(on_error="skip-shard"))))
    assert len(said) == 1 and said[0].endswith("skipping the rest of this shard")
    (tmp_path / "good.tar.idx").write_bytes(build_index(str(good)).jsonl_bytes())
    write_tar(good, [{"__key__": "k", "txt": b"x" * 20000}])  # the shard changed: its index is stale
    said = caught(DataWarning, lambda: IndexedShard(str(good), stale="rebuild").close())
    assert len(said) == 1 and "stale index" in said[0]


def test_a_symbolic_link_left_out_is_a_data_warning(tmp_path: Path) -> None:
    path = tmp_path / "links.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        info = tarfile.TarInfo("a.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo("a.cls")
        link.type, link.linkname = tarfile.SYMTYPE, "nowhere.cls"
        t.addfile(link)
    said = caught(DataWarning, lambda: list(read_samples(str(path))))
    assert len(said) == 1 and "symbolic link 'a.cls'" in said[0] and "left out" in said[0]


def test_a_command_s_problem_kept_or_skipped_is_a_data_warning(tmp_path: Path) -> None:
    samples = [{"__key__": "k1", "txt": b"x", "__url__": "s.tar"}]
    said = caught(DataWarning, lambda: list(shell_samples(samples, "exit 3", on_error="skip", tmpdir=str(tmp_path))))
    assert len(said) == 1 and "sample 'k1'" in said[0] and said[0].endswith("skipping it")


def test_a_retried_remote_read_is_a_network_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    shard = write_tar(tmp_path / "s.tar", [{"__key__": f"k{i:03d}", "bin": os.urandom(4000)} for i in range(20)])
    with FaultServer(tmp_path) as server:
        server.cut("/s.tar", after=shard.stat().st_size // 2)
        network = Network(retries=2, backoff=0, prefetch=0)
        keys: list[str] = []
        said = caught(NetworkWarning, lambda: keys.extend(s["__key__"] for s in
                                                          read_samples(f"{server.url}/s.tar", network=network)))
    assert len(keys) == 20
    assert len(said) == 1 and "retry 1 of 2" in said[0]


def test_a_cache_that_cannot_be_written_is_a_cache_warning(tmp_path: Path) -> None:
    import fsspec

    with fsspec.open("memory://h/warnings-a", "wb") as f:
        f.write(b"x")
    (tmp_path / "file").write_bytes(b"")  # the cache's directory would be under a file
    cache = ShardCache(str(tmp_path / "file"))
    said = caught(CacheWarning, lambda: cache.ensure("memory://h/warnings-a", Identity(1, '"e"'), Network()))
    assert len(said) == 1 and "reading without the cache" in said[0]


WORKER = """
    from tarproc.errors import DataWarning, warn

    def fn(sample):
        warn(f"from a worker: {sample['__key__']}", DataWarning)
        return sample
"""

FORCE_SPAWN = """
    import multiprocessing, sys

    multiprocessing.get_all_start_methods = lambda: ["spawn"]  # as where fork isn't there
    from tarproc.cli.tarproc import main

    if __name__ == "__main__":
        main(sys.argv[1:], prog_name="tarproc")
"""


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_warning_in_a_worker_process_is_one_line_of_the_command(tmp_path: Path, start: str) -> None:
    shard = write_tar(tmp_path / "s.tar", [{"__key__": f"k{i}", "txt": b"x"} for i in range(3)])
    (tmp_path / "wfuncs.py").write_text(textwrap.dedent(WORKER))
    (tmp_path / "spawned.py").write_text(textwrap.dedent(FORCE_SPAWN))
    head = [sys.executable, "-m", "tarproc.cli.tarproc"] if start == "fork" else [sys.executable, "spawned.py"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run([*head, "-p", "2", "--map", "wfuncs:fn", str(shard), "-o", os.devnull, "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stderr.splitlines()) == [f"tarproc: warning: from a worker: k{i}" for i in range(3)]


@pytest.mark.skipif(sys.platform != "linux", reason="uses ipc sockets")
def test_a_warning_in_a_tarserve_sender_process_is_one_line(tmp_path: Path) -> None:
    for n in range(2):  # keys of their own: the receiver refuses a key twice in a row, as the two shards' may arrive
        dup_shard(tmp_path / f"in-{n}.tar", str(n))
    feed = f"ipc://{tmp_path}/feed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=tmp_path, env=env, text=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    receiver = start("tarproc.cli.tarrecv", f"zpull+{feed}", "-o", "out.tar", "-q")
    wait_for(lambda: (tmp_path / "feed").exists(), what="the receiver binding its socket")
    sender = start("tarproc.cli.tarserve", "--raw", "--dup", "warn", "-p", "2", "in-0.tar", "in-1.tar",
                   "--to", f"zpush+{feed}", "-b", "1", "-q")
    _, err = sender.communicate(timeout=120)
    assert sender.returncode == 0, err
    assert receiver.communicate(timeout=120) and receiver.returncode == 0
    assert sorted(err.splitlines()) == [
        f"tarserve: warning: in-{n}.tar: duplicate field 'cls' in sample 'a{n}' (members at bytes 1024 and 2048); "
        "keeping the first" for n in range(2)
    ]
