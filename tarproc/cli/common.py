"""What every command shares: option bundles, progress, and the one error/exit-status boundary.

Exit statuses: 0 ok, 1 data error (``COMMAND: error: MESSAGE`` on one line), 2 usage error,
130 Ctrl-C, 143 SIGTERM, 129 SIGHUP, 141 when the reader of stdout went away (``| head``), quietly.
``--traceback`` shows the Python traceback of an error for debugging.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from .. import __version__
from ..errors import OptionError, TarprocError
from ..fieldspec import SPEC_HELP
from ..samples import DUP_POLICIES, ON_ERROR_POLICIES, Sample, read_samples
from ..shards import parse_size
from ..sinks import open_sink, remove_live_temporaries
from ..sniff import escape_text
from ..sources import Network, configure, expand_urls, local_path
from ..sources.remote import DEFAULT_MIN_SPEED, DEFAULT_PREFETCH, DEFAULT_RETRIES, DEFAULT_SPEED_TIME, DEFAULT_TIMEOUT
from ..tar import DEFAULT_MAX_MEMBER_SIZE, LINK_POLICIES, ReadPolicy, ReadStats, TarWriter
from .vocabulary import DEPRECATED, Deprecation

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Terminated(BaseException):
    """Raised from the SIGTERM/SIGHUP handler so that cleanup runs as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Interrupted(BaseException):
    """Ctrl-C, carried past click (which would print a blank line and raise Abort)."""


class _ReaderGone(Exception):
    """Our stdout's reader went away, carried past click (which would exit 1)."""


def _on_signal(signum: int, frame: Any) -> None:
    raise Terminated(signum)


# a closed terminal or ssh session (SIGHUP) and a 'kill' or Kubernetes stop (SIGTERM)
_CLEANUP_SIGNALS = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s]


class TarprocCommand(click.Command):
    """A click command whose ``main`` is the single place that maps errors to messages and exits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        super().__init__(*args, **kwargs)
        self.params += _deprecated_params(self.name or "", self.params)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _refuse_repeated_options(self, args)
        rest = super().parse_args(ctx, args)
        _apply_deprecations(self, ctx)
        return rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None
        except BrokenPipeError:
            raise _ReaderGone() from None

    def main(self, args: Any = None, prog_name: str | None = None, **extra: Any) -> Any:  # type: ignore[override]
        if args is None:
            # this process is the command (a console script, python -m, bin/): what importing made
            # lives as long as it does, so the collector need not walk it again at each collection
            # (6-10 ms of tarindex's 70 on a 1 GB shard); a test's CliRunner, which passes args,
            # keeps its process as it is
            gc.freeze()
        argv = list(sys.argv[1:] if args is None else args)
        prog = prog_name or self.name or "tarproc"
        show_traceback = "--traceback" in argv
        _PROG[:] = [prog]  # for warn()
        status = 0
        previous: dict[int, Any] = {}
        try:
            if threading.current_thread() is threading.main_thread():
                previous = {s: signal.signal(s, _on_signal) for s in _CLEANUP_SIGNALS}
            with _warnings_as_lines():
                super().main(args=argv, prog_name=prog, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            status = e.exit_code
        except click.UsageError as e:
            e.show()
            status = 2
        except click.ClickException as e:
            e.show()
            status = e.exit_code
        except (KeyboardInterrupt, _Interrupted, click.Abort):
            remove_live_temporaries()
            say(f"{prog}: interrupted")
            status = 130
        except Terminated as e:
            remove_live_temporaries()
            say(f"{prog}: terminated")
            status = 128 + e.signum
        except (BrokenPipeError, _ReaderGone):
            # the reader of our stdout went away (e.g. '| head -c 100'): end quietly, like cat
            remove_live_temporaries()
            _silence_stdout()
            status = 141
        except OptionError as e:
            if show_traceback:
                import traceback  # only for --traceback: the commands start without it

                traceback.print_exc()
            say(f"{prog}: error: {e}\nTry '{prog} --help' for help.")
            status = 2
        except TarprocError as e:
            remove_live_temporaries()
            if show_traceback:
                import traceback

                traceback.print_exc()
            say(f"{prog}: error: {e}")
            status = 1
        except Exception as e:
            remove_live_temporaries()
            if show_traceback:
                import traceback

                traceback.print_exc()
            detail = str(e).splitlines()[0] if str(e) else ""
            say(f"{prog}: error: internal error: {type(e).__name__}: {detail} (run with --traceback for details)")
            status = 1
        finally:
            _PROG.clear()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        sys.exit(status)


class DeprecatedOption(click.Option):
    """An old spelling of an option, hidden from --help: its value goes to the option it became
    (``deprecation.new``), with one warning line. Made by ``TarprocCommand`` from ``DEPRECATED``."""

    def __init__(self, deprecation: Deprecation, target: click.Option) -> None:
        attrs: dict[str, Any] = {"hidden": True, "help": f"Deprecated: use {deprecation.new}."}
        if target.is_flag:
            attrs["is_flag"] = True
        else:
            attrs.update(type=target.type, multiple=target.multiple, nargs=target.nargs, metavar=target.metavar)
        super().__init__([deprecation.old, f"deprecated_{target.name}"], **attrs)
        self.deprecation = deprecation
        self.target = target


def _deprecated_params(command: str, params: list[click.Parameter]) -> list[click.Parameter]:
    """The hidden options that keep ``command``'s old spellings (``DEPRECATED``) working."""
    by_flag = {opt: p for p in params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
    made: list[click.Parameter] = []
    for deprecation in DEPRECATED.get(command, []):
        target = by_flag.get(deprecation.new)
        if target is None:
            raise LookupError(f"{command}: {deprecation.old} is deprecated for {deprecation.new}, which it lacks")
        made.append(DeprecatedOption(deprecation, target))
    return made


def _apply_deprecations(command: click.Command, ctx: click.Context) -> None:
    """Give each old spelling's value to the option it became, saying so once on stderr."""
    from click.core import ParameterSource

    for param in command.params:
        if not isinstance(param, DeprecatedOption) or param.name is None:
            continue
        value = ctx.params.pop(param.name, None)
        if ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        old, new = param.deprecation.old, param.deprecation.new
        if ctx.get_parameter_source(param.target.name or "") is ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{old} is the old spelling of {new}: give {new} alone")
        ctx.params[param.target.name or ""] = value
        warn(param.deprecation.message())


def shared_option(*param_decls: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` for a flag of the shared vocabulary (``vocabulary.VOCABULARY``): the flag
    means there what it means in every command; ``help`` may say more about this command's use."""

    def decorate(f: F) -> F:
        f = click.option(*param_decls, **attrs)(f)
        f.__click_params__[-1].vocabulary = True  # type: ignore[attr-defined]
        return f

    return decorate


def _refuse_repeated_options(command: click.Command, args: list[str]) -> None:
    """A usage error when an option that takes one value is given twice (click would keep the last
    silently: ``tarcat -c 5 -c 10``). Options declared ``multiple`` and flags may repeat."""
    takes_value: dict[str, click.Option] = {}
    for param in command.params:
        if isinstance(param, click.Option) and not param.is_flag and not param.count:
            for opt in param.opts + param.secondary_opts:
                takes_value[opt] = param
    given: set[str] = set()  # the names of the single-value options seen
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            continue
        option, attached = token, False
        if token.startswith("--") and "=" in token:
            option, attached = token.split("=", 1)[0], True
        elif not token.startswith("--") and len(token) > 2 and token[:2] in takes_value:
            option, attached = token[:2], True  # -c5: a short option with its value attached
        param = takes_value.get(option)
        if param is None:
            continue
        if not attached:
            i += param.nargs  # skip the value, whatever it looks like
        if param.multiple:
            continue
        if param.name in given:
            raise click.UsageError(f"option {option} is given more than once (it takes one value, and the last "
                                   "would win without a word)")
        given.add(param.name or option)


def say(message: str) -> None:
    """Write a diagnostic line (or lines) to stderr, never stdout (stdout carries tar data).

    Names in messages come from the data: control characters are escaped, so that no terminal
    sequence hidden in a key or a file name reaches the terminal.
    """
    message = "\n".join(escape_text(line) for line in message.split("\n"))
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush can't raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


_PROG: list[str] = []  # the running command's name


def warn(message: str) -> None:
    """A warning on stderr (see ``say``), named like errors: ``tarcat: warning: ...``."""
    say(f"{_PROG[0]}: warning: {message}" if _PROG else f"warning: {message}")


class _WarningLines:
    """A ``warnings.showwarning`` that prints each ``tarproc.TarprocWarning`` as one line,
    ``PROG: warning: MESSAGE``, and shows other warnings as ``shown`` does. A class, not a closure:
    it pickles, so a worker process started by spawn shows warnings alike (``errors.warnings_setup``)."""

    def __init__(self, prog: str | None, shown: Any = None) -> None:
        self.prog, self.shown = prog, shown

    def __reduce__(self) -> tuple[Any, ...]:
        # the other warnings' display stays behind (the stdlib's own no longer pickles once replaced):
        # a worker shows them as Python does
        return type(self), (self.prog,)

    def __call__(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
        import warnings

        from ..errors import TarprocWarning

        if issubclass(category, TarprocWarning):
            say(f"{self.prog}: warning: {message}" if self.prog else f"warning: {message}")
        elif self.shown is not None:
            self.shown(message, category, filename, lineno, file, line)
        else:  # as Python's own warnings.showwarning
            with contextlib.suppress(OSError, AttributeError):
                (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """For a command's run: each warning of the core (a ``tarproc.TarprocWarning``, given through
    ``warnings.warn``) printed as ``warn`` prints, one line, every time; other warnings shown as
    Python shows them. The process's filters and ``warnings.showwarning`` are restored after.
    Worker processes forked meanwhile inherit this; the library hands it to spawned ones."""
    import warnings

    from ..errors import TarprocWarning

    with warnings.catch_warnings():
        warnings.simplefilter("always", TarprocWarning)
        warnings.showwarning = _WarningLines(_PROG[0] if _PROG else None, warnings.showwarning)
        yield


# ---------------------------------------------------------------------------------------------
# option bundles


MAX_PROCESSES = 4096  # -p, -j and the like
MAX_C_INT = 2**31 - 1  # what libzmq's options take


class Finite(click.FloatRange):
    """``click.FloatRange`` without nan and infinity (which pass its comparisons, then mean nothing)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class _Number(click.IntRange):
    def _describe_range(self) -> str:
        return f"x>={self.min}" if self.max == sys.maxsize else super()._describe_range()


def number(low: int = 0, high: int = sys.maxsize) -> click.IntRange:
    """An integer option's type, bounded: past ``sys.maxsize`` no count, index or buffer means
    anything, and a bigger number is a usage error here, not an internal one later (the help
    shows the bound only where it is smaller)."""
    return _Number(min=low, max=high)


class SizeParam(click.ParamType):
    name = "SIZE"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except OptionError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeParam()


@dataclass
class ReadOptions:
    """What ``input_options`` collects: the inputs and how to read them."""

    urls: list[str]
    on_error: str
    dup: str
    max_member_size: int
    links: str = "follow"
    ignore_zeros: bool = False
    network: Network | None = None  # how remote inputs are read (also this process's default)

    @property
    def policy(self) -> ReadPolicy:
        """The read policy these options give, for every reader (``read_samples(policy=...)``)."""
        return ReadPolicy(self.dup, self.max_member_size, self.links, self.ignore_zeros, self.on_error)

    @property
    def tar(self) -> dict[str, Any]:
        """How to read each tar stream: the keyword arguments of ``iter_members`` and ``read_samples``."""
        return {"max_member_size": self.max_member_size, "links": self.links, "ignore_zeros": self.ignore_zeros}

    def samples(self, stats: ReadStats, *, views: bool = False) -> Iterator[Sample]:
        """The samples of all inputs, reading as the options say (warnings through ``warnings``,
        which the command prints as lines); ``views``
        for a command that writes each sample out before reading the next: big values may then be
        views of what was read or data left in a local file (``read_samples``'s views and refs)."""
        return read_samples(self.urls, policy=self.policy, stats=stats, views=views, refs=views,
                            network=self.network)

    def total_samples(self) -> int | None:
        """How many samples the inputs hold, for a progress bar's total and ETA, where that is known
        without reading them: local shards, each counted from its index or a walk of its headers
        (~25 ms a GB, cached as the Dataset's counts); None for anything else (stdin, pipe:, remote)."""
        if not self.urls or any(local_path(url) is None for url in self.urls):
            return None
        from ..dataset.counts import shard_counts

        counts = shard_counts(self.urls, "auto", warn=lambda message: None).counts
        return None if counts is None else sum(counts[url] for url in self.urls)


@dataclass
class WriteOptions:
    """What ``writer_options`` collects: ``tar`` holds the TarWriter keyword arguments."""

    force: bool
    tar: dict[str, Any]


def _bundle(  # type: ignore[no-untyped-def]
    make_options: Callable[[], list[Callable[[Any], Any]]], collect: Callable[[dict[str, Any]], dict[str, Any]]
):
    """A decorator adding options to a command; ``collect`` turns their values into arguments.

    ``make_options`` builds fresh option decorators for each command: click's version option, for
    one, remembers the first program name it printed.
    """

    def decorate(f: F) -> F:
        options = make_options()
        names = [p.name for p in _params(options) if p.expose_value]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            kwargs.update(collect(values))
            return f(*args, **kwargs)

        before = len(getattr(wrapper, "__click_params__", []))
        for option in reversed(options):
            wrapper = option(wrapper)
        for param in wrapper.__click_params__[before:]:  # type: ignore[attr-defined]
            param.vocabulary = True  # type: ignore[attr-defined]  # declared once: the shared meaning
        return wrapper  # type: ignore[return-value]

    return decorate


def _params(options: list[Callable[[Any], Any]]) -> list[click.Parameter]:
    """The click parameters a list of option decorators declares."""

    def probe() -> None: ...

    for option in options:
        option(probe)
    return list(getattr(probe, "__click_params__", []))


def _input_params(
    on_error: Iterable[str], on_error_help: str, on_error_flag: str = "--on-error", read_ahead: bool = True,
    timeout_flag: str = "--timeout",
) -> list[Callable[[Any], Any]]:
    return [
        click.argument("inputs", nargs=-1, metavar="[INPUTS]..."),
        click.option("-T", "--files-from", "list_files", multiple=True, metavar="FILE",
                     help="Read input URLs from FILE, one per line ('-' = stdin)."),
        click.option(on_error_flag, "input_on_error", type=click.Choice(list(on_error)), default="fail", show_default=True,
                     help=on_error_help),
        click.option("--dup", type=click.Choice(DUP_POLICIES), default="error", show_default=True,
                     help="A duplicate field or a key that reappears later in a shard: error, warn and drop, or drop."),
        click.option("--max-member-size", type=SIZE, default=DEFAULT_MAX_MEMBER_SIZE, show_default="2GiB",
                     help="Largest member accepted; a bigger one is an error naming it."),
        click.option("--links", type=click.Choice(LINK_POLICIES), default="follow", show_default=True,
                     help="Hard and symbolic links to an earlier member: read as that member's bytes (as tar -x "
                          "extracts them). A hard link that can't be had is an error; a symbolic one (dangling, to a "
                          "directory or a later member) is left out, said and counted; strict: an error too. skip: "
                          "skip all links (counted in --stats)."),
        click.option("-i", "--ignore-zeros", is_flag=True,
                     help="Read on past end-of-archive blocks (as GNU tar -i): concatenated archives are read whole."),
        *network_params(read_ahead, timeout_flag),
    ]


def network_params(read_ahead: bool = True, timeout_flag: str = "--timeout") -> list[Callable[[Any], Any]]:
    """How remote inputs are read: retries, timeout (``timeout_flag``: tarproc's --timeout keeps its
    old meaning until 1.1), the speed floor, read-ahead (``read_ahead``: a --prefetch, for the commands that
    read one shard at a time), the shard cache (``sources.Network``)."""
    options = [
        click.option("--retries", type=number(0), default=DEFAULT_RETRIES, show_default=True,
                     help="Remote inputs: attempts after a failed read (a reset, a timeout, a 5xx); each goes on at "
                          "the byte reached (a range request), after a growing wait."),
        click.option(timeout_flag, "read_timeout", type=Finite(min=0, min_open=True), default=DEFAULT_TIMEOUT,
                     show_default=True, metavar="SECONDS", help="Remote inputs: longest wait for a connect or a read"
                     + ("." if timeout_flag == "--timeout" else " (--timeout from 1.1).")),
        click.option("--min-speed", type=SIZE, default=DEFAULT_MIN_SPEED, show_default="1KiB", metavar="BYTES",
                     help="Remote inputs: reads slower than BYTES a second over --speed-time are retried as a cut "
                          "connection is (0: no floor)."),
        click.option("--speed-time", type=Finite(min=0, min_open=True), default=DEFAULT_SPEED_TIME,
                     show_default=True, metavar="SECONDS", help="Remote inputs: how long reads may stay under "
                                                                "--min-speed."),
        click.option("--cache", "cache_dir", metavar="DIR", default=None,
                     help="Keep verified copies of remote shards in DIR/shards and read them from there next time: "
                          "each shard downloaded once, whole, by the first process of the machine that wants it, "
                          "the others reading the copy as it grows."),
        click.option("--cache-size", type=SIZE, default=None, metavar="SIZE",
                     help="Bound the --cache: least recently used shards are removed past SIZE."),
    ]
    if read_ahead:
        options.insert(4, click.option(
            "--prefetch", type=SIZE, default=DEFAULT_PREFETCH, show_default="32MiB",
            help="Remote inputs: bytes read ahead by threads, of the shard being read and of the next ones (up to "
                 "4, opened meanwhile), together (0: no read-ahead)."))
    return options


def network_settings(v: dict[str, Any]) -> Network:
    """The process's ``Network`` from ``network_params``'s values (``sources.configure``)."""
    if v["cache_size"] is not None and v["cache_dir"] is None:
        raise click.UsageError("--cache-size bounds the --cache: give --cache DIR too")
    # a command without --prefetch reads ahead its own way (tarpcat's lanes)
    return configure(retries=v["retries"], timeout=v["read_timeout"], prefetch=v.get("prefetch", 0),
                     cache_dir=v["cache_dir"], cache_size=v["cache_size"], min_speed=v["min_speed"],
                     speed_time=v["speed_time"])


def _read_options(v: dict[str, Any], on_error: str) -> ReadOptions:
    return ReadOptions(inputs_or_stdin(v["inputs"], v["list_files"]), on_error, v["dup"], v["max_member_size"],
                       v["links"], v["ignore_zeros"], network_settings(v))


input_options = _bundle(
    lambda: _input_params(
        ON_ERROR_POLICIES, "On a missing or damaged input: stop, or report it and go on with the next shard."
    ),
    lambda v: {"reading": _read_options(v, v["input_on_error"])},
)
"""INPUTS argument, -T lists and the reading policies; the command gets ``reading: ReadOptions``."""


parallel_input_options = _bundle(
    lambda: _input_params(
        ON_ERROR_POLICIES, "On a missing or damaged input: stop, or report it and go on with the next shard.",
        read_ahead=False,
    ),
    lambda v: {"reading": _read_options(v, v["input_on_error"])},
)
"""``input_options`` for tarpcat, whose lanes read ahead their own way (--prefetch-samples, --prefetch-bytes)."""


decode_input_options = _bundle(
    lambda: _input_params(
        ("fail", "skip", "skip-shard"),
        "On a bad image: stop, or skip it (counted); skip-shard also goes on after a damaged shard.",
    ),
    lambda v: {
        "reading": _read_options(v, "skip-shard" if v["input_on_error"] == "skip-shard" else "fail"),
        "on_error": "fail" if v["input_on_error"] == "fail" else "skip",
    },
)
"""``input_options`` for commands that decode images; they also get ``on_error`` ('fail' or 'skip')."""


job_input_options = _bundle(
    lambda: _input_params(
        ON_ERROR_POLICIES,
        "On a missing or damaged input: stop, or report it and go on with the next shard (--on-error from 1.1).",
        on_error_flag="--on-bad-shard",
        timeout_flag="--read-timeout",
    ),
    lambda v: {"reading": _read_options(v, v["input_on_error"])},
)
"""``input_options`` for tarproc, whose --on-error and --timeout keep their old meanings (failing
commands) until 1.1 (``vocabulary.DEPRECATED``): meanwhile its own are --on-bad-shard and --read-timeout."""


# single options several commands declare with the same meaning

output_option = shared_option(
    "-o", "--output", default="-", show_default=True, metavar="URL",
    help="Where to write: '-' (stdout), a path (compressed by suffix) or a URL.",
)
"""-o/--output of the commands that write one tar stream."""

count_option = shared_option(
    "-c", "--count", type=number(0), default=None, help="Stop after this many samples."
)
"""-c/--count: stop after this many samples."""

shuffle_option = shared_option(
    "--shuffle", "shuffle_size", type=number(1), default=None, metavar="N",
    help="Shuffle with a buffer of N samples (filled before the first output).",
)
"""--shuffle N: a shuffle buffer; the command gets ``shuffle_size``."""


def seed_option(what: str) -> Callable[[F], F]:
    """--seed, the random seed for ``what`` (the options it makes reproducible)."""
    return shared_option("--seed", type=int, default=None, help=f"Random seed for {what}.")


def stats_option(what: str = "shards, samples, members, bytes, skipped names and duplicates") -> Callable[[F], F]:
    """--stats, reporting ``what`` on stderr; the command gets ``show_stats``."""
    return shared_option("--stats", "show_stats", is_flag=True, help=f"Report {what} on stderr.")


def fields_option(use: str, dest: str = "fields") -> Callable[[F], F]:
    """-f/--fields, field specs in the one grammar (``tarproc.fieldspec``); ``use`` says what this
    command does with them, with an example. The command gets the text as ``dest`` (None when not
    given) and parses it with its own ``Accepts``."""
    return shared_option("-f", "--fields", dest, metavar="SPEC", help=f"{use} {SPEC_HELP}")


def _writer_kwargs(values: dict[str, Any]) -> dict[str, Any]:
    """TarWriter arguments from the option values, checked by building a writer once."""
    try:
        mode = int(values["mode"], 8)
    except ValueError:
        raise OptionError(f"bad --mode {values['mode']!r}; expected octal digits like 644") from None
    kwargs = {name: values[name] for name in ("mtime", "uid", "gid", "uname", "gname")}
    kwargs["mode"] = mode
    try:
        TarWriter(io.BytesIO(), **kwargs)
    except ValueError as e:
        raise OptionError(f"bad member metadata: {e}") from None
    return kwargs


writer_options = _bundle(
    lambda: [
        click.option("--force", is_flag=True, help="Write a tar stream even when stdout is a terminal."),
        click.option("--mtime", type=int, default=None, metavar="SECONDS",
                     help="mtime of written members [default: $SOURCE_DATE_EPOCH or 0; negative = now]."),
        click.option("--uid", type=int, default=0, show_default=True, help="Owner id of written members."),
        click.option("--gid", type=int, default=0, show_default=True, help="Group id of written members."),
        click.option("--uname", default="", help="Owner name of written members [default: empty]."),
        click.option("--gname", default="", help="Group name of written members [default: empty]."),
        click.option("--mode", default="644", show_default=True, metavar="OCTAL",
                     help="Permission bits of written members."),
    ],
    lambda v: {
        "writing": WriteOptions(v["force"], _writer_kwargs(v))
    },
)
"""Metadata of written members (defaults make output byte-identical); the command gets ``writing``."""


common_options = _bundle(
    lambda: [
        click.option("-q", "--quiet", is_flag=True, help="No progress bar."),
        click.option("--traceback", is_flag=True, help="Show the Python traceback of an error (for debugging)."),
        click.version_option(__version__, "--version", message="%(prog)s (tarproc) %(version)s"),
    ],
    lambda v: {"quiet": v["quiet"]},  # --traceback is read by TarprocCommand.main itself
)
"""-q, --traceback and --version; the command gets ``quiet``."""


@dataclass
class DecodeOptions:
    """What ``decode_options`` collects: the augmentation spec and how to run the decoder."""

    spec: Any  # a tarproc.decode.AugmentSpec
    device: str
    batch_size: int
    processes: int

    def decoder(self) -> Any:
        from ..decode import make_decoder

        return make_decoder(self.spec, self.device, self.batch_size, self.processes)


def _spec(v: dict[str, Any]) -> Any:
    from ..decode import AugmentSpec, parse_jitter, parse_pair, parse_triple

    size, resize = v["size"], v["resize"]
    if v["random_crop"] and size is None:
        raise OptionError("--random-crop needs --size")
    if (v["scale"] or v["ratio"]) and not v["random_crop"]:
        raise OptionError("--scale and --ratio have no effect without --random-crop")
    if resize is None and size is not None and not v["random_crop"]:
        resize = round(size * 8 / 7)  # the usual evaluation transform: 256 then 224
    if resize == 0:
        resize = None
    jitter = parse_jitter(v["jitter"]) if v["jitter"] else (0.0, 0.0, 0.0, 0.0)
    return AugmentSpec(
        size=size, resize=resize, random_crop=v["random_crop"],
        scale=parse_pair(v["scale"], "scale") if v["scale"] else (0.08, 1.0),
        ratio=parse_pair(v["ratio"], "ratio") if v["ratio"] else (3 / 4, 4 / 3),
        flip=v["flip"],
        mean=parse_triple(v["mean"], "mean") if v["mean"] else None,
        std=parse_triple(v["std"], "std") if v["std"] else None,
        layout=v["layout"].upper(), dtype=v["dtype"], seed=v["seed"] if v["seed"] is not None else _random_seed(),
        rotate=v["rotate"], brightness=jitter[0], contrast=jitter[1], saturation=jitter[2], hue=jitter[3],
        max_pixels=v["max_pixels"],
    )


def _random_seed() -> int:
    import secrets

    return secrets.randbits(63)


DEVICES = ("auto", "cpu", "dali-cpu", "gpu")  # tarproc.decode.DEVICES, without importing numpy and DALI here

def _decode_params(processes: tuple[str, ...], seed_help: str = "Seed of random crops and flips (per sample key).") -> list[Callable[[Any], Any]]:
    return [
        click.option("--device", "--decode", "device", type=click.Choice(DEVICES), default="auto", show_default=True,
                     help="Backend: cpu (libjpeg-turbo/Pillow), dali-cpu or gpu (NVIDIA DALI); auto = gpu if present."),
        click.option("-b", "--batch-size", type=number(1), default=64, show_default=True,
                     help="Images per batch."),
        click.option(*processes, "processes", type=number(1, MAX_PROCESSES), default=1, show_default=True,
                     help="cpu: decoding processes; dali-cpu/gpu: DALI threads."),
        click.option("--size", type=number(1), default=None, metavar="N",
                     help="Output N x N: centre crop after --resize, or random resized crop."),
        click.option("--resize", type=number(0), default=None, metavar="S",
                     help="Scale the shorter side to S [default with --size: N*8/7; 0 = no resize]."),
        click.option("--random-crop", is_flag=True, help="Random resized crop (torchvision's) to --size."),
        click.option("--scale", metavar="LO,HI", help="Area fraction range of --random-crop [default: 0.08,1]."),
        click.option("--ratio", metavar="LO,HI", help="Aspect ratio range of --random-crop [default: 3/4,4/3]."),
        click.option("--flip", type=Finite(0, 1), default=0.0, show_default=True, metavar="P",
                     help="Mirror horizontally with probability P."),
        click.option("--rotate", type=Finite(0, 180), default=0.0, show_default=True, metavar="DEG",
                     help="Rotate by a random angle in [-DEG, DEG] before cropping (RandomRotation)."),
        click.option("--jitter", metavar="B,C,S,H",
                     help="Colour jitter: brightness, contrast, saturation, hue ranges (ColorJitter), e.g. 0.4,0.4,0.4,0.1."),
        click.option("--max-pixels", type=number(1), default=8192 * 8192, show_default="8192x8192",
                     metavar="N", help="Largest image (width x height, from its header) decoded; a bigger one is "
                     "an error naming it, before its pixels are allocated."),
        click.option("--mean", metavar="R,G,B", help="Normalize: subtract this mean (0..1 scale; 'imagenet')."),
        click.option("--std", metavar="R,G,B", help="Normalize: divide by this std (0..1 scale; 'imagenet')."),
        click.option("--layout", type=click.Choice(["HWC", "CHW"], case_sensitive=False), default="HWC",
                     show_default=True, help="Array layout."),
        click.option("--dtype", type=click.Choice(["uint8", "float16", "float32"]), default=None,
                     help="Array dtype [default: float32 with --mean/--std, else uint8]."),
        click.option("--seed", type=int, default=None, help=seed_help),
    ]


def _decoding(v: dict[str, Any]) -> dict[str, Any]:
    return {"decoding": DecodeOptions(_spec(v), v["device"], v["batch_size"], v["processes"])}


decode_options = _bundle(lambda: _decode_params(("-p", "--processes")), _decoding)
"""--device, -b, -p and the augmentation options; the command gets ``decoding: DecodeOptions``."""

server_decode_options = _bundle(
    lambda: _decode_params(("--threads",), "Seed of crops and flips (per key and epoch) and of the shuffles."), _decoding
)
"""``decode_options`` with --threads for the decoder's processes/threads (tarserve's -p is its senders)."""


def _seconds_or_forever(value: float) -> float | None:
    return None if value == 0 else value


def transport_options(sending: bool) -> Callable[[F], F]:
    """--hwm, --curve-keys and the timeouts of tarserve (``sending``) and tarrecv; the command
    gets ``transport``, the keyword arguments of ``ServeConfig`` or ``Receiver``."""
    from ..transport.receiver import DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_TIMEOUT
    from ..transport.sender import DEFAULT_HEARTBEAT, DEFAULT_HWM, DEFAULT_SEND_TIMEOUT

    def options() -> list[Callable[[Any], Any]]:
        both = [
            click.option("--hwm", type=number(1, MAX_C_INT), default=DEFAULT_HWM, show_default=True, metavar="N",
                         help="High-water mark: batches queued per connection before "
                              + ("sending waits (PUB: drops)." if sending else "the sender waits.")),
            click.option("--curve-keys", "curve", type=click.Path(file_okay=False), default=None, metavar="DIR",
                         help="Encrypt and authenticate with the CURVE keys in DIR (made by tarkeys)."),
        ]
        if sending:
            return both + [
                click.option("--send-timeout", type=Finite(min=0), default=DEFAULT_SEND_TIMEOUT,
                             show_default=True, metavar="SECONDS",
                             help="Give up when no receiver takes a batch for this long (0 = wait for ever)."),
                click.option("--heartbeat", type=Finite(min=0.01), default=DEFAULT_HEARTBEAT,
                             show_default=True, metavar="SECONDS", help="Tell receivers we're alive this often."),
            ]
        return both + [
            click.option("--idle-timeout", "timeout", type=Finite(min=0), default=DEFAULT_TIMEOUT,
                         show_default=True, metavar="SECONDS",
                         help="A sender silent this long (no batch, no heartbeat) is an error (0 = wait for ever)."),
            click.option("--wait", type=Finite(min=0), default=0, show_default=True, metavar="SECONDS",
                         help="Give up when no sender has appeared after this long (0 = wait for ever)."),
            click.option("--max-message-size", type=SIZE, default=_binary_size(DEFAULT_MAX_MESSAGE_SIZE), show_default=True,
                         metavar="BYTES", help="The largest frame (a batch's tensor, a sample's raw field) to "
                                               "accept; a sender that sends a bigger one is cut off (0 = no limit)."),
        ]

    def collect(v: dict[str, Any]) -> dict[str, Any]:
        if sending:
            return {"transport": {"hwm": v["hwm"], "curve": v["curve"], "heartbeat": v["heartbeat"],
                                  "send_timeout": _seconds_or_forever(v["send_timeout"])}}
        return {"transport": {"hwm": v["hwm"], "curve": v["curve"], "timeout": _seconds_or_forever(v["timeout"]),
                              "wait": _seconds_or_forever(v["wait"]),
                              "max_message_size": int(v["max_message_size"]) or None}}

    return _bundle(options, collect)  # type: ignore[no-any-return]


def _binary_size(n: int) -> str:
    """``1GiB`` for 2**30: a default as people write it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def inputs_or_stdin(inputs: tuple[str, ...], list_files: tuple[str, ...]) -> list[str]:
    """Expanded input URLs; none given means stdin."""
    urls = expand_urls(inputs, list_files)
    if not urls and not inputs and not list_files:
        urls = ["-"]
    if not urls:
        raise OptionError("no inputs (the lists given are empty)")
    if urls.count("-") > 1:
        raise OptionError("stdin ('-') can be read only once")
    if "-" in urls and _stdin_is_terminal():
        raise OptionError("refusing to read a tar archive from a terminal: give an input, or pipe one in")
    return urls


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# progress and stats


def progress(
    items: Iterable[T], quiet: bool, desc: str, unit: str = "sample", total: Callable[[], int | None] | None = None
) -> Iterable[T]:
    """``items`` with a tqdm bar on stderr, only when stderr is a terminal and not quiet (else
    ``items`` themselves: no layer in between). ``total``, when given, finds how many items there
    will be (e.g. ``ReadOptions.total_samples``); it runs in a thread, so the first items are not
    held back, and the bar gains its total and ETA when it answers."""
    if quiet or not _stderr_is_terminal():
        return items
    return _with_bar(items, desc, unit, total)


def _with_bar(items: Iterable[T], desc: str, unit: str, total: Callable[[], int | None] | None) -> Iterator[T]:
    from tqdm import tqdm

    with tqdm(items, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, miniters=100) as bar:
        if total is not None:
            threading.Thread(target=_find_total, args=(bar, total), daemon=True, name="progress-total").start()
        yield from bar


def sliced_total(
    reading: ReadOptions, start: int = 0, stop: int | None = None, step: int = 1, count: int | None = None
) -> Callable[[], int | None]:
    """A ``progress`` total: the inputs' samples (where known) from ``start`` to ``stop`` by
    ``step``, at most ``count``."""

    def total() -> int | None:
        n = reading.total_samples()
        if n is None:
            return None
        n = len(range(start, n if stop is None else min(stop, n), step))
        return n if count is None else min(n, count)

    return total


def _find_total(bar: Any, total: Callable[[], int | None]) -> None:
    try:
        n = total()
    except Exception:  # a total is a nicety: a shard it can't count is the reader's to report
        return
    if n is not None:
        bar.total = n
        bar.refresh()  # now: a writer blocked on a full pipe would not redraw it for seconds (tqdm locks it)


def _stderr_is_terminal() -> bool:
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def write_tar(samples: Iterable[Sample], output: str, writing: WriteOptions) -> TarWriter:
    """Write ``samples`` as one tar stream to ``output`` (``open_sink``: '-', a path or a URL).

    Returns the closed writer, whose ``samples`` and ``members`` count what was written.
    """
    with open_sink(output, force=writing.force) as sink:
        writer = TarWriter(sink, **writing.tar)
        writer.write_samples(samples)
        writer.close()
    return writer


def report_stats(prog: str, stats: ReadStats, writer: TarWriter, output: str, detail: str = "") -> None:
    """The ``--stats`` report of a command that wrote one tar stream with ``write_tar``;
    ``detail`` (the command's own counts) comes before what was written."""
    written = f"wrote {writer.samples} samples, {writer.members} members to {output}"
    say(format_stats(prog, stats, f"{detail}; {written}" if detail else written))


def format_stats(prog: str, stats: ReadStats, written: str) -> str:
    """The ``--stats`` report (stderr): what was read (stopping early reads a little ahead), then
    what was skipped, then ``written`` (the command's own account of its output)."""
    d = stats.as_dict()
    lines = [
        f"{prog}: read {d['shards']} shard(s) ({d['shards_failed']} failed): {d['samples']} samples, "
        f"{d['members']} members, {d['bytes']} bytes of member data",
    ]
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(stats.skipped_entries.items())) or "none"
    lines.append(f"{prog}: skipped entries: {skipped}; metadata members {stats.metadata}")
    no_key = f"{stats.no_key_count}"
    if stats.no_key:
        no_key += " (e.g. " + ", ".join(repr(n) for n in stats.no_key[:3]) + ")"
    lines.append(f"{prog}: names without a key: {no_key}; duplicates dropped: {stats.duplicates}")
    for error in stats.errors:
        lines.append(f"{prog}: skipped shard: {error}")
    lines.append(f"{prog}: {written}")
    return "\n".join(lines)
