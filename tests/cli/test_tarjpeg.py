"""tarjpeg: JPEG fields re-laid with restart markers, everything else kept, a summary on stderr."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tarhelpers import encode_image, run, tar_bytes, tarfile_members

from tarproc.cli.tarjpeg import main as tarjpeg
from tarproc.decode import cpu as cpu_backend

pytestmark = pytest.mark.skipif(cpu_backend._jpeg is None, reason="tarproc._jpeg is not built")
REPO = Path(__file__).resolve().parents[2]


def photo(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def shard() -> bytes:
    return tar_bytes([
        {"__key__": "a", "jpg": encode_image(photo(96, 64, 1), quality=90), "cls": b"1"},
        {"__key__": "b", "jpg": encode_image(photo(64, 48, 2), progressive=True), "cls": b"2"},
        {"__key__": "c", "jpeg": encode_image(photo(50, 30, 3), quality=80), "json": b"{}"},
        {"__key__": "d", "jpg": encode_image(photo(96, 64, 1), quality=90)[:700]},
    ])


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _check(original: bytes, relaid: bytes) -> None:
    before, after = dict(tarfile_members(original)), dict(tarfile_members(relaid))
    assert list(before) == list(after)
    for name in ("a.cls", "b.jpg", "b.cls", "c.json", "d.jpg"):
        assert after[name] == before[name], name
    for name in ("a.jpg", "c.jpeg"):
        assert after[name] != before[name] and b"\xff\xdd" in after[name]  # a DRI marker
        assert np.array_equal(pixels(after[name]), pixels(before[name]))


def test_jpegs_are_relaid_and_the_rest_kept() -> None:
    data = shard()
    r = run(tarjpeg, ["-p", "2"], input=data)
    assert r.exit_code == 0, r.stderr
    _check(data, r.stdout_bytes)
    assert "field 'jpg' of sample 'd' passed through unchanged: Premature end of JPEG file" in r.stderr
    assert "4 samples, 2 JPEGs re-laid" in r.stderr
    assert "2 passed through unchanged (1 progressive, 1 damaged)" in r.stderr


def test_quiet_strict_and_interval(tmp_path: Path) -> None:
    data = shard()
    r = run(tarjpeg, ["-q", "--restart-interval", "1"], input=data)
    assert r.exit_code == 0 and "re-laid" not in r.stderr
    assert run(tarjpeg, ["-q"], input=r.stdout_bytes).stdout_bytes == r.stdout_bytes  # laid out already
    r = run(tarjpeg, ["-q", "--optimize"], input=data)
    assert r.exit_code == 0
    _check(data, r.stdout_bytes)
    r = run(tarjpeg, ["--strict"], input=data)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "tarjpeg: error: -: cannot decode field 'jpg' of sample 'd': Premature end of JPEG file")
    r = run(tarjpeg, ["--restart-interval", "70000"], input=data)
    assert r.exit_code == 2


def test_in_a_real_pipeline(tmp_path: Path) -> None:
    path = tmp_path / "in.tar"
    path.write_bytes(shard())
    bin_dir = REPO / "bin"
    r = subprocess.run(["bash", "-c", f"set -o pipefail; '{bin_dir}/tarcat' '{path}' | '{bin_dir}/tarjpeg' -p 2 "
                                      f"| '{bin_dir}/tarcat'"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    _check(path.read_bytes(), r.stdout)
    assert b"tarjpeg: 4 samples, 2 JPEGs re-laid" in r.stderr
