"""The library's warnings go through the process's warning filters (errors.warn), and those are shared
by every thread: a block that quiets Pillow must quiet only Pillow, or a warning another thread
gives meanwhile (a read-ahead thread's retry) is lost."""

from __future__ import annotations

import ast
import io
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import tarproc
from tarproc.content import ContentStats
from tarproc.errors import NetworkWarning, TarprocWarning, warn
from tarproc.imaging import decode_image

PACKAGE = Path(tarproc.__file__).parent


def _bmp() -> bytes:
    """An image whose header content.py reads with Pillow (it reads JPEG and PNG headers itself)."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(buf, "BMP")
    return buf.getvalue()


def image_header(data: bytes) -> tuple[int, int]:
    """What tarshow --summary reads of an image field: its width and height (Pillow reads them)."""
    stats = ContentStats(probe_media=False)
    stats.add("k", "bmp", data, None)
    fc = stats.fields["bmp"]
    assert fc.undecodable == 0
    return fc.width.max, fc.height.max


@pytest.fixture
def shown():
    """The messages shown while the test runs, every TarprocWarning shown each time it comes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TarprocWarning)
        yield caught


@pytest.mark.parametrize("read", [decode_image, image_header])
def test_a_warning_another_thread_gives_during_a_pillow_call_is_shown(monkeypatch, shown, read):
    """Pillow's own warnings are still hidden in the block; another thread's warning is not."""
    opened = Image.open

    def open_while_another_thread_warns(*args, **kwargs):
        thread = threading.Thread(target=warn, args=("s.tar: retry 1", NetworkWarning))
        thread.start()
        thread.join()
        warnings.warn_explicit("Possibly corrupt EXIF data", UserWarning, "TiffImagePlugin.py", 1,
                               module="PIL.TiffImagePlugin", registry={})  # as Pillow warns
        return opened(*args, **kwargs)

    monkeypatch.setattr(Image, "open", open_while_another_thread_warns)
    read(_bmp())
    assert [(w.category, str(w.message)) for w in shown] == [(NetworkWarning, "s.tar: retry 1")]


def test_no_warning_is_lost_while_images_decode_in_a_loop(shown):
    """/tmp/review/race.py: a thread warning while the main thread decodes images in a loop."""
    bmp, n = _bmp(), 300
    done = threading.Event()
    decoding = threading.Semaphore(0)  # one warning per decode the main thread starts: they overlap

    def reader():
        for i in range(n):
            decoding.acquire()
            warn(f"retry {i}", NetworkWarning)
        done.set()

    thread = threading.Thread(target=reader)
    thread.start()
    decoded = 0
    while not done.is_set():
        decoding.release()
        decode_image(bmp)
        image_header(bmp)
        decoded += 1
    thread.join()
    assert decoded > 0
    assert sorted(str(w.message) for w in shown if w.category is NetworkWarning) == sorted(f"retry {i}" for i in range(n))


def test_pillow_warnings_stay_hidden_and_a_bomb_stays_an_error(monkeypatch, shown):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 600)  # 32x32 = 1024 > 600: a warning, < 1200: no error
    with pytest.raises(tarproc.errors.ImageDecodeError, match="decompression bomb"):
        decode_image(_bmp())
    assert image_header(_bmp()) == (32, 32)  # the header: read, no warning
    assert list(shown) == []


def _blanket_ignores(tree: ast.AST) -> list[int]:
    """Lines of ``warnings.simplefilter("ignore")`` / ``filterwarnings("ignore")`` with nothing to
    narrow them (no category, module or message)."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("simplefilter", "filterwarnings")
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "ignore"
                and len(node.args) == 1 and not {k.arg for k in node.keywords} & {"category", "module", "message"}):
            found.append(node.lineno)
    return found


# ignore every warning in a block still: they are to be narrowed as imaging.py and content.py are
# (files outside the change that added this test); no other module may add one
KNOWN_BLANKET_IGNORES: set[str] = set()  # none: each ignores the warnings it means


def test_no_module_ignores_every_warning():
    assert _blanket_ignores(ast.parse('import warnings\nwarnings.simplefilter("ignore")\n'
                                      'warnings.filterwarnings("ignore", module="PIL")')) == [2]
    offenders = {
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in _blanket_ignores(ast.parse(path.read_text(encoding="utf-8")))
        if str(path.relative_to(PACKAGE.parent)) not in KNOWN_BLANKET_IGNORES
    }
    assert offenders == set(), "ignore only the warnings meant (by module or category): " + ", ".join(sorted(offenders))
