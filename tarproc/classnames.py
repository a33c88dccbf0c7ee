"""Class names for integer labels: ``--classes FILE``, or a ``classes.txt`` beside the shards.

``tarcreate --classes-from-dirs ROOT --classes classes.txt`` writes one name a line (line i: label
i); the summary, the report and the viewer show ``3 (golden_retriever)`` instead of ``3`` with it.

>>> import tempfile, os; d = tempfile.mkdtemp(); p = os.path.join(d, "classes.txt")
>>> _ = open(p, "w").write("cat\\ndog\\n")
>>> read_class_names(p), class_names_beside([os.path.join(d, "train-000000.tar")])
(['cat', 'dog'], ['cat', 'dog'])
>>> label_name("1", ["cat", "dog"]), label_name("7", ["cat", "dog"]), label_name("x", None)
('1 (dog)', '7', 'x')
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from .errors import SourceError, TarprocError

CLASSES_FILE = "classes.txt"
MAX_CLASSES_BYTES = 64 << 20  # a class list is small; a bigger file is not one


class ClassNamesError(TarprocError):
    """A class-names file that cannot be read or is not a list of names; names the file (and line)."""


def read_class_names(path: str) -> list[str]:
    """The names in ``path`` (local or a URL), one a line, line i naming label i; blank lines at the
    end are dropped. Raises ``ClassNamesError`` naming the file when it can't be read or isn't text."""
    import os

    from .sources import local_path, open_source, read_to_end

    local = local_path(path)
    if local is not None and os.path.isdir(local):  # open_source would call it "not a tar file"
        raise ClassNamesError("is a directory, not a list of class names", path)
    try:
        with open_source(path) as src:
            data = read_to_end(src, MAX_CLASSES_BYTES + 1)
    except SourceError as e:
        raise ClassNamesError(e.message, path) from None
    if len(data) > MAX_CLASSES_BYTES:
        raise ClassNamesError(f"over {MAX_CLASSES_BYTES >> 20} MiB: not a list of class names", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ClassNamesError(f"line {line}: not UTF-8 text", path) from None
    names = text.splitlines()
    while names and not names[-1].strip():
        names.pop()
    return [name.strip() for name in names]


def class_names_beside(urls: Sequence[str]) -> list[str] | None:
    """The names in the ``classes.txt`` in the directory of the first shard, when it has one (local
    shards only: a remote listing would cost a request per run); None otherwise."""
    import os

    from .sources import local_path

    if not urls:
        return None
    path = local_path(urls[0])
    if path is None or urls[0] == "-":
        return None
    candidate = posixpath.join(posixpath.dirname(path) or ".", CLASSES_FILE)
    if not os.path.isfile(candidate):
        return None
    return read_class_names(candidate)


def label_name(label: str, names: Sequence[str] | None) -> str:
    """``"3 (golden_retriever)"`` for a label that is an index into ``names``; the label as it is otherwise."""
    if names:
        text = label.strip()
        if text.isdigit() and int(text) < len(names) and names[int(text)]:
            return f"{text} ({names[int(text)]})"
    return label


__all__ = ["CLASSES_FILE", "ClassNamesError", "class_names_beside", "label_name", "read_class_names"]
