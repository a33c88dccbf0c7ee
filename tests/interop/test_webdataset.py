"""webdataset 1.0.2 reads what tarcat/tarsplit write, and tarproc reads what webdataset writes."""

from __future__ import annotations

import warnings

import pytest

webdataset = pytest.importorskip("webdataset")

pytestmark = pytest.mark.filterwarnings("ignore")


def test_webdataset_version():
    from importlib.metadata import version

    assert version("webdataset") == "1.0.2"


def test_webdataset_reads_tarcat_output(ix, shards, tmp_path):
    out = tmp_path / "all.tar"
    r = ix.run(ix.tarcat, ["-o", out, str(shards.dir / "shard-{0..2}.tar")])
    assert r.exit_code == 0, r.stderr
    ours = ix.samples(out)
    assert ours == shards.expected
    assert ix.wds_samples(str(out)) == ours


def test_webdataset_reads_tarcat_output_with_renamed_fields(ix, shards, tmp_path):
    out = tmp_path / "sel.tar"
    r = ix.run(ix.tarcat, ["-f", "image:png,jpg cls", "--rekey", "sample%06d", "--shuffle", "4", "--seed", "3",
                           "-o", out, *shards.paths])
    assert r.exit_code == 0, r.stderr
    ours = ix.samples(out)
    assert len(ours) == 12 and all(set(f) == {"image", "cls"} for _, f in ours)
    assert ix.wds_samples(str(out)) == ours


def test_webdataset_reads_tarsplit_shards(ix, shards, tmp_path):
    out = tmp_path / "split"
    out.mkdir()
    r = ix.run(ix.tarsplit, ["-n", "5", "-o", out / "train-%06d.tar", *shards.paths])
    assert r.exit_code == 0, r.stderr
    url = str(out / "train-{000000..000002}.tar")
    ours = ix.samples(url)
    assert ours == shards.expected
    assert ix.wds_samples(url) == ours


def test_webdataset_reads_compressed_tarsplit_shards(ix, shards, tmp_path):
    r = ix.run(ix.tarsplit, ["-n", "7", "-o", tmp_path / "s-%d.tar.gz", *shards.paths])
    assert r.exit_code == 0, r.stderr
    url = str(tmp_path / "s-{0..1}.tar.gz")
    assert ix.wds_samples(url) == ix.samples(url) == shards.expected


def test_webdataset_agrees_on_tricky_names(ix, tmp_path):
    samples = [
        {"__key__": "dir.v2/img", "seg.png": b"seg", "jpg": b"jpg"},
        {"__key__": "a/b/c/" + "x" * 150, "txt": b"long"},  # GNU long-name record
        {"__key__": "データ/画像", "json": b"{}"},
        {"__key__": "with space", "txt": b"s"},
    ]
    src = ix.write_tar(tmp_path / "src.tar", samples)
    out = tmp_path / "out.tar"
    assert ix.run(ix.tarcat, ["-o", out, src]).exit_code == 0
    expected = [(s["__key__"], {k: v for k, v in s.items() if k != "__key__"}) for s in samples]
    assert ix.samples(out) == expected
    assert ix.wds_samples(str(out)) == expected


def _wds_write(path, samples):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with webdataset.TarWriter(str(path)) as w:
            for s in samples:
                w.write(s)


def test_tarproc_reads_webdataset_tarwriter(ix, tmp_path):
    samples = [
        {"__key__": f"part/{i:05d}", "jpg": bytes([i]) * (100 + i * 37), "cls": str(i).encode(), "json": b'{"a": 1}'}
        for i in range(20)
    ]
    path = tmp_path / "wds.tar"
    _wds_write(path, samples)
    expected = [(s["__key__"], {k: v for k, v in s.items() if k != "__key__"}) for s in samples]
    assert ix.samples(path) == expected
    assert ix.wds_samples(str(path)) == expected
    # and through the command, byte-for-byte into our canonical form
    r = ix.run(ix.tarcat, [path])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == ix.tar_bytes(samples)


def test_tarproc_reads_webdataset_shardwriter(ix, tmp_path):
    samples = [{"__key__": f"{i:06d}", "txt": f"sample {i}".encode(), "cls": b"1"} for i in range(25)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with webdataset.ShardWriter(str(tmp_path / "wds-%03d.tar"), maxcount=10, verbose=0) as w:
            for s in samples:
                w.write(s)
    url = str(tmp_path / "wds-{000..002}.tar")
    expected = [(s["__key__"], {k: v for k, v in s.items() if k != "__key__"}) for s in samples]
    assert ix.samples(url) == expected
    r = ix.run(ix.tarsplit, ["-n", "25", "-o", tmp_path / "ours", url])
    assert r.exit_code == 0, r.stderr
    assert ix.wds_samples(str(tmp_path / "ours-000000.tar")) == expected
