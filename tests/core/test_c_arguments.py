"""The C extensions check their own arguments: every exported function of ``tarproc._speedups``
and ``tarproc._jpeg`` raises TypeError for a wrong type, ValueError for a bad value or size and
OverflowError past C's range, naming the argument. Never SystemError, undefined behaviour, a crash
or silently wrong output. ``make test-sanitize`` runs this file against ASan/UBSan builds of both
(docs/development.md), where a read out of bounds fails the run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tarhelpers import encode_image

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LLONG_MAX = 2**63 - 1


def _extension(name: str) -> Any:
    """``tarproc.<name>``, or None where it is not built or TARPROC_PURE_PYTHON turns it off."""
    if os.environ.get("TARPROC_PURE_PYTHON") and name == "_speedups":
        return None
    try:
        return __import__(f"tarproc.{name}", fromlist=[name])
    except ImportError:
        return None


speedups = _extension("_speedups")
jpeg = _extension("_jpeg")
needs_speedups = pytest.mark.skipif(speedups is None, reason="tarproc._speedups is not built (or TARPROC_PURE_PYTHON is set)")
needs_jpeg = pytest.mark.skipif(jpeg is None, reason="tarproc._jpeg is not built (no libjpeg-turbo headers)")


def test_the_sanitized_build_is_the_one_under_test() -> None:
    """Under ``make test-sanitize`` (TARPROC_SANITIZED_BUILD names its directory) both extensions
    must come from there: a run against the normal build would pass without checking anything."""
    where = os.environ.get("TARPROC_SANITIZED_BUILD")
    if not where:
        pytest.skip("not a sanitizer run (make test-sanitize sets TARPROC_SANITIZED_BUILD)")
    root = Path(where).resolve()
    assert speedups is not None, "tarproc._speedups failed to build with the sanitizers"
    if jpeg is None:  # built where libjpeg-turbo's headers are, as test_jpeg_fastpath.py requires
        assert not os.path.exists("/usr/include/jpeglib.h"), "tarproc._jpeg failed to build with the sanitizers"
    for module in (speedups, jpeg):
        if module is not None:
            assert root in Path(module.__file__).resolve().parents, module.__file__


# ------------------------------------------------------------------------------------------------
# tarproc._jpeg

W, H = 40, 24


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    import numpy as np

    y, x = np.mgrid[0:H, 0:W]
    pixels = np.stack([x * 6, y * 10, (x + y) * 3], axis=-1).astype(np.uint8)
    return encode_image(pixels, quality=90)


def _resample_args(**change: Any) -> tuple[Any, ...]:
    """resample's arguments for an 8 x 6 RGBX source to a 4 x 3 uint8 HWC output, with `change`."""
    args = dict(src=bytes(8 * 6 * 4), width=8, height=6, box=(0.0, 0.0, 8.0, 6.0), out_w=4, out_h=3, flip=False,
                color=None, tables=b"", mode=0, out=bytearray(4 * 3 * 3))
    args.update(change)
    return tuple(args.values())


def _warp_args(**change: Any) -> tuple[Any, ...]:
    """warp's arguments for an 8 x 6 RGB source to a 4 x 3 uint8 HWC output, with `change`."""
    args = dict(src=bytes(8 * 6 * 3 + 1), width=8, height=6, matrix=(1.0, 0.0, 0.0, 0.0, 1.0, 0.0), out_w=4, out_h=3,
                flip=False, color=None, tables=b"", mode=0, out=bytearray(4 * 3 * 3))
    args.update(change)
    return tuple(args.values())


COLOR = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]


@needs_jpeg
@pytest.mark.parametrize("function", ["resample", "warp"])
@pytest.mark.parametrize(("color", "error", "match"), [
    (COLOR[:11] + ["red"], TypeError, r"color\[11\] must be a number, not str"),
    (COLOR[:3] + [None] + COLOR[4:], TypeError, r"color\[3\] must be a number, not NoneType"),
    (5, TypeError, "color must be None or a sequence of 12 numbers, not int"),
    (COLOR[:6], ValueError, "color must hold 12 numbers, not 6"),
    (COLOR[:5] + [float("nan")] + COLOR[6:], ValueError, r"color\[5\] must be finite"),
    (COLOR[:1] + [float("inf")] + COLOR[2:], ValueError, r"color\[1\] must be finite"),
    (COLOR[:1] + [1e39] + COLOR[2:], ValueError, r"color\[1\] must be finite, between -65536 and 65536$"),
    # finite, but a row's sum could be inf - inf: a NaN cast to a byte
    (COLOR[:4] + [3e38, -3e38] + COLOR[6:], ValueError, r"color\[4\] must be finite, between -65536 and 65536$"),
    (COLOR[:11] + [-65536.5], ValueError, r"color\[11\] must be finite, between -65536 and 65536$"),
    (COLOR[:2] + [10**400] + COLOR[3:], OverflowError, "int too large to convert to float"),
])
def test_a_color_that_is_not_12_finite_numbers_is_named(function: str, color: Any, error: type, match: str) -> None:
    make = _resample_args if function == "resample" else _warp_args
    with pytest.raises(error, match=match if error is OverflowError else f"^{function}: {match}"):
        getattr(jpeg, function)(*make(color=color))


@needs_jpeg
@pytest.mark.parametrize("function", ["resample", "warp"])
@pytest.mark.parametrize(("change", "match"), [
    ({"width": -8}, "width and height must be 1..1048576, not -8 x 6"),
    ({"height": 0}, "width and height must be 1..1048576, not 8 x 0"),
    ({"width": INT_MAX, "height": INT_MAX}, "width and height must be 1..1048576"),
    ({"out_w": -4}, "out_w and out_h must be 1..1048576, not -4 x 3"),
    ({"out_w": INT_MAX, "out_h": INT_MAX}, "out_w and out_h must be 1..1048576"),
    ({"mode": 4}, "mode must be 0 .*, not 4"),
    ({"mode": -1}, "mode must be 0 .*, not -1"),
    ({"out": bytearray(35)}, "out holds 35 bytes, a 4 x 3 image in mode 0 needs 36"),
    ({"out": bytearray(36 * 4), "mode": 3}, "tables holds 0 bytes, the float32 modes need"),
    ({"out": bytearray(36 * 4 - 1), "mode": 2, "tables": bytes(3072)}, "out holds 143 bytes.* needs 144"),
    ({"out": memoryview(bytearray(36 * 4 + 1))[1:], "mode": 2, "tables": bytes(3072)}, "out must be aligned to 4 bytes"),
])
def test_bad_sizes_and_modes_are_value_errors(function: str, change: dict[str, Any], match: str) -> None:
    make = _resample_args if function == "resample" else _warp_args
    with pytest.raises(ValueError, match=f"^{function}: {match}"):
        getattr(jpeg, function)(*make(**change))


@needs_jpeg
def test_resample_and_warp_need_the_whole_source() -> None:
    with pytest.raises(ValueError, match=r"^resample: src holds 191 bytes, a 8 x 6 RGBX image needs 192$"):
        jpeg.resample(*_resample_args(src=bytes(191)))
    with pytest.raises(ValueError, match=r"^warp: src holds 143 bytes, a 8 x 6 RGB image needs 144$"):
        jpeg.warp(*_warp_args(src=bytes(143)))


@needs_jpeg
@pytest.mark.parametrize("box", [
    (-1.0, 0.0, 8.0, 6.0),           # left of the image
    (0.0, 0.0, 8.5, 6.0),            # past its right edge
    (0.0, 0.0, 8.0, 1e300),          # far below it
    (5.0, 0.0, 4.0, 6.0),            # reversed
    (0.0, float("nan"), 8.0, 6.0),   # not a number
    (0.0, 0.0, float("inf"), 6.0),
])
def test_resample_takes_a_box_within_the_source_as_pillow_does(box: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=r"^resample: box must be finite, with 0 <= x0 <= x1 <= width \(8\)"):
        jpeg.resample(*_resample_args(box=box))


@needs_jpeg
def test_an_empty_box_at_the_edge_is_taken_as_pillow_takes_it() -> None:
    """Pillow's resize allows x0 == x1 (a zero-width box: the pixels at that edge, stretched)."""
    out = bytearray(36)
    jpeg.resample(*_resample_args(src=bytes(range(192)), box=(8.0, 6.0, 8.0, 6.0), out=out))
    assert len(set(out)) > 1


@needs_jpeg
@pytest.mark.parametrize("matrix", [
    (float("nan"), 0.0, 0.0, 0.0, 1.0, 0.0),
    (1.0, 0.0, float("-inf"), 0.0, 1.0, 0.0),
    (1.0, 0.0, 0.0, 0.0, 1.0, 1e40),
])
def test_warp_takes_a_finite_matrix(matrix: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=r"^warp: matrix must be 6 finite numbers"):
        jpeg.warp(*_warp_args(matrix=matrix))


@needs_jpeg
def test_float_tables_need_not_be_aligned() -> None:
    """The lookup tables are copied once per call: a buffer at any address is read correctly."""
    import numpy as np

    tables = np.tile(np.arange(256, dtype=np.float32) / 255, 3)
    unaligned = memoryview(b"\0" + tables.tobytes())[1:]
    src = bytes(range(8 * 6 * 4))
    want, got = np.empty((3, 4, 3), np.float32), np.empty((3, 4, 3), np.float32)
    jpeg.resample(*_resample_args(src=src, tables=tables, mode=2, out=want))
    jpeg.resample(*_resample_args(src=src, tables=unaligned, mode=2, out=got))
    assert np.array_equal(want, got) and want.max() > 0


@needs_jpeg
@pytest.mark.parametrize(("num", "denom"), [(0, 8), (1, 0), (1, -8), (129, 8), (1, INT_MAX), (INT_MAX, 1)])
def test_decode_region_names_a_bad_scale(photo_jpeg: bytes, num: int, denom: int) -> None:
    with pytest.raises(ValueError, match=rf"^decode_region: bad scale {num}/{denom}: need 1 <= denom <= 1048576"):
        jpeg.decode_region(photo_jpeg, 0, 0, 8, 8, denom, num)


@needs_jpeg
@pytest.mark.parametrize("channels", [0, 1, 2, 5, -3])
def test_decode_region_names_bad_channels(photo_jpeg: bytes, channels: int) -> None:
    with pytest.raises(ValueError, match=rf"^decode_region: channels must be 3 \(RGB\) or 4 \(RGBX\), not {channels}$"):
        jpeg.decode_region(photo_jpeg, 0, 0, 8, 8, 8, 8, channels)


@needs_jpeg
@pytest.mark.parametrize("window", [(5, 0, 5, 8), (0, 8, 8, 3), (INT_MAX, 0, INT_MIN, 8)])
def test_decode_region_refuses_an_empty_window(photo_jpeg: bytes, window: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"^decode_region: empty window .*: need x0 < x1 and y0 < y1$"):
        jpeg.decode_region(photo_jpeg, *window, 1)


@needs_jpeg
@pytest.mark.parametrize("window", [
    (W, 0, W + 8, 8),                  # right of the image
    (0, H, 8, H + 1),                  # below it
    (-9, 0, 0, 8),                     # left of it
    (INT_MAX - 1, 0, INT_MAX, 8),      # at int's edge: widening it by two columns would overflow
    (0, INT_MAX - 1, 8, INT_MAX),
])
def test_decode_region_refuses_a_window_outside_the_image(photo_jpeg: bytes, window: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=rf"^decode_region: window .* lies outside the {W} x {H} image"):
        jpeg.decode_region(photo_jpeg, *window, 1)


@needs_jpeg
def test_decode_region_clamps_a_window_reaching_past_int_min(photo_jpeg: bytes) -> None:
    """A window from INT_MIN is clamped to the image (not widened past INT_MIN, which wrapped it
    round to a window right of the image and decoded the whole image instead)."""
    buf, cw, ch, ox, oy = jpeg.decode_region(photo_jpeg, INT_MIN, INT_MIN, 5, 5, 1)
    want = jpeg.decode_region(photo_jpeg, 0, 0, 5, 5, 1)
    assert (ox, oy, ch) == (0, 0, 5) and cw < W
    assert (bytes(buf), cw, ch, ox, oy) == (bytes(want[0]), *want[1:])


@needs_jpeg
def test_decode_region_and_read_header_say_what_is_wrong_with_data(photo_jpeg: bytes) -> None:
    with pytest.raises(TypeError):
        jpeg.decode_region("not bytes", 0, 0, 8, 8, 8)
    with pytest.raises(TypeError):
        jpeg.read_header(None)
    for cut in (0, 2, 40, len(photo_jpeg) // 2):
        with pytest.raises(ValueError):
            jpeg.decode_region(photo_jpeg[:cut], 0, 0, W, H, 1)
    with pytest.raises(ValueError):
        jpeg.read_header(photo_jpeg[:40])
    with pytest.raises(OverflowError):
        jpeg.decode_region(photo_jpeg, 0, 0, 2**31, 8, 1)


# ------------------------------------------------------------------------------------------------
# tarproc._speedups


def _tar(*members: tuple[str, bytes]) -> bytes:
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@needs_speedups
@pytest.mark.parametrize(("args", "error", "match"), [
    ((-1, 0, 100, True), ValueError, r"^scan: pos -1 is outside the buffer of \d+ bytes$"),
    ((1 << 40, 0, 100, True), ValueError, r"^scan: pos 1099511627776 is outside the buffer"),
    ((0, -512, 100, True), ValueError, r"^scan: base, max_member_size, views and refs must be >= 0$"),
    ((0, 0, -1, True), ValueError, r"^scan: base, max_member_size, views and refs must be >= 0$"),
    ((0, 0, 100, True, -1), ValueError, r"^scan: base, max_member_size, views and refs must be >= 0$"),
    ((0, 0, 100, True, 0, -1), ValueError, r"^scan: base, max_member_size, views and refs must be >= 0$"),
    ((0, LLONG_MAX - 100, 100, True), OverflowError, r"^scan: base 9223372036854775707 \+ the buffer's"),
    ((0, 0, 100, True, 0, 1, "not callable"), TypeError, r"^scan: ref must be callable or None, not str$"),
])
def test_scan_checks_its_positions_and_limits(args: tuple[Any, ...], error: type, match: str) -> None:
    buf = _tar(("a.txt", b"x" * 10), ("b.txt", b"y"))
    with pytest.raises(error, match=match):
        speedups.scan(buf, *args)


@needs_speedups
def test_scan_reads_up_to_the_end_of_the_buffer_and_no_further() -> None:
    buf = _tar(("a.txt", b"x" * 10), ("b.txt", b"y"))
    items, pos, nbytes, last = speedups.scan(buf, 0, LLONG_MAX - 512 - len(buf), 100, True)
    assert [item[:3] for item in items] == [("a", "txt", b"x" * 10), ("b", "txt", b"y")] and nbytes == 11
    assert speedups.scan(buf, len(buf), 0, 100, True) == ([], len(buf), 0, None)


@needs_speedups
@pytest.mark.parametrize(("fd", "origin", "limit"), [(-1, 0, 100), (0, -1, 100), (0, 0, -1)])
def test_index_file_checks_fd_origin_and_limit(fd: int, origin: int, limit: int, tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    path.write_bytes(_tar(("a.txt", b"x")))
    with path.open("rb") as f:
        with pytest.raises(ValueError, match=r"^index_file: fd, origin and max_member_size must be >= 0"):
            speedups.index_file(f.fileno() if fd == 0 else fd, origin, limit, tuple)


@needs_speedups
def test_index_file_gives_up_on_an_origin_at_the_end_of_64_bits(tmp_path: Path) -> None:
    """origin + the position read must not overflow: past any file's end, it gives up (None)."""
    path = tmp_path / "a.tar"
    path.write_bytes(_tar(("a.txt", b"x")))
    with path.open("rb") as f:
        assert speedups.index_file(f.fileno(), LLONG_MAX - 100, 100, tuple) is None


@needs_speedups
def test_jsonl_lines_needs_a_callable_encode() -> None:
    entries = [("k", 0, 1024, {"txt": (512, 1)}, None)]
    with pytest.raises(TypeError, match=r"^jsonl_lines: encode must be callable, not NoneType$"):
        speedups.jsonl_lines(entries, None)


@needs_speedups
def test_jsonl_lines_survives_an_encode_that_empties_what_it_writes() -> None:
    """encode is Python code: one that clears the list of entries being written must not leave the
    C loop reading freed objects (ASan says so under make test-sanitize)."""
    entries: list[Any] = []

    def encode(s: str) -> str:
        entries.clear()  # the entry being written, and its dicts, are freed unless jsonl_lines holds them
        return '"' + s.encode("ascii", "backslashreplace").decode() + '"'

    # objects made here and held by the entries alone (no constants), so that they are freed, and
    # dicts of 20 fields, whose tables are past CPython's free lists: ASan sees the memory go
    for n in range(2):
        fields = {f"f{i}\u00e9{n}": (512 * i, i) for i in range(20)}
        entries.append((f"k{n}\u00e9", 1024 * n, 1024, fields, {name: name.upper() for name in fields}))
    del fields
    got = speedups.jsonl_lines(entries, encode)
    assert got is None or isinstance(got, bytes)


TEMPLATES = bytes(3 * 512)


@needs_speedups
@pytest.mark.parametrize(("args", "error", "match"), [
    ((0, [("a.txt", b"x")], 0, TEMPLATES, -1), ValueError, r"^pack: need 0 <= used <= len\(buf\) \(4096\) and "
                                                           r"direct >= 0, not used 0, direct -1$"),
    ((4097, [("a.txt", b"x")], 0, TEMPLATES, 1 << 16), ValueError, r"^pack: need 0 <= used <= len\(buf\)"),
    ((0, [("a.txt", b"x")], 2, TEMPLATES, 1 << 16), ValueError, r"^pack: start 2 is outside members \(1 of them\)$"),
    ((0, [("a.txt", b"x")], -1, TEMPLATES, 1 << 16), ValueError, r"^pack: start -1 is outside members"),
    ((0, iter([("a.txt", b"x")]), 0, TEMPLATES, 1 << 16), TypeError,
     r"^pack: members must be a list or a tuple, not list_iterator$"),
    ((0, [("a.txt", b"x")], 0, TEMPLATES[:-1], 1 << 16), ValueError,
     r"^pack: templates must be 3 headers of 512 bytes, not 1535 bytes$"),
])
def test_pack_checks_its_arguments(args: tuple[Any, ...], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        speedups.pack(bytearray(4096), *args)


@needs_speedups
@pytest.mark.parametrize(("args", "error", "match"), [
    ((0, iter([]), TEMPLATES, -5, None), ValueError, r"^pack_samples: need 0 <= used <= len\(buf\) \(4096\) and "
                                                     r"direct >= 0, not used 0, direct -5$"),
    ((0, [{"__key__": "a", "txt": b"x"}], TEMPLATES, 1 << 16, None), TypeError,
     r"^pack_samples: samples must be an iterator, not list$"),
    ((0, iter([]), bytes(512), 1 << 16, None), ValueError,
     r"^pack_samples: templates must be 3 headers of 512 bytes, not 512 bytes$"),
])
def test_pack_samples_checks_its_arguments(args: tuple[Any, ...], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        speedups.pack_samples(bytearray(4096), *args)


@needs_speedups
def test_pack_survives_a_file_range_whose_length_changes_the_members(tmp_path: Path) -> None:
    """A FileRange's __len__ is Python code: one that empties the list of members while pack walks
    it must not leave pack reading freed members. Run in a child process, since set_range_type
    changes the module for the whole process."""
    code = textwrap.dedent("""
        from tarproc import _speedups

        members = []

        class Range:
            def __len__(self):
                members.clear()
                return 1 << 20

        _speedups.set_range_type(Range)
        name = "".join(["a", ".txt"])  # made here, not a constant: freed with its member
        members.extend([(name, Range()), ("b.txt", b"x" * 10)])
        del name
        used, next_, status = _speedups.pack(bytearray(8192), 0, members, 0, bytes(1536), 1 << 16)
        print(_speedups.__file__, used, next_, status)
    """)
    # the child imports the extension this process imports (the sanitized one under make
    # test-sanitize), not one from its working directory
    package_root = str(Path(speedups.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    where, *got = out.stdout.split()
    assert Path(where).resolve() == Path(speedups.__file__).resolve()
    assert got == ["512", "0", "3"]  # a's header, then pack stops: the caller writes a's data


@needs_speedups
def test_members_takes_anything_and_says_none_for_what_is_not_its_case() -> None:
    assert speedups.members(5) is None
    assert speedups.members({"__key__": "a/b.c", "txt": b"x"}) is None


def _rules(**change: Any) -> SimpleNamespace:
    stats = SimpleNamespace(samples=0)
    rules = dict(stats=stats, metadata=lambda: None, metadata_name=lambda key, field: True, no_key=lambda field: None,
                 duplicate_field=lambda *a: None, reappearing_key=lambda *a: None)
    rules.update(change)
    return SimpleNamespace(**rules)


@needs_speedups
@pytest.mark.parametrize("name", ["metadata", "metadata_name", "no_key", "duplicate_field", "reappearing_key"])
def test_grouper_needs_callable_rules(name: str) -> None:
    with pytest.raises(TypeError, match=rf"^Grouper: rules\.{name} must be callable, not int$"):
        speedups.Grouper(iter([]), "u", _rules(**{name: 1}))


@needs_speedups
def test_grouper_takes_no_keywords() -> None:
    with pytest.raises(TypeError, match="^Grouper takes no keyword arguments$"):
        speedups.Grouper(iter([]), "u", _rules(), unknown=1)


@needs_speedups
def test_grouper_does_not_count_past_the_largest_count() -> None:
    rules = _rules(stats=SimpleNamespace(samples=sys.maxsize))
    grouper = speedups.Grouper(iter([("a", "txt", b"x", 0)]), "u", rules)
    with pytest.raises(OverflowError, match=r"^Grouper: rules\.stats\.samples is at its largest$"):
        next(grouper)
    assert rules.stats.samples == sys.maxsize


@needs_jpeg
@pytest.mark.parametrize("function", ["resample", "warp"])
def test_a_color_map_at_the_bound_is_taken(function: str) -> None:
    """Coefficients of ±65536 are taken (every level saturates): the bound refuses only what could
    make a NaN."""
    make = _resample_args if function == "resample" else _warp_args
    out = bytearray(36)
    getattr(jpeg, function)(*make(src=bytes([1]) * 193, color=[65536.0, -65536.0, 0.0, 0.0] * 3, out=out))
    assert set(out) == {0}
