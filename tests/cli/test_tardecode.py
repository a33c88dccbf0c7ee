"""tardecode: tar in, tar out with the image replaced by a .npy array; errors; a real pipe."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tarproc.cli.tardecode import main as tardecode
from tarproc.decode import dali_available


def jpeg(seed: int, w: int = 80, h: int = 60) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, np.full_like(x, 90)], axis=-1)
    array = np.clip(base + rng.normal(0, 5, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def shard(n: int, bad: dict[int, bytes] | None = None) -> list[dict[str, object]]:
    return [{"__key__": f"s{i:03d}", "jpg": (bad or {}).get(i, jpeg(i)), "cls": b"%d" % i, "json": b'{"i": %d}' % i}
            for i in range(n)]


def arrays(cli, data: bytes) -> list[tuple[str, np.ndarray, dict[str, bytes]]]:  # type: ignore[no-untyped-def]
    return [(key, np.load(io.BytesIO(fields.pop("npy"))), fields) for key, fields in cli.samples(data)]


def test_decodes_to_npy_and_keeps_other_fields(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli.run(tardecode, ["--device", "cpu", "--size", "32"], input=cli.tar_bytes(shard(5)))
    assert r.exit_code == 0, r.stderr
    out = arrays(cli, r.stdout_bytes)
    assert [k for k, _, _ in out] == [f"s{i:03d}" for i in range(5)]
    for i, (_, array, fields) in enumerate(out):
        assert array.shape == (32, 32, 3) and array.dtype == np.uint8
        assert fields == {"cls": b"%d" % i, "json": b'{"i": %d}' % i}
    assert r.stderr == ""  # an explicit device is not reported


def test_augmentation_options_and_seed(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard(6))
    args = [src, "--device", "cpu", "--size", "24", "--random-crop", "--flip", "0.5", "--mean", "imagenet",
            "--std", "imagenet", "--layout", "CHW", "--dtype", "float16", "-b", "4", "-q"]
    one = cli.run(tardecode, [*args, "--seed", "1"])
    again = cli.run(tardecode, [*args, "--seed", "1", "-p", "2"])
    other = cli.run(tardecode, [*args, "--seed", "2"])
    assert one.exit_code == again.exit_code == other.exit_code == 0
    assert one.stdout_bytes == again.stdout_bytes != other.stdout_bytes
    _, array, _ = arrays(cli, one.stdout_bytes)[0]
    assert array.shape == (3, 24, 24) and array.dtype == np.float16 and array.min() < -0.5


def test_rotation_and_jitter_options(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard(4))
    base = [src, "--device", "cpu", "--size", "24", "--random-crop", "--seed", "3", "-q"]
    plain = cli.run(tardecode, base)
    rotated = cli.run(tardecode, [*base, "--rotate", "10", "--jitter", "0.4,0.4,0.4,0.1"])
    assert plain.exit_code == rotated.exit_code == 0
    assert plain.stdout_bytes != rotated.stdout_bytes
    bad = cli.run(tardecode, [*base, "--jitter", "0.4,x"])
    assert bad.exit_code == 2 and "bad --jitter '0.4,x'" in bad.stderr
    assert cli.run(tardecode, [*base, "--rotate", "200"]).exit_code == 2


def test_auto_device_is_reported_and_stats(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli.run(tardecode, ["--resize", "30", "--stats", "-o", "/dev/null"], input=cli.tar_bytes(shard(3)))
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith("tardecode: decoding on ")
    assert "decoded 3 images on " in r.stderr and "skipped 0 bad images" in r.stderr


@pytest.mark.parametrize("device", ["cpu", "dali-cpu"])
@pytest.mark.parametrize("kind", ["corrupt", "truncated", "text"])
def test_bad_image_is_one_line_error_and_leaves_nothing(cli, tmp_path, device, kind) -> None:  # type: ignore[no-untyped-def]
    if device == "dali-cpu" and not dali_available():
        pytest.skip("NVIDIA DALI is not installed")
    good = jpeg(9)
    bad = {"corrupt": good[:300] + bytes(300) + good[600:], "truncated": good[:-400], "text": b"not an image\n" * 9}
    src = cli.write_tar(tmp_path / "in.tar", shard(4, {2: bad[kind]}))
    out = tmp_path / "out.tar"
    r = cli.run(tardecode, [src, "--device", device, "--size", "32", "-o", out, "-q"])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tardecode")
    assert f"{src}: cannot decode field 'jpg' of sample 's002': " in line
    assert not out.exists() and cli.leftovers(tmp_path) == []


@pytest.mark.parametrize("device", ["cpu", "dali-cpu"])
def test_on_error_skip_counts_and_keeps_the_rest(cli, tmp_path, device) -> None:  # type: ignore[no-untyped-def]
    if device == "dali-cpu" and not dali_available():
        pytest.skip("NVIDIA DALI is not installed")
    src = cli.write_tar(tmp_path / "in.tar", shard(6, {1: b"garbage" * 20, 4: jpeg(4)[:500]}))
    r = cli.run(tardecode, [src, "--device", device, "--size", "32", "-b", "4", "--on-error", "skip", "--stats"])
    assert r.exit_code == 0, r.stderr
    assert [k for k, _, _ in arrays(cli, r.stdout_bytes)] == ["s000", "s002", "s003", "s005"]
    assert "skipped 2 bad images" in r.stderr
    assert r.stderr.count("warning: skipped: ") == 2


@pytest.mark.parametrize("args", [
    ["--random-crop"],
    ["--size", "32", "--resize", "16"],
    ["--size", "32", "--mean", "imagenet", "--dtype", "uint8"],
    ["--size", "32", "--scale", "0.5,1"],
    ["--mean", "1,2"],
    ["--size", "32", "--random-crop", "--ratio", "x"],
    ["--output-field", ""],
    ["--size", "0"],
])
def test_usage_errors_exit_2(cli, args) -> None:  # type: ignore[no-untyped-def]
    r = cli.run(tardecode, ["--device", "cpu", *args], input=b"")
    assert r.exit_code == 2, r.stderr
    assert "Traceback" not in r.stderr


def test_real_pipeline_tarcat_tardecode_head(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard(40))
    pipe = subprocess.run(
        f"{sys.executable} -m tarproc.cli.tarcat {src} -c 30 | "
        f"{sys.executable} -m tarproc.cli.tardecode --device cpu --size 32 -p 2 -b 8 | "
        f"{sys.executable} -m tarproc.cli.tarcat --stats -o /dev/null",
        shell=True, capture_output=True, text=True, timeout=60,
    )
    assert pipe.returncode == 0, pipe.stderr
    assert "wrote 30 samples, 90 members" in pipe.stderr
    head = subprocess.run(
        f"set -o pipefail; {sys.executable} -m tarproc.cli.tardecode --device cpu {src} | head -c 1000 | wc -c",
        shell=True, capture_output=True, text=True, timeout=60, executable="/bin/bash",
    )
    assert head.stdout.strip() == "1000" and "Traceback" not in head.stderr and "error" not in head.stderr


def test_device_choices_follow_the_decode_stage():
    # common.py lists the devices itself so that other commands start without importing numpy/DALI
    from tarproc.cli.common import DEVICES
    from tarproc.decode import DEVICES as STAGE_DEVICES

    assert DEVICES == STAGE_DEVICES


def test_output_field_never_overwrites_another_field(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "d.tar"
    r = cli.run(tardecode, ["--device", "cpu", "--output-field", "cls", "-o", out], input=cli.tar_bytes(shard(2)))
    assert r.exit_code == 1
    assert "already has a field 'cls'" in r.stderr and "s000" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("name", ["__key__", "__url__", ".npy", "a/b"])
def test_metadata_names_are_not_output_fields(cli, name) -> None:  # type: ignore[no-untyped-def]
    r = cli.run(tardecode, ["--device", "cpu", "--output-field", name], input=cli.tar_bytes(shard(1)))
    assert r.exit_code == 2 and "bad --output-field" in r.stderr
