"""tarshow: look at samples: field previews, JSON lines, a contact sheet, images in the terminal, a lint."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

from .. import sinks
from ..classnames import class_names_beside, read_class_names
from ..content import plural
from ..errors import OptionError, SinkError, TarprocError
from ..fieldspec import legacy_note, parse_specs
from ..imaging import (
    PROTOCOLS,
    ImageDecodeError,
    contact_sheet,
    decode_image,
    detect_protocol,
    encode_for_terminal,
    format_for_name,
    save_image,
)
from ..samples import Sample
from ..show import (
    DEFAULT_WIDTH,
    LintError,
    Summary,
    format_record,
    image_fields,
    json_text,
    label_of,
    sample_record,
    summarize,
)
from ..sinks import open_sink
from ..sniff import escape_text
from ..stages import SELECT_SPECS, field_pairs, slice_samples
from ..tar import ReadStats
from .common import (
    MAX_PROCESSES,
    Finite,
    ReadOptions,
    TarprocCommand,
    common_options,
    fields_option,
    input_options,
    number,
    progress,
    say,
    shared_option,
    warn,
)

EPILOG = """\b
Examples:
  tarshow train-0000.tar -c 3                         # key, url, then FIELD TAB SIZE TAB PREVIEW
  tarcat 'train-{0000..0147}.tar' --shuffle 1000 | tarshow -c 5 -f 'jpg cls' -w 100
  tarshow train-0000.tar --json | jq -r 'select(.fields.cls.preview == "3") | .__key__'
  tarshow 'train-{0000..0147}.tar' --summary          # counts, sizes, and what looks wrong
  tarshow 'train-{0000..0147}.tar' --summary --strict -q > lint.txt   # CI: exit 1 on problems
  tarshow 'train-{0000..0147}.tar' --summary --decode -p 8    # decode all fields: list failures
  tarshow train-0000.tar --summary --classes classes.txt    # class names beside the labels
  tarshow train-0000.tar --grid sheet.png -c 36       # contact sheet: 36 captioned thumbnails
  tarshow train-0000.tar --view -c 10 -d 1            # images in the terminal, one a second
  tarshow 'train-{0000..0009}.tar' --report report.html --sample 48 --seed 1   # one HTML file
  tarshow 'train-{0000..0009}.tar' --report report.html --decode -p 4   # with decode failures
  tarshow 'train-{0000..0147}.tar' --serve            # browse at http://127.0.0.1:8000/
  tarshow 'train-{0000..0147}.tar' --serve --summary --decode -p 4   # and list every problem

\b
Binary fields show as [TYPE], the type sniffed from their first bytes (jpeg, png, npy, ...).
--json writes one object per sample: {"__key__", "__url__", "fields": {NAME: {"size", "type",
"preview", "truncated"}}}; "preview" (escaped, cut to --width) only for text and JSON fields.
JSON output is UTF-8 even for names that are not (koi8-r, cp866...): a byte 0xNN that is not
UTF-8 is written as the escape \\udcNN (Python's surrogateescape, so reversible: in Python,
json.loads(line)[...].encode("utf-8", "surrogateescape") gives the original bytes back).
--summary --strict exits with status 1 when the report lists problems (--json: its "problems"),
naming them on stderr; an input with no sample at all is a problem too. --summary and --report
also say what the fields hold, read from headers (no pixel decoded): image formats (and
extensions that lie), sizes and modes, and images cut short (a JPEG without its end marker, a
PNG or WebP whose chunks run past the end); audio and video duration (and the total hours),
rate, channels, fps and codec (PyAV: pip install 'tarproc[media]'; WAV without it), and audio
whose rate (under 1 kHz) or channels (over 64) no recording has: damage or a decode bomb; text
lengths, empty and non-UTF-8 text; JSON key coverage and value types; the classes of cls and
label fields, and labels that are not integers where the others are. Each problem names the
tarfirst command that pulls the sample out. --bytes-only leaves all that out (sizes and names
only, the fastest).
--decode (with --summary or --report) also decodes every image (libjpeg-turbo, strictly:
"Corrupt JPEG data" is a failure; Pillow for other formats), audio and video field (PyAV) in -p
processes, and lists every one that fails with its tarfirst command (--json: the first 1000,
and the count). The result is the same for any -p.
Class names: --classes FILE (one name a line, line i naming label i, as tarcreate --classes
writes it), or else a classes.txt beside the first local shard, shows "3 (golden_retriever)"
for label 3 in --summary, --report and --serve.
--report writes one self-contained HTML file (no request to any other host; open it from disk or
mail it): the problems first, with a card for each sample that has one (up to 24), then the
summary as tables and charts, and --sample samples chosen at random (--seed) as cards with
thumbnails, audio players, video poster frames, text, labels and JSON.
--serve starts a read-only web viewer of the inputs (paths or URLs, not stdin) on --host:--port
until Ctrl-C; --host other than 127.0.0.1/localhost/::1 makes it reachable from other machines.
Its problems panel lists the broken images of the pages viewed; --serve --summary also reads
every sample once in the background (with --decode -p N, decoding them too) and lists the
summary's problems as they are found, each with a link to the sample and its tarfirst command.
--view picks kitty, iTerm2 or sixel graphics from $TERM, $TERM_PROGRAM and $KITTY_WINDOW_ID, and
colour half blocks elsewhere; --view-protocol overrides it.
"""


@click.command("tarshow", cls=TarprocCommand, epilog=EPILOG)
@input_options
@shared_option("-c", "--count", type=number(0), default=None,
              help="Show this many samples (--grid: this many images, default 16).")
@shared_option("--skip", type=number(0), default=0, help="Skip this many samples first.")
@fields_option("Fields to show, e.g. 'jpg;png cls' (first present of jpg/png, and cls); for --grid and "
               "--view the image fields.")
@click.option("-w", "--width", type=number(0), default=DEFAULT_WIDTH, show_default=True,
              help="Cut previews to this many characters (0: no limit).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per sample (with --summary: one document); UTF-8, see below.")
@click.option("--summary", is_flag=True,
              help="Report on the whole stream instead: fields, sizes, and problems (a lint); with --serve: "
                   "list its problems in the viewer.")
@shared_option("--strict", is_flag=True, help="--summary: exit with status 1 if it finds problems, naming them.")
@click.option("--grid", metavar="PATH",
              help="Write a contact sheet of images (format by suffix: .png, .jpg, .webp...; '-' = PNG to stdout).")
@click.option("--columns", type=number(1), default=None, help="--grid: columns [default: a square].")
@click.option("--thumb", type=click.IntRange(min=16, max=4096), default=160, show_default=True, metavar="PX",
              help="--grid: thumbnail size in pixels.")
@click.option("--view", is_flag=True, help="Show images in the terminal after each sample's fields.")
@click.option("--view-protocol", type=click.Choice(("auto", *PROTOCOLS)), default="auto", show_default=True,
              help="--view: terminal graphics protocol.")
@click.option("-d", "--delay", type=Finite(min=0), default=0.0, metavar="SEC",
              help="Wait this long after each sample.")
@shared_option("--force", is_flag=True, help="Write --grid - even when stdout is a terminal.")
@click.option("--bytes-only", is_flag=True,
              help="--summary/--report: sizes and names only, no content statistics (faster).")
@shared_option("--decode", "decode", is_flag=True,
               help="--summary/--report: also decode every image, audio and video field; list each failure.")
@shared_option("-p", "--processes", "processes", type=number(1, MAX_PROCESSES), default=1, show_default=True,
               help="--decode: decoding processes.")
@shared_option("--classes", "classes", metavar="FILE", default=None,
               help="Class names, one a line (line i: label i) [default: classes.txt beside the first shard].")
@click.option("--report", metavar="PATH", help="Write a self-contained HTML report: summary, charts, problems, "
                                               "sample cards.")
@click.option("--sample", "sample_size", type=number(0), default=None, metavar="N",
              help="--report: show this many samples chosen at random [default: 48].")
@shared_option("--seed", type=int, default=None, help="--report: seed of the random choice [default: 0].")
@click.option("--serve", is_flag=True, help="Start a local web viewer of the inputs (until Ctrl-C).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="--serve: port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="--serve: address to listen on (anything but loopback exposes the data).")
@common_options
def main(
    reading: ReadOptions,
    quiet: bool,
    count: int | None,
    skip: int,
    fields: str | None,
    width: int,
    as_json: bool,
    summary: bool,
    strict: bool,
    grid: str | None,
    columns: int | None,
    thumb: int,
    view: bool,
    view_protocol: str,
    delay: float,
    force: bool,
    bytes_only: bool,
    decode: bool,
    processes: int,
    classes: str | None,
    report: str | None,
    sample_size: int | None,
    seed: int | None,
    serve: bool,
    port: int,
    host: str,
) -> None:
    """Show samples: each field's size and a short preview, or images, or a summary of the stream.

    INPUTS are paths, '-' (stdin, the default), pipe:CMD, http(s)://, s3:// or any fsspec URL, with
    brace lists and '::' joins, as for tarcat.
    """
    # --serve --summary is one mode: the viewer, and the summary in its background
    modes = [name for name, on in (("--summary", summary and not serve), ("--grid", grid is not None),
                                   ("--view", view), ("--report", report is not None), ("--serve", serve)) if on]
    if len(modes) > 1:
        raise OptionError(f"{' and '.join(modes)} cannot be used together")
    if as_json and (grid is not None or view or report is not None or serve):
        raise OptionError("--json works with the previews and --summary, not with --grid, --view, --report or --serve")
    if bytes_only and not (summary or report is not None):
        raise OptionError("--bytes-only works with --summary and --report only")
    if (sample_size is not None or seed is not None) and report is None:
        raise OptionError("--sample and --seed work with --report only")
    if (port != 8000 or host != "127.0.0.1") and not serve:
        raise OptionError("--port and --host have no effect without --serve")
    if view_protocol != "auto" and not view:
        raise OptionError("--view-protocol has no effect without --view")
    if (columns is not None or thumb != 160) and grid is None:
        raise OptionError("--columns and --thumb have no effect without --grid")
    if strict and not summary:
        raise OptionError("--strict works with --summary only")
    if strict and serve:
        raise OptionError("--strict has no effect with --serve: the viewer lists the problems (--summary --strict "
                          "without --serve exits 1 on them)")
    if decode and not (summary or report is not None):
        raise OptionError("--decode works with --summary and --report only (and with --serve --summary)")
    if decode and bytes_only:
        raise OptionError("--decode reads the fields' content: it cannot be used with --bytes-only")
    if processes != 1 and not decode:
        raise OptionError("-p sets the decoding processes of --decode: use it with --decode")
    if classes is not None and not (summary or report is not None or serve):
        raise OptionError("--classes works with --summary, --report and --serve only")
    spec = None
    if fields is not None:
        specs = parse_specs(fields, dataclasses.replace(SELECT_SPECS, what="tarshow -f"))
        if note := legacy_note(specs):
            warn(note)
        spec = field_pairs(specs)

    if (summary and not serve) or report is not None:
        if spec is not None or skip:
            raise OptionError(f"{modes[0]} reads every field of every sample: -f and --skip have no effect")
    names = read_class_names(classes) if classes is not None else None  # a bad file: one line, before any read
    decode_in = processes if decode else None
    if serve:
        if spec is not None or skip or count is not None:
            raise OptionError("--serve shows every sample: -f, --skip and -c have no effect")
        _serve(reading, host, port, quiet, names, summary, not bytes_only, decode_in)
        return
    if summary:
        names = names if names is not None else class_names_beside(reading.urls)
        _summary(reading, quiet, count, as_json, strict, not bytes_only, decode_in, names)
        return
    if report is not None:
        names = names if names is not None else class_names_beside(reading.urls)
        _report(reading, quiet, count, report, sample_size, 0 if seed is None else seed, not bytes_only, decode_in,
                names)
        return

    stats = ReadStats()
    source = reading.samples(stats)
    watch = FieldWatch(spec)
    with contextlib.closing(source):
        samples: Iterator[Sample] = iter(source)
        if skip:
            samples = slice_samples(samples, skip, None)
        if spec is not None:
            samples = watch.watch(samples)
        try:
            if grid is not None:
                _grid(samples, grid, spec, 16 if count is None else count, columns, thumb, force, quiet)
                return
            if count is not None:
                samples = slice_samples(samples, 0, count)
            if view:
                protocol = detect_protocol(os.environ) if view_protocol == "auto" else view_protocol
                _view(samples, spec, width, protocol, delay)
            else:
                _previews(samples, spec, width, as_json, delay)
        finally:
            for line in watch.unmatched():
                warn(line)


class FieldWatch:
    """Which entries of ``-f`` no sample shown had: a misspelt field (``-f jgp``) would otherwise
    show nothing and exit 0. Said on stderr at the end, as tar2tsv does for its columns."""

    MAX_SEEN = 50  # field names kept to name in the warning

    def __init__(self, spec: list[tuple[str, list[str]]] | None) -> None:
        self.spec = spec or []
        self.missing = {name: alternatives for name, alternatives in self.spec}
        self.seen: set[str] = set()
        self.samples = 0

    def watch(self, samples: Iterator[Sample]) -> Iterator[Sample]:
        missing, seen = self.missing, self.seen
        for sample in samples:
            self.samples += 1
            if missing:
                for name, alternatives in list(missing.items()):
                    if any(alt in sample for alt in alternatives):
                        del missing[name]
                if len(seen) < self.MAX_SEEN:
                    seen.update(k for k in sample if not k.startswith("__"))
            yield sample

    def unmatched(self) -> list[str]:
        """One warning line per ``-f`` entry that no sample had (none when no sample was read)."""
        if not self.samples:
            return []
        fields = ", ".join(escape_text(name) for name in sorted(self.seen)) or "none"
        return [f"-f {escape_text(';'.join(alternatives))!r}: no sample has that field "
                f"(in {plural(self.samples, 'sample')} read; their fields: {fields})"
                for alternatives in self.missing.values()]


def _previews(samples: Iterator[Sample], spec: Any, width: int, as_json: bool, delay: float) -> None:
    out = sys.stdout
    for i, sample in enumerate(samples):
        if i and delay:
            out.flush()
            time.sleep(delay)
        record = sample_record(sample, spec, width)
        if as_json:
            _write_json(out, record)
        else:
            out.write(("\n" if i else "") + format_record(record) + "\n")
    out.flush()


def _view(samples: Iterator[Sample], spec: Any, width: int, protocol: str, delay: float) -> None:
    import shutil  # only for --view: tarshow starts without it

    out = sys.stdout
    size = shutil.get_terminal_size((80, 24))
    for i, sample in enumerate(samples):
        if i and delay:
            time.sleep(delay)
        out.write(("\n" if i else "") + format_record(sample_record(sample, spec, width)) + "\n")
        for name in image_fields(sample, spec):
            try:
                out.write(encode_for_terminal(sample[name], protocol, columns=size.columns, rows=size.lines - 2))
            except ImageDecodeError as e:
                warn(f"{_where(sample, name)}: {e}")
        out.flush()


def _where(sample: Sample, field: str) -> str:
    return f"{sample.get('__url__')}: {sample.get('__key__')}.{field}"


def _grid(
    samples: Iterator[Sample],
    path: str,
    spec: Any,
    count: int,
    columns: int | None,
    thumb: int,
    force: bool,
    quiet: bool,
) -> None:
    fmt = "PNG" if path == "-" else format_for_name(path)
    if fmt is None:
        raise OptionError(f"--grid {path!r}: no image format for that suffix; use .png, .jpg, .webp, ...")
    if count == 0:
        raise OptionError("--grid needs at least one image (-c 0)")
    if path == "-" and not force and sinks.stdout_is_terminal():
        raise SinkError("refusing to write an image to a terminal; redirect it, use --force, or try --view", "stdout")
    items: list[tuple[Any, list[str]]] = []
    seen = undecodable = no_image = 0
    for sample in progress(samples, quiet, "tarshow"):
        seen += 1
        names = image_fields(sample, spec)
        if not names:
            no_image += 1
            continue
        try:
            img = decode_image(sample[names[0]], max_size=thumb)
        except ImageDecodeError as e:
            undecodable += 1
            warn(f"{_where(sample, names[0])}: {e}; skipped")
            continue
        label = label_of(sample)
        # the key comes from the data: no control character reaches the picture as is
        items.append((img, [escape_text(str(sample["__key__"]))] + ([label] if label else [])))
        if len(items) >= count:
            break
    if not items:
        what = f" ({undecodable} undecodable)" if undecodable else ""
        raise TarprocError(f"no images to put in a grid in {seen} samples{what}; choose the image fields with -f")
    data = save_image(contact_sheet(items, thumb=thumb, columns=columns), fmt)
    with open_sink(path, force=force, compression=None) as sink:
        sink.write(data)
    if not quiet:
        notes = [f"{n} {what}" for n, what in ((undecodable, "undecodable"), (no_image, "without an image")) if n]
        extra = f" ({', '.join(notes)} skipped)" if notes else ""
        say(f"tarshow: wrote {path}: {len(items)} images from {seen} samples{extra}")


def _write_json(out: Any, doc: Any) -> None:
    """One line of JSON, as UTF-8 bytes whatever the locale's encoding (see ``json_text``)."""
    line = (json_text(doc) + "\n").encode("utf-8")
    buffer = getattr(out, "buffer", None)
    if buffer is None:
        out.write(line.decode("utf-8"))
    else:
        out.flush()
        buffer.write(line)


def _summary(reading: ReadOptions, quiet: bool, count: int | None, as_json: bool, strict: bool, content: bool,
             decode: int | None, names: list[str] | None) -> None:
    acc = Summary(content=content, decode=decode)

    def report() -> dict[str, Any]:
        out = sys.stdout
        doc = acc.as_dict()
        if as_json:
            _write_json(out, doc)
        else:
            out.write(acc.format_text(doc, names) + "\n")
        out.flush()
        return doc

    def wrap(members: Any) -> Any:
        return progress(members, quiet, "tarshow", unit="member")

    try:
        summarize(
            reading.urls, policy=reading.policy, count=count, summary=acc, wrap=wrap,
        )
    except TarprocError:
        report()  # what was read up to the damage; the error itself goes to stderr (exit 1)
        raise
    finally:
        acc.close()  # the decode workers, if any (Ctrl-C included)
    note = acc.content.decode.note if acc.content is not None and acc.content.decode is not None else None
    if note:  # once, not per field
        warn(f"--decode: audio and video not decoded: {note}")
    doc = report()
    if strict and doc["problems"]:  # field names come from the data: no control characters to the terminal
        raise LintError([escape_text(problem) for problem in doc["problems"]])


def _report(reading: ReadOptions, quiet: bool, count: int | None, path: str, sample_size: int | None, seed: int,
            content: bool, decode: int | None, names: list[str] | None) -> None:
    from ..view.report import DEFAULT_SAMPLE, write_report  # the report's room: only for --report

    def wrap(members: Any) -> Any:
        return progress(members, quiet, "tarshow", unit="member")

    def wrap_cards(samples: Any) -> Any:
        return progress(samples, quiet, "tarshow: cards")

    sample = DEFAULT_SAMPLE if sample_size is None else sample_size
    info = write_report(reading.urls, path, sample=sample, seed=seed, count=count, content=content,
                        on_error=reading.on_error, wrap=wrap, wrap_cards=wrap_cards, policy=reading.policy,
                        decode=decode, classes=names)
    if info.decode_note:  # once, not per field
        warn(f"--decode: audio and video not decoded: {info.decode_note}")
    if not quiet:
        problems = f", {plural(len(info.problems), 'kind')} of problem" if info.problems else ", no problems found"
        where = "the report to stdout" if path == "-" else path
        say(f"tarshow: wrote {where}: {plural(info.cards, 'sample')} of {info.samples}{problems}"
            f" ({info.bytes / 1e6:.1f} MB)")


def _serve(reading: ReadOptions, host: str, port: int, quiet: bool, names: list[str] | None, summary: bool,
           content: bool, decode: int | None) -> None:
    # the server checks the inputs (files or URLs, not stdin), warns about a host that is not
    # loopback, prints its URL on stderr and blocks until Ctrl-C; without --classes it looks for a
    # classes.txt beside the shards itself
    from ..view.server import serve  # the viewer's web stack: only for --serve

    extra: dict[str, Any] = {}
    if summary:  # read as --summary reads, and stopped with the server
        from ..view.summary import SummaryOptions

        extra["summary"] = SummaryOptions(decode=decode, content=content, policy=reading.policy)
    serve(list(reading.urls), host, port, quiet, classes=names, **extra)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarshow")
