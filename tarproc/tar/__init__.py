"""Streaming tar reading and writing: our own parser, not ``tarfile``.

Reading: ``iter_members(stream, url)`` yields ``(name, data, offset)`` for every regular file of a
tar stream, in order. It understands ustar (with the 155-byte prefix), GNU long names and long link
names (``././@LongLink``, types ``L``/``K``), pax extended and global headers (path, linkpath, size,
mtime), base-256 numeric fields and old v7 headers without magic. Every header checksum is verified
(unsigned and signed sums). Any damage -- a stream that ends inside a header, inside member data or
before the end-of-archive blocks, a bad checksum, garbage where a header or the end padding should
be -- raises ``TarFormatError`` with the URL, the byte offset and the member.

Memory grows only with bytes actually read: member data is read in bounded pieces, so a header that
claims 8 GiB in a 1 MB stream costs 1 MB before it fails. (A sparse file is the exception: it is
expanded to its real size, at most ``max_member_size``, which briefly takes twice that.)

Writing: ``TarWriter`` writes deterministic archives (fixed mtime, owner and mode), ustar headers
where names fit and GNU long-name records where they don't, end blocks and record padding.

Both have an optional C fast path (tarproc/_speedups.c) for the common case, which hands anything
else back to the Python code: that is the reference, and the tests check that the two give the
same members, errors and bytes (test_parity.py, test_writer_parity.py). ``TARPROC_PURE_PYTHON=1``
turns the C paths off.

The modules: ``policy`` (``ReadPolicy``), ``headers`` (header fields, pax, the key rule),
``sparse``, ``links``, ``ranges`` (data left in the file), ``reader`` (``iter_members`` and the
scanning seam ``MemberScan``), ``writer`` (``TarWriter``) and ``stats`` (``ReadStats``). This
package's names are its public interface; import them from here.
"""

from __future__ import annotations

from .headers import BLOCK, RECORD, split_key
from .links import DEFAULT_LINK_CACHE
from .policy import DEFAULT_MAX_MEMBER_SIZE, DUP_POLICIES, LINK_POLICIES, ON_ERROR_POLICIES, ReadPolicy
from .ranges import FileRange, MemberData, Unread, file_origin, stream_skipper
from .reader import MemberFinder, MemberScan, iter_keyed_members, iter_members
from .stats import ReadStats
from .writer import (
    TarWriter,
    Writable,
    check_key,
    default_mtime,
    encode_value,
    ends_at_member,
    sample_members,
    tar_end_size,
)

__all__ = [
    "BLOCK",
    "DEFAULT_LINK_CACHE",
    "DEFAULT_MAX_MEMBER_SIZE",
    "DUP_POLICIES",
    "FileRange",
    "LINK_POLICIES",
    "MemberData",
    "MemberFinder",
    "MemberScan",
    "ON_ERROR_POLICIES",
    "RECORD",
    "ReadPolicy",
    "ReadStats",
    "TarWriter",
    "Unread",
    "Writable",
    "check_key",
    "default_mtime",
    "encode_value",
    "ends_at_member",
    "file_origin",
    "iter_keyed_members",
    "iter_members",
    "sample_members",
    "split_key",
    "stream_skipper",
    "tar_end_size",
]
