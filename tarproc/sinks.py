"""Sinks: where tar streams are written, atomically.

``open_sink(url)`` returns a ``Sink``: ``write`` bytes, then ``commit()`` to publish or ``abort()``
to throw everything away. Nothing partial ever appears under the final name:

- local paths are written as ``.NAME.tmp-XXXX`` in the same directory and renamed on commit
  (existing devices and FIFOs such as ``/dev/null`` are written directly: nothing to rename);
- fsspec URLs (``s3://``, ``gs://``, ``memory://``...) are written to a local temporary file and
  uploaded only on commit;
- ``-`` is stdout (refused when it is a terminal unless ``force``);
- ``pipe:CMD`` feeds a shell command's stdin; on commit its exit status is checked (141, SIGPIPE,
  is not an error). A pipe can't be atomic: what the command does with partial input is its own.

Compression is chosen from the name: ``.tgz``/``.tar.gz``, ``.tar.zst``, ``.tar.xz``, ``.tar.bz2``.
Used as a context manager a sink commits on success and aborts on any exception (Ctrl-C too).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from collections.abc import Iterable
from typing import IO, Any

from .compression import CompressingWriter, compression_for_name
from .errors import OptionError, SinkError
from .procgroup import start_group, stop_group
from .sources import enlarge_pipe, is_fsspec_url, local_path

# temporaries created by this process and not yet committed or aborted; removed on exit paths
_LIVE_TEMPS: set[str] = set()


def stdout_is_terminal() -> bool:
    """True when stdout is a terminal (tests monkeypatch this)."""
    try:
        return os.isatty(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return False


class Sink:
    """A byte sink with ``write``, ``commit`` and ``abort``; counts bytes and their sha256."""

    _writev = False  # whether write_pieces may use os.writev on the file's descriptor (see _start)
    _sendfile = True  # whether write_range may use os.sendfile there (until the destination refuses it)

    def __init__(self, url: str, compression: str | None = None, level: int | None = None, digest: bool = False):
        self.url = url
        self.bytes = 0  # bytes written to the destination (after compression)
        self._digest = digest
        self._sha: _Hasher | _FileHasher | None = None  # made by _start, which knows the destination
        self._fh: Any = None
        self._writer: Any = None  # either the counting raw writer or a compressor over it
        self.compression = compression
        self._level = level
        self.done = False

    def _start(self, fh: Any, readable: int | None = None) -> None:
        """Write to ``fh``. ``readable``: its descriptor, where what is written can be read back
        (a temporary file): sha256 is then computed from there (``_FileHasher``)."""
        self._fh = fh
        counted = _Counting(self)
        self._writer = CompressingWriter(counted, self.compression, self._level) if self.compression else counted
        self._fd: int | None = None  # for write_pieces: the descriptor written to, when writev may be used
        if self._writev and not self.compression:
            try:
                self._fd = fh.fileno()
            except (AttributeError, OSError, ValueError):  # not a real file (a BytesIO in tests)
                self._fd = None
        if self._digest:  # last: nothing after it can fail and leave its thread running
            self._sha = _FileHasher(readable, self.url) if readable is not None else _Hasher()

    @property
    def sha256(self) -> str | None:
        return self._sha.hexdigest() if self._sha is not None else None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._writer.write(data)  # type: ignore[no-any-return]

    def write_pieces(self, pieces: list[bytes | bytearray | memoryview]) -> None:
        """Write byte strings in order, as one ``writev`` system call where the destination is a
        file descriptor and nothing compresses (``TarWriter``: the headers gathered so far, then a
        big member's data, without joining them), else as one ``write`` each."""
        fd = self._fd
        if fd is None:
            for piece in pieces:
                self.write(piece)
            return
        try:
            self._fh.flush()  # stdout's buffered writer: what it holds goes first
            total = sum(len(piece) for piece in pieces)
            written = os.writev(fd, pieces)
            while written < total:  # a partial write (a signal came): the rest
                rest, skip = [], written
                for piece in pieces:
                    if skip >= len(piece):
                        skip -= len(piece)
                    else:
                        rest.append(memoryview(piece)[skip:])
                        skip = 0
                written += os.writev(fd, rest)
        except OSError as e:
            raise self._failed(e) from None
        self._wrote(pieces)

    def write_range(self, data: Any) -> None:
        """Write member data left in a local file (``tar.FileRange``): where the destination is a
        file descriptor and nothing compresses (nor hashes, but from the file written), the kernel
        copies it (``os.sendfile``: file to file, pipe or socket, never through this process); else
        it is read and written."""
        fd = self._fd
        if fd is None or not self._sendfile or (self._sha is not None and self._sha.needs_bytes):
            self.write(data.read())
            return
        src, at, end = data.fileno(), data.offset, data.offset + data.size
        try:
            self._fh.flush()  # stdout's buffered writer: what it holds goes first
            while at < end:
                sent = os.sendfile(fd, src, at, min(end - at, 1 << 30))
                if not sent:
                    raise data.shrank(at)
                at += sent
        except OSError as e:
            if at != data.offset or isinstance(e, BrokenPipeError):
                raise self._failed(e) from None
            # nothing sent: a destination sendfile can't write to (a file opened to append, or any
            # but a socket on some systems) is read and written from now on; a real write error
            # is raised by that write
            self._sendfile = False
            self._raw_write(data.read())
            return
        self._wrote((data,))

    def _raw_write(self, data: bytes | bytearray | memoryview) -> None:
        # files are unbuffered (TarWriter gathers small writes itself); a raw write may be partial
        try:
            written = self._fh.write(data)
            if written is not None and written < len(data):
                view = memoryview(data)
                while written < len(view):
                    written += self._fh.write(view[written:])
        except OSError as e:
            raise self._failed(e) from None
        self._wrote((data,))

    def _failed(self, e: OSError) -> OSError | SinkError:
        """What to raise for a failed write: a ``SinkError`` naming the destination -- but a reader
        that went away (``BrokenPipeError``) as it is, left to the caller, which ends quietly or
        names the command."""
        if isinstance(e, BrokenPipeError):
            return e
        return SinkError(f"write failed: {e.strerror or e}", self.url)

    def _wrote(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        """Count what went out, and hash it."""
        for piece in pieces:
            self.bytes += len(piece)
        if self._sha is not None:
            self._sha.wrote(pieces, self.bytes)

    def _close_quietly(self) -> None:
        """Close the destination on the way out of an error; a second error would hide the first."""
        if self._sha is not None:
            self._sha.stop()  # no digest of what is given up
        try:
            self._fh.close()
        except Exception:
            pass

    def _finish_stream(self) -> None:
        """Write what a compressor holds, and finish the sha256: before anything is published, so
        that a digest that can't be made stops the commit."""
        if isinstance(self._writer, CompressingWriter):
            self._writer.finish()
        if self._sha is not None:
            self._sha.hexdigest()

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Give up: nothing is left under the final name (the subclass's ``_abort``), and the
        sha256 thread, if any, is told to stop."""
        try:
            self._abort()
        finally:
            if self._sha is not None:
                self._sha.stop()

    def _abort(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class _Hasher:
    """sha256 of the bytes written (to a destination that can't be read back: stdout, a pipe),
    computed in a thread of its own: hashlib releases the GIL on
    big buffers, so hashing runs beside the writing instead of in its path. ``update`` takes bytes
    and read-only views of bytes as they are (immutable: the thread reads them later); anything
    else (a writer's reused buffer) is copied first."""

    needs_bytes = True
    _END = None

    def __init__(self) -> None:
        import hashlib  # hashlib, subprocess and tempfile are imported where used: commands start without them
        import threading

        from .handoff import Handoff

        self._sha = hashlib.sha256()
        self._queue: Handoff[bytes | memoryview | None] = Handoff(32)  # bounded: memory stays small (see handoff)
        self._thread = threading.Thread(target=self._run, name="tarproc-sha256", daemon=True)
        self._thread.start()
        self._digest: str | None = None

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            self._sha.update(data)

    def wrote(self, pieces: Iterable[bytes | bytearray | memoryview], total: int) -> None:
        """What one write wrote (``total``: the bytes written so far, this write's included)."""
        for piece in pieces:
            self.update(piece)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if type(data) is memoryview and type(data.obj) is bytes:
            data = memoryview(data)  # its own view: the caller may release theirs
        elif type(data) is not bytes:
            data = bytes(data)
        self._queue.put(data)

    def stop(self) -> None:
        """End the thread without a digest (the sink was aborted)."""
        if self._digest is None:
            self._digest = ""
            self._queue.put(self._END)

    def hexdigest(self) -> str:
        if self._digest is None:
            self._queue.put(self._END)
            self._thread.join()
            self._digest = self._sha.hexdigest()
        return self._digest


class _FileHasher:
    """sha256 of a file as it is written, computed in a thread of its own that reads back what was
    written (from the page cache, with ``pread`` into one reused buffer, hashed while it is in the
    CPU's cache) up to the byte count it is told (``_BATCH`` at a time). Hashing the file itself, the
    digest is that of the bytes written whichever way they went in: data can go file to file in
    the kernel (``sendfile``) and still be hashed, and the writer's thread hands over only counts.
    The thread has a descriptor of its own (``dup``), closed when it ends."""

    needs_bytes = False
    _END = -1
    _BUFFER = 256 << 10  # read back in pieces that stay in the CPU's cache until hashed
    # the writer tells the count once this much more is written: the thread then reads back a MiB
    # at a time, woken (and taking the GIL) once a MiB instead of once a member: 9 % faster here
    _BATCH = 1 << 20

    def __init__(self, fd: int, url: str) -> None:
        import hashlib
        import queue
        import threading

        try:
            self._fd, self._url = os.dup(fd), url
        except OSError as e:
            raise SinkError(f"cannot open the file again to hash it: {e.strerror}", url) from None
        self._stopped = False
        self._sha = hashlib.sha256()
        self._written = 0  # bytes the writer has written (its sink's count, as last told)
        self._told = 0  # the last count told to the thread
        self._counts: queue.SimpleQueue[int] = queue.SimpleQueue()  # C, no Python-level locks
        self._error: OSError | None = None
        self._hashed = 0
        self._thread = threading.Thread(target=self._run, name="tarproc-sha256", daemon=True)
        self._thread.start()
        self._digest: str | None = None

    def _run(self) -> None:
        buf = memoryview(bytearray(self._BUFFER))
        get, update, fd = self._counts.get, self._sha.update, self._fd
        preadv = getattr(os, "preadv", None)
        try:
            while (upto := get()) != self._END:
                while self._hashed < upto and self._error is None and not self._stopped:
                    want = min(self._BUFFER, upto - self._hashed)
                    try:
                        if preadv is not None:  # into the reused buffer
                            n = preadv(fd, [buf[:want]], self._hashed)
                        else:  # where there is no preadv
                            piece = os.pread(fd, want, self._hashed)
                            n = len(piece)
                            buf[:n] = piece
                    except OSError as e:
                        self._error = e
                        break
                    if not n:  # shorter than what was written: something cut the file
                        self._error = OSError(0, f"the file ends at byte {self._hashed}, before the "
                                                 f"{upto} bytes written")
                        break
                    update(buf[:n])
                    self._hashed += n
        finally:
            os.close(fd)

    def wrote(self, pieces: Iterable[Any], total: int) -> None:
        """What one write wrote: only ``total``, the bytes written so far (the sink's count), matters."""
        self._written = total
        if total - self._told >= self._BATCH:
            self._told = self._written
            self._counts.put(self._written)

    def stop(self) -> None:
        """End the thread without a digest (the sink was aborted), without reading on."""
        if self._digest is None:
            self._digest = ""
            self._stopped = True
            self._counts.put(self._END)

    def hexdigest(self) -> str:
        if self._digest is None:
            if self._told != self._written:
                self._counts.put(self._written)
            self._counts.put(self._END)
            self._thread.join()
            if self._error is not None or self._hashed != self._written:
                self._digest = ""
                why = self._error.strerror if self._error is not None else "not all of it was read"
                raise SinkError(f"cannot read back what was written, for its sha256: {why}", self._url)
            self._digest = self._sha.hexdigest()
        return self._digest


class _Counting:
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.sink._raw_write(data)
        return len(data)


class StdoutSink(Sink):
    """``-``: stdout (or ``stream``), refused when it is a terminal unless ``force``."""

    _writev = True

    def __init__(self, *, force: bool = False, stream: IO[bytes] | None = None, **kw: Any):
        super().__init__("-", **kw)
        if stream is None:
            if not force and stdout_is_terminal():
                raise SinkError("refusing to write a tar stream to a terminal; redirect it or use --force", "stdout")
            stream = sys.stdout.buffer
            enlarge_pipe(stream)
        self._start(stream)

    def commit(self) -> None:
        if self.done:
            return
        self.done = True
        self._finish_stream()
        self._fh.flush()

    def _abort(self) -> None:
        self.done = True
        try:
            self._fh.flush()
        except (OSError, ValueError):
            pass


class _TempFileSink(Sink):
    """Written to a local temporary file, published by ``_publish`` on commit, removed on abort."""

    _writev = True

    def _open_temp(self, **mkstemp_args: Any) -> None:
        import tempfile

        try:
            fd, self.tmp = tempfile.mkstemp(**mkstemp_args)
        except OSError as e:
            raise SinkError(f"cannot create a file there: {e.strerror}", self.url) from None
        _LIVE_TEMPS.add(self.tmp)
        try:
            self._start(os.fdopen(fd, "wb", buffering=0), readable=fd)  # mkstemp opens it to read and write
        except BaseException:
            self.done = True
            if self._fh is None:  # not even wrapped
                os.close(fd)
            self._close_quietly()
            _remove(self.tmp)
            raise

    def _publish(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        if self.done:
            return
        try:
            self._finish_stream()
            self._fh.close()
            self._publish()
        except BaseException as e:
            self.abort()
            if isinstance(e, Exception) and not isinstance(e, SinkError):
                detail = e.strerror if isinstance(e, OSError) and e.strerror else e
                raise SinkError(f"cannot finish writing: {detail}", self.url) from None
            raise
        self.done = True
        _remove(self.tmp)  # gone already after a rename

    def _abort(self) -> None:
        if self.done:
            return
        self.done = True
        self._close_quietly()
        _remove(self.tmp)


class LocalSink(_TempFileSink):
    """A local file written under a temporary name in the same directory, renamed on commit."""

    def __init__(self, url: str, path: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(directory):
            raise SinkError(f"directory {directory} does not exist", url)
        try:
            # replacing a file keeps its permission bits; a new one gets the umask's
            self.mode = stat.S_IMODE(os.stat(path).st_mode)
            if not os.access(path, os.W_OK):
                raise SinkError("permission denied (the file is not writable)", url)
        except FileNotFoundError:
            self.mode = 0o666 & ~_umask()
        self._open_temp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)

    def _publish(self) -> None:
        os.chmod(self.tmp, self.mode)
        os.replace(self.tmp, self.path)


class UploadSink(_TempFileSink):
    """An fsspec URL: written to a local temporary file, uploaded only when complete."""

    def __init__(self, url: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        try:
            import fsspec

            self.fs, self.remote_path = fsspec.core.url_to_fs(url)
        except ImportError as e:
            raise SinkError(f"no filesystem for this URL ({e})", url) from None
        except Exception as e:
            raise SinkError(f"cannot open: {e}", url) from None
        self._open_temp(prefix="tarproc-upload-", suffix=".tmp")

    def _publish(self) -> None:
        try:
            self.fs.put_file(self.tmp, self.remote_path)
        except Exception as e:
            raise SinkError(f"upload failed: {e}", self.url) from None


class DeviceSink(Sink):
    """An existing non-regular file (``/dev/null``, a FIFO, a terminal device): written directly.

    Renaming a temporary over a device node would replace it, so there is nothing atomic to do.
    """

    _writev = True

    def __init__(self, url: str, path: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        try:
            fh = open(path, "wb", buffering=0)
        except OSError as e:
            raise SinkError(f"cannot open for writing: {e.strerror}", url) from None
        self._start(fh)

    def commit(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self._finish_stream()
            self._fh.close()
        except OSError as e:
            raise SinkError(f"cannot finish writing: {e.strerror or e}", self.url) from None

    def _abort(self) -> None:
        self.done = True
        self._close_quietly()


class PipeSink(Sink):
    """``pipe:CMD``: the tar stream goes to the command's stdin."""

    def __init__(self, url: str, **kw: Any) -> None:
        super().__init__(url, **kw)
        cmd = url[len("pipe:") :]
        if not cmd.strip():
            raise OptionError("pipe: needs a command, e.g. 'pipe:gsutil cp - gs://bucket/x.tar'")
        import subprocess

        self.proc = start_group(cmd, shell=True, stdin=subprocess.PIPE)
        self._start(self.proc.stdin)

    def commit(self) -> None:
        if self.done:
            return
        try:
            self._finish_stream()
            self._fh.close()
        except BrokenPipeError:
            self._stopped_reading()
        self.done = True
        status = self.proc.wait()
        if status not in (0, 141, -signal.SIGPIPE):
            raise SinkError(f"command exited with status {status}", self.url)

    def _stopped_reading(self) -> None:
        """The command closed its input before reading all of it: name its exit status."""
        self.done = True
        self._close_quietly()
        status = self.proc.wait()
        raise SinkError(f"command exited with status {status} before reading all its input", self.url)

    def _abort(self) -> None:
        if self.done:
            return
        self.done = True
        self._close_quietly()
        stop_group(self.proc)

    def _raw_write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            super()._raw_write(data)
        except BrokenPipeError:
            self._stopped_reading()


def open_sink(
    url: str,
    *,
    force: bool = False,
    compression: str | None = "auto",
    level: int | None = None,
    digest: bool = False,
) -> Sink:
    """Open an output URL. ``compression="auto"`` picks it from the name's suffix.

    Use as a context manager: commit on success, abort (nothing left behind) on error.
    """
    if compression == "auto":
        compression = None if url == "-" or url.startswith("pipe:") else compression_for_name(url)
    kw: dict[str, Any] = {"compression": compression, "level": level, "digest": digest}
    if url == "-":
        return StdoutSink(force=force, **kw)
    if url.startswith("pipe:"):
        return PipeSink(url, **kw)
    path = local_path(url)
    if path is not None:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as e:
            raise SinkError(f"cannot write there: {e.strerror}", url) from None
        if mode is not None and stat.S_ISDIR(mode):
            raise SinkError("is a directory", url)
        if mode is not None and not stat.S_ISREG(mode):
            return DeviceSink(url, path, **kw)
        # through a symlink, replace the file it points to, not the link itself
        return LocalSink(url, os.path.realpath(path), **kw)
    if is_fsspec_url(url):
        return UploadSink(url, **kw)
    raise SinkError("unsupported output URL", url)  # pragma: no cover


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    _LIVE_TEMPS.discard(path)


def remove_live_temporaries() -> None:
    """Remove every temporary this process still holds (called on fatal exits)."""
    for path in list(_LIVE_TEMPS):
        _remove(path)


def write_atomically(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` under a temporary name, then rename it into place: a reader
    (or a restart after a crash) sees the old file or the new one, never a part."""
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    except OSError as e:
        raise SinkError(f"cannot create a file there: {e.strerror}", path) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise SinkError(f"cannot write: {e.strerror}", path) from None
        raise
