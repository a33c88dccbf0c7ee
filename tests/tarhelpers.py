"""Helpers shared by several test folders (importable because pytest's pythonpath has tests/)."""

from __future__ import annotations

import io
import tarfile


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    """``(name, data)`` of every regular member, read by Python's tarfile (an independent reader)."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        for info in tf:
            if info.isfile():
                f = tf.extractfile(info)
                assert f is not None
                out.append((info.name, f.read()))
    return out
