"""tarpcat / parallel_samples over a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tarproc.cli.tarpcat import main as tarpcat
from tarproc.errors import SourceError
from tarproc.pcat import parallel_samples
from tarproc.tar import ReadStats

SIZES = [5, 0, 9, 2, 7, 11, 1, 4, 6, 3, 8]


@pytest.fixture
def served(ix, http_server):
    """Shards under the server's root; returns (urls, expected samples by key)."""
    urls, expected = [], {}
    for s, n in enumerate(SIZES):
        batch = [ix.make_sample(f"h{s:02d}/{i:04d}", i, size=2000 + 100 * i) for i in range(n)]
        ix.write_tar(http_server.root / f"h-{s:02d}.tar", batch)
        urls.append(f"{http_server.url}/h-{s:02d}.tar")
        expected.update({x["__key__"]: {k: v for k, v in x.items() if k != "__key__"} for x in batch})
    return urls, expected


@pytest.mark.parametrize("readers", [1, 4, 20])
def test_every_sample_once_over_http(served, readers):
    urls, expected = served
    got = [(s["__key__"], s) for s in parallel_samples(urls, readers=readers, order="random", seed=2)]
    assert Counter(k for k, _ in got) == Counter(list(expected))
    for key, sample in got:
        assert {k: bytes(v) for k, v in sample.items() if not k.startswith("__")} == expected[key]
    # the server's connection threads and fsspec's event loop live on; our readers are all gone
    assert not [t for t in threading.enumerate() if t.name.startswith("tarproc-pcat")]


def test_cli_over_http_with_a_dropped_connection(ix, served, http_server):
    urls, expected = served
    ix.write_tar(http_server.root / "x.tar", [ix.make_sample(f"x/{i:04d}", i, size=5000) for i in range(20)])
    half = f"{http_server.url}/half/x.tar"  # announces the full length, sends half, hangs up
    result = ix.run(tarpcat, ["-p", "4", "--on-error", "skip-shard", "--stats", *urls[:3], half, *urls[3:]])
    assert result.exit_code == 0, result.stderr
    got = ix.samples_of_bytes(result.stdout_bytes, http_server.root.parent)
    keys = [k for k, _ in got]
    assert len(keys) == len(set(keys))
    assert {k: v for k, v in got if not k.startswith("x/")} == expected
    # samples of the cut shard that arrived before the failed read come through, in order (how many
    # arrive depends on how the client splits its reads)
    partial = [k for k in keys if k.startswith("x/")]
    assert len(partial) < 20 and partial == [f"x/{i:04d}" for i in range(len(partial))]
    assert f"warning: {half}:" in result.stderr and "(1 failed)" in result.stderr


def test_fail_names_the_url(served, http_server):
    urls, _ = served
    missing = f"{http_server.url}/nope.tar"
    stats = ReadStats()
    with pytest.raises(SourceError) as info:
        list(parallel_samples([*urls[:6], missing, *urls[6:]], readers=4, stats=stats))
    assert info.value.url == missing
