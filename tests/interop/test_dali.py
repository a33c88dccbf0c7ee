"""DALI's own WebDataset reader (fn.readers.webdataset, CPU only) with indexes tarindex writes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("nvidia.dali", reason="DALI is a test dependency (pip install -e '.[dev]')")

from tarproc.cli.tarindex import main as tarindex  # noqa: E402


def dali_read(shard: Path, index: Path, exts: list[str], missing: str = "error") -> list[list[bytes]]:
    """Every sample DALI reads, in order, as one bytes value per ext (CPU: device_id=None)."""
    import numpy as np
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe() -> Any:
        out = fn.readers.webdataset(
            paths=[str(shard)], index_paths=[str(index)], ext=exts, missing_component_behavior=missing, name="r"
        )
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)

    p = pipe()
    p.build()
    samples = []
    for _ in range(p.epoch_size("r")):
        outputs = p.run()
        samples.append([np.array(o.at(0)).tobytes() for o in outputs])
    return samples


def index_for_dali(ix: Any, shard: Path) -> Path:
    index = shard.with_suffix(".dali.idx")
    result = ix.run(tarindex, ["--format", "dali", "-o", index, shard])
    assert result.exit_code == 0, result.stderr
    return index


def expected(ix: Any, shard: Path, exts: list[str]) -> list[list[bytes]]:
    return [[fields.get(e, b"") for e in exts] for _, fields in ix.samples(shard)]


def test_dali_reads_our_shard_with_our_index(ix, tmp_path):
    """Short names, ustar prefix names and GNU long names (> 100 bytes), fields of all sizes."""
    samples = []
    for i in range(12):
        key = f"train/{i:05d}"
        if i % 4 == 1:
            key = "long/" + "n" * (110 + i) + f"/{i:05d}"  # a GNU long-name record
        elif i % 4 == 2:
            key = "p" * 95 + f"/{i:05d}"  # ustar prefix + name
        samples.append({"__key__": key, "jpg": bytes([i % 256]) * (1 + 997 * i), "cls": str(i), "json": {"i": i}})
    shard = ix.write_tar(tmp_path / "train.tar", samples)
    exts = ["jpg", "cls", "json"]
    got = dali_read(shard, index_for_dali(ix, shard), exts)
    assert len(got) == 12
    assert got == expected(ix, shard, exts)


def test_dali_reads_pax_headers(ix, tmp_path):
    """Members named through pax extended headers (non-ASCII and long names) written by tarfile."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(5):
            stem = f"ü{i}/" + "é" * (30 * i) + f"s{i}"
            for ext, data in (("cls", str(i).encode()), ("txt", f"text {i}".encode() * (i + 1))):
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    shard = tmp_path / "pax.tar"
    shard.write_bytes(buf.getvalue())
    exts = ["cls", "txt"]
    got = dali_read(shard, index_for_dali(ix, shard), exts)
    assert len(got) == 5
    assert got == expected(ix, shard, exts)


def test_dali_missing_components(ix, tmp_path):
    samples = [{"__key__": f"k{i}", "cls": str(i), **({"jpg": b"j" * (i + 1)} if i % 2 else {})} for i in range(6)]
    shard = ix.write_tar(tmp_path / "gaps.tar", samples)
    index = index_for_dali(ix, shard)
    exts = ["jpg", "cls"]
    assert dali_read(shard, index, exts, missing="empty") == expected(ix, shard, exts)
    assert dali_read(shard, index, exts, missing="skip") == [s for s in expected(ix, shard, exts) if s[0]]
