"""Compression: detect it by magic bytes when reading, choose it by suffix when writing.

Readers are strict: a gzip member must end with its CRC and length trailer, a zstd frame must be
complete, and so on; a stream that stops early raises ``CompressionError``. Multi-member gzip,
multi-frame zstd and multi-stream bz2/xz are read to the end.
"""

from __future__ import annotations

import zlib  # bz2 and lzma are imported where used: commands start without them
from collections.abc import Callable
from typing import IO, Any, Protocol

from .errors import CompressionError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BZ2_MAGIC = b"BZh"
XZ_MAGIC = b"\xfd7zXZ\x00"

# Compressed input is read in pieces this big ...
_FEED = 64 * 1024
# ... and one decompress call produces at most this much output (every decompressor here honours
# max_length), so memory stays bounded whatever the compression ratio (a "zip bomb" included).
_MAX_OUT = 4 * 1024 * 1024


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


# compressed formats recognised but not read here: (magic, name, a command that decompresses it)
_UNSUPPORTED = (
    (b"\x1f\x9d", "compress(1) .Z", "gzip -dc"),
    (b"\x04\x22\x4d\x18", "lz4", "lz4 -dc"),
    (b"LZIP", "lzip", "lzip -dc"),
)


def detect(head: bytes) -> str | None:
    """Return 'gzip', 'zstd', 'bz2', 'xz' or None (plain) for the first bytes of a stream.

    A zstd stream may begin with a skippable frame (magic 0x184D2A50 to 0x184D2A5F).

    >>> detect(b"\x5a\x2a\x4d\x18" + bytes(4)), detect(b"ustar")
    ('zstd', None)
    """
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC) or (len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18"):
        return "zstd"
    if head.startswith(BZ2_MAGIC) and len(head) >= 4 and head[3:4] in b"123456789":
        return "bz2"
    if head.startswith(XZ_MAGIC):
        return "xz"
    return None


def unsupported(head: bytes) -> tuple[str, str] | None:
    """``(format, command)`` when the first bytes are a compressed format read only by other
    tools (compress's .Z, lz4, lzip), with a command that decompresses it; else None. The byte
    after each magic must be valid for that format too: a tar begins with its first member's
    name, which may begin with "LZIP".

    >>> unsupported(b"LZIP\x01\x0c"), unsupported(b"LZIPtest.txt")
    (('lzip', 'lzip -dc'), None)
    """
    for magic, name, command in _UNSUPPORTED:
        if head.startswith(magic) and len(head) > len(magic) and _NEXT_BYTE_OK[name](head[len(magic)]):
            return name, command
    return None


_NEXT_BYTE_OK: dict[str, Callable[[int], bool]] = {
    "compress(1) .Z": lambda b: 9 <= (b & 0x1F) <= 16 and not b & 0x60,  # max code bits; reserved bits 0
    "lz4": lambda b: b >> 6 == 1,  # frame descriptor: version 01
    "lzip": lambda b: b == 1,  # version 1
}


def _zstd_decompressor() -> Any:
    import pyzstd  # bz2/lzma-style API: bounded output (max_length), eof, needs_input

    return pyzstd.ZstdDecompressor()


def _bz2_decompressor() -> Any:
    import bz2

    return bz2.BZ2Decompressor()


def _xz_decompressor() -> Any:
    import lzma

    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ)


_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "zstd": _zstd_decompressor,
    "bz2": _bz2_decompressor,
    "xz": _xz_decompressor,
}


class DecompressingReader:
    """A file-like ``read(n)`` over a compressed stream, raising on damage or a missing end.

    ``prefix`` holds bytes already read from ``raw`` (used for magic detection).
    """

    def __init__(self, raw: Readable, kind: str, prefix: bytes = b"", url: str | None = None) -> None:
        self.raw = raw
        self.kind = kind
        self.url = url
        self._new = _DECOMPRESSORS[kind]
        self._dec = self._new()
        self._started = False  # the current decompressor has been fed something
        self._input = prefix  # compressed bytes not yet fed
        self._out = b""
        self._outpos = 0
        self._raw_eof = False
        self._eof = False
        self._consumed = len(prefix)  # compressed bytes taken from raw, for error offsets

    def _fail(self, what: str) -> CompressionError:
        return CompressionError(f"{self.kind}: {what} at byte {self._consumed} of the compressed stream", self.url)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts: list[bytes] = []
            while True:
                chunk = self.read(1 << 20)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        if self._outpos >= len(self._out):
            self._out = b""
            self._outpos = 0
            self._fill_nonempty()
        start = self._outpos
        end = min(start + n, len(self._out))
        self._outpos = end
        if start == 0 and end == len(self._out):
            return self._out
        return self._out[start:end]

    def _fill_nonempty(self) -> None:
        while not self._out and not self._eof:
            self._fill_step()

    def _fill_step(self) -> None:
        """One feeding step; sets ``self._out`` when output is produced."""
        if not self._input and not self._raw_eof:
            self._input = self.raw.read(_FEED)
            self._consumed += len(self._input)
            if not self._input:
                self._raw_eof = True
        dec = self._dec
        if not self._input:
            # bz2/xz/zstd may still hold output when the limit stopped them
            if self.kind != "gzip" and self._started and not dec.eof and not dec.needs_input:
                self._out = self._decompress(b"")
                return
            if self._started and not dec.eof:
                raise self._fail("compressed stream is truncated (missing its end)")
            self._eof = True
            return
        if dec.eof:
            if self.kind in ("gzip", "xz"):
                # gzip and xz allow zero padding after a member/stream
                self._input = self._input.lstrip(b"\x00")
                if not self._input:
                    return
            self._dec = self._new()
            self._started = False
        data, self._input = self._input, b""
        self._started = True
        self._out = self._decompress(data)

    def _decompress(self, data: bytes) -> bytes:
        dec = self._dec
        try:
            out = dec.decompress(data, _MAX_OUT)
        except Exception as e:  # zlib.error, OSError, LZMAError, EOFError, pyzstd.ZstdError
            raise self._fail(f"corrupt compressed data ({e})") from None
        tail = getattr(dec, "unconsumed_tail", b"")
        if tail:
            self._input = tail + self._input
        if dec.eof and dec.unused_data:
            self._input = dec.unused_data + self._input
        return bytes(out)


def compression_for_name(name: str) -> str | None:
    """Compression chosen by an output name's suffix: .tgz/.tar.gz, .tar.zst, .tar.xz, .tar.bz2."""
    lower = name.lower()
    if lower.endswith((".tgz", ".gz")):
        return "gzip"
    if lower.endswith((".zst", ".zstd", ".tzst")):
        return "zstd"
    if lower.endswith((".xz", ".txz")):
        return "xz"
    if lower.endswith((".bz2", ".tbz2", ".tbz")):
        return "bz2"
    return None


def _compressor(kind: str, level: int | None) -> Any:
    if kind == "gzip":
        # wbits 31 writes a gzip header with mtime 0 and no file name: byte-identical output
        return zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)
    if kind == "zstd":
        import pyzstd

        return pyzstd.ZstdCompressor(3 if level is None else level)
    if kind == "xz":
        import lzma

        return lzma.LZMACompressor(format=lzma.FORMAT_XZ, preset=6 if level is None else level)
    if kind == "bz2":
        import bz2

        return bz2.BZ2Compressor(9 if level is None else level)
    raise ValueError(f"unknown compression {kind!r}")


class CompressingWriter:
    """Write-through compressor: ``write`` compresses into ``raw``, ``finish`` writes the end."""

    def __init__(self, raw: IO[bytes] | Any, kind: str, level: int | None = None) -> None:
        self.raw = raw
        self.kind = kind
        self._comp = _compressor(kind, level)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        out = self._comp.compress(data)
        if out:
            self.raw.write(out)
        return len(data)

    def finish(self) -> None:
        out = self._comp.flush()
        if out:
            self.raw.write(out)
