"""The tar package's public surface: ``ReadPolicy``, the scanning seam ``MemberScan``, the old
read keywords (deprecated, still working), the process-group helper, and the rule that no module
of tarproc imports another's private names."""

from __future__ import annotations

import ast
import dataclasses
import io
import signal
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import live_group_members, settled, wait_for

import tarproc
from tarproc.errors import LinkError, OptionError
from tarproc.index import build_index
from tarproc.procgroup import signal_group, start_group, stop_group
from tarproc.samples import read_samples
from tarproc.sources import open_source
from tarproc.tar import MemberScan, ReadPolicy, ReadStats, TarWriter, Unread, iter_members

# -- ReadPolicy -----------------------------------------------------------------------------------


def test_read_policy_defaults_and_exports() -> None:
    policy = ReadPolicy()
    assert (policy.dup, policy.max_member_size, policy.links, policy.ignore_zeros, policy.on_error) == (
        "error", 2 << 30, "follow", False, "fail")
    assert tarproc.ReadPolicy is ReadPolicy
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.dup = "skip"  # type: ignore[misc]
    assert ReadPolicy(dup="warn") == ReadPolicy(dup="warn") and hash(ReadPolicy()) == hash(ReadPolicy())


@pytest.mark.parametrize(("kw", "message"), [
    ({"dup": "maybe"}, "bad duplicate policy 'maybe'; use one of error, warn, skip"),
    ({"links": "hard"}, "bad links policy 'hard'; use one of follow, skip, strict"),
    ({"on_error": "skip"}, "bad error policy 'skip'; use one of fail, skip-shard"),
    ({"max_member_size": -1}, "bad max_member_size -1; must be a number of bytes >= 0"),
    ({"max_member_size": 1.5}, "bad max_member_size 1.5; must be a number of bytes >= 0"),
    ({"max_member_size": True}, "bad max_member_size True; must be a number of bytes >= 0"),
    ({"ignore_zeros": "yes"}, "bad ignore_zeros 'yes'; must be True or False"),
])
def test_read_policy_refuses_bad_values_in_one_line(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as e:
        ReadPolicy(**kw)
    assert str(e.value) == message


def test_read_policy_applies_to_the_readers(tmp_path: Path) -> None:
    raw = _tar([("a.txt", b"x" * 100), ("b.txt", b"y")])
    with pytest.raises(tarproc.TarFormatError, match="member size 100 exceeds the limit of 50 bytes"):
        list(iter_members(io.BytesIO(raw), "m.tar", policy=ReadPolicy(max_member_size=50)))
    path = tmp_path / "d.tar"
    path.write_bytes(_tar([("k.txt", b"1"), ("k.txt", b"2")]))  # a field twice in one sample
    with pytest.raises(tarproc.DuplicateError):
        list(read_samples(str(path)))
    stats = ReadStats()
    got = list(read_samples(str(path), policy=ReadPolicy(dup="skip"), stats=stats))
    assert [s["txt"] for s in got] == [b"1"] and stats.duplicates == 1
    said: list[str] = []
    got = list(read_samples([str(tmp_path / "missing.tar"), str(path)], warn=said.append,
                            policy=ReadPolicy(dup="skip", on_error="skip-shard")))
    assert [s["txt"] for s in got] == [b"1"] and "missing.tar" in said[0]


def test_old_keywords_still_work_and_are_deprecated(tmp_path: Path) -> None:
    raw = _tar([("a.txt", b"x" * 100)])
    with pytest.warns(DeprecationWarning, match=r"iter_members\(max_member_size=\.\.\.\) is deprecated") as caught:
        members = iter_members(io.BytesIO(raw), "m.tar", max_member_size=50)
    assert caught[0].filename == __file__  # points at the caller
    with pytest.raises(tarproc.TarFormatError, match="exceeds the limit of 50 bytes"):
        list(members)
    path = tmp_path / "d.tar"
    path.write_bytes(_tar([("k.txt", b"1"), ("k.txt", b"2")]))  # a field twice in one sample
    with pytest.warns(DeprecationWarning, match=r"read_samples\(dup=, on_error=\.\.\.\)"):
        assert len(list(read_samples(str(path), dup="skip", on_error="fail"))) == 1
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match="bad duplicate policy 'nope'"):
        list(read_samples(str(path), dup="nope"))
    with pytest.warns(DeprecationWarning, match="build_index"):
        assert len(build_index(str(path), dup="skip")) == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'dup'"):
        iter_members(io.BytesIO(raw), dup="skip")  # never a keyword of iter_members
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new way warns nothing
        assert len(list(iter_members(io.BytesIO(raw), policy=ReadPolicy(max_member_size=100)))) == 1


# -- MemberScan: the scanning seam ----------------------------------------------------------------


def test_member_scan_gives_what_iter_members_gives_but_sizes(reader: str) -> None:
    members = [("a/1.txt", b"x" * 10), ("a/1.cls", b""), ("b" * 150 + ".bin", b"y" * 70_000)]
    raw = _tar(members)
    scan = MemberScan(io.BytesIO(raw), "m.tar")
    scanned = [(name, len(data), offset) for name, data, offset in scan]
    assert scanned == [(name, len(data), offset) for name, data, offset in iter_members(io.BytesIO(raw), "m.tar")]
    assert [name for name, _, _ in scanned] == [name for name, _ in members] and scan.not_in_place == set()
    for name, size, offset in scanned:  # the data lies right after the member's own header
        assert raw[offset + 512 : offset + 512 + size] == dict(members)[name]


def test_member_scan_says_which_data_is_not_in_place(kit: Any, reader: str) -> None:
    raw = kit.archive(kit.member("t.txt", b"abc"), kit.header("l.txt", typeflag=b"1", linkname=b"t.txt"))
    scan = MemberScan(io.BytesIO(raw), "m.tar")
    assert [(name, bytes(data), offset) for name, data, offset in scan] == [("t.txt", b"abc", 0), ("l.txt", b"abc", 1024)]
    assert scan.not_in_place == {1024}  # the link: its target's bytes
    skipped = MemberScan(io.BytesIO(raw), "m.tar", policy=ReadPolicy(links="skip"))
    assert [name for name, _, _ in skipped] == ["t.txt"] and skipped.not_in_place == set()
    with pytest.raises(LinkError):
        list(MemberScan(io.BytesIO(kit.archive(kit.header("l", typeflag=b"1", linkname=b"gone"))), "m.tar"))


def test_member_scan_skips_the_data_of_a_local_file(tmp_path: Path, reader: str) -> None:
    big = 5 << 20
    path = tmp_path / "big.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for i in range(4):
            w.add(f"s{i}.bin", bytes(big))
    counted = _Counting(open_source(str(path)))
    with counted.source:
        scanned = [(name, type(data), len(data), offset) for name, data, offset in MemberScan(counted, str(path))]
    assert [(kind, size) for _, kind, size, _ in scanned] == [(Unread, big)] * 4
    assert counted.bytes < big  # the headers were read, the 20 MiB of data skipped
    with open(path, "rb") as f:  # a stream that can't skip: the same members, every byte read
        read = [(name, len(data), offset) for name, data, offset in MemberScan(f, str(path))]
    assert read == [(name, size, offset) for name, _, size, offset in scanned]


def test_member_scan_fails_as_the_reader_does(reader: str) -> None:
    raw = _tar([("a.txt", b"x" * 600)])[:1000]
    with pytest.raises(tarproc.TarFormatError) as scanned:
        list(MemberScan(io.BytesIO(raw), "m.tar"))
    with pytest.raises(tarproc.TarFormatError) as read:
        list(iter_members(io.BytesIO(raw), "m.tar"))
    assert str(scanned.value) == str(read.value)


# -- one place for process groups --------------------------------------------------------------------


def test_process_group_helper_stops_what_a_shell_started() -> None:
    proc = start_group("sleep 300 & sleep 300; wait", shell=True, stdout=subprocess.DEVNULL)
    wait_for(lambda: len(live_group_members(proc.pid)) == 3, what="the shell and its two sleeps")
    stop_group(proc)
    assert proc.returncode == -signal.SIGTERM
    assert settled(lambda: live_group_members(proc.pid)) == []
    done = start_group(["true"])
    done.wait()
    assert signal_group(done.pid) is False  # gone: no error


# -- no private names across modules ----------------------------------------------------------------


def test_no_module_imports_another_modules_private_names() -> None:
    root = Path(tarproc.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not (node.module or "").lstrip(".").startswith(("_speedups", "_jpeg")):
                found += [f"{path.relative_to(root)}:{node.lineno}: {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__") and a.name not in ("_jpeg", "_speedups")]
    assert found == []


def test_tar_package_exports_only_public_names() -> None:
    import tarproc.tar as tar

    assert all(not name.startswith("_") for name in tar.__all__)
    assert {"ReadPolicy", "MemberScan", "iter_members", "TarWriter"} <= set(tar.__all__)
    public = {name for name in vars(tar) if not name.startswith("_")}
    modules = {"headers", "links", "policy", "ranges", "reader", "sparse", "stats", "writer", "annotations"}
    assert public - modules == set(tar.__all__)


# -- helpers ------------------------------------------------------------------------------------------


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for name, data in members:
            w.add(name, data)
    return buf.getvalue()


class _Counting:
    """A Source, counting the bytes read from it (skipped bytes are not read)."""

    def __init__(self, source: Any) -> None:
        self.source, self.bytes = source, 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.source.read(n)
        self.bytes += len(data)
        return data

    def skipper(self) -> Any:
        return self.source.skipper()

    def file_origin(self) -> Any:
        return self.source.file_origin()
