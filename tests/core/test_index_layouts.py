"""Indexes of shards whose members aren't all stored in place: links, sparse files, and
concatenated archives (read on past end-of-archive blocks). Random access reads a member's bytes
right after its header, so a member stored otherwise is a named error when the index is built,
``links="skip"`` leaves links out, and ``ignore_zeros`` indexes past the blocks between archives.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import tarfile_shard, write_sparse_file

from tarproc import TarWriter, read_samples
from tarproc.errors import LinkError
from tarproc.index import IndexedShard, build_index, parse_index


def as_dicts(samples: Any) -> list[tuple[str, dict[str, bytes]]]:
    return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in samples]


def linked_shard(path: Path, members: list[tuple[str, bytes | str]]) -> Path:
    """A GNU tar whose members are (name, bytes) or (name, "->target") for a hard link."""
    return tarfile_shard(path, members, link=tarfile.LNKTYPE)


def test_hard_link_is_refused_or_left_out(tmp_path, reader):
    """A followed link reads as its target's bytes, which don't lie after the link's header: the
    index used to record them there, and tarindex wrote an index that its own loader refused."""
    path = linked_shard(tmp_path / "l.tar", [("a.jpg", b"A" * 10000), ("a.cls", b"1"), ("b.jpg", "->a.jpg"),
                                             ("b.cls", b"2"), ("c.cls", b"3")])
    link_header = 11776  # a.jpg: 512 + 10240, a.cls: 512 + 512
    with pytest.raises(LinkError) as e:
        build_index(str(path))
    assert str(e.value) == (
        f"{path}: member 'b.jpg' is a link or a sparse file, not bytes stored in place, which random access "
        f"needs; index a copy that stores them (tarcat {path} -o {tmp_path / 'l-plain.tar'}), or leave links out "
        f"(tarindex --links skip) at byte {link_header} (member 'b.jpg')"
    )
    with pytest.raises(LinkError, match="'b.jpg' is a link"):
        IndexedShard(path)  # no index file: the scan in memory says the same

    # links="skip": the index leaves the link out, and reading across its header is fine
    index = build_index(str(path), links="skip")
    assert parse_index(index.jsonl_text()).entries == index.entries
    with IndexedShard(path, index=index) as ds:
        assert as_dicts(ds) == as_dicts(read_samples(str(path), links="skip"))
        assert ds["b"] == {"__key__": "b", "__url__": str(path), "cls": b"2"}

    # the copy the message suggests (tarcat stores the link's bytes) indexes and serves it all
    copy = tmp_path / "l-plain.tar"
    with open(copy, "wb") as f, TarWriter(f) as w:
        for sample in read_samples(str(path)):
            w.write_sample(sample)
    with IndexedShard(copy) as ds:
        assert as_dicts(ds) == as_dicts(read_samples(str(path)))
        assert ds["b"]["jpg"] == b"A" * 10000


def test_link_last_in_the_shard(tmp_path, reader):
    """A link at the very end, or to an empty member, fits the layout of a member: the reader
    says which members are not stored in place, so the build refuses them all the same."""
    for members in ([("a.txt", b"x" * 100), ("b.txt", "->a.txt")], [("a.txt", b""), ("b.txt", "->a.txt")]):
        path = linked_shard(tmp_path / "e.tar", members)
        with pytest.raises(LinkError, match=r"member 'b\.txt' is a link or a sparse file, .* \(tarcat "):
            build_index(str(path))


def test_sparse_member_is_refused(tmp_path, kit, reader):
    src = tmp_path / "src"
    src.mkdir()
    write_sparse_file(src / "s.bin", regions=3)
    (src / "z.txt").write_bytes(b"after the sparse file")
    path = tmp_path / "sparse.tar"
    kit.gnu_tar("-cf", str(path), "--format=gnu", "--sparse", "-C", str(src), "s.bin", "z.txt")
    if path.read_bytes()[156:157] != b"S":
        pytest.skip("this file system does not keep holes: GNU tar stored the file as a plain one")
    assert as_dicts(read_samples(str(path)))[0] == ("s", {"bin": (src / "s.bin").read_bytes()})
    with pytest.raises(LinkError, match=r"member 's\.bin' is a link or a sparse file"):
        build_index(str(path))


def test_concatenated_archives_with_ignore_zeros(tmp_path, reader):
    """``ignore_zeros`` reads on past end-of-archive blocks: the first sample after them begins
    with those zero blocks, which the reads must read past too."""
    parts = []
    for part in range(2):
        buf = io.BytesIO()
        with TarWriter(buf) as w:
            for i in range(3):
                w.write_sample({"__key__": f"p{part}/{i}", "txt": f"part {part} sample {i}" * 40, "cls": i})
        parts.append(buf.getvalue())
    path = tmp_path / "cat.tar"
    path.write_bytes(b"".join(parts))
    index = build_index(str(path), ignore_zeros=True)
    assert len(index) == 6 and index.entries[3].offset < len(parts[0]) < index.entries[3].fields["cls"][0]
    expected = as_dicts(read_samples(str(path), ignore_zeros=True))
    idx = tmp_path / "cat.tar.idx"
    idx.write_text(index.jsonl_text())
    with IndexedShard(path) as ds:
        assert as_dicts(ds) == expected
        assert ds.get("p1/0", fields=["cls"])["cls"] == b"0"
