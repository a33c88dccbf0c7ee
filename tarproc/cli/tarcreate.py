"""tarcreate (also tsv2tar): build a tar of samples from a TSV/CSV/JSONL plan, streaming."""

from __future__ import annotations

import contextlib
from typing import Any

import click

from ..sinks import write_atomically
from ..sources import open_source
from ..stages import check_key_format
from ..tables import KEY_COLUMN, TABLE_FORMATS, class_folder_plan, format_for_name, plan_samples, read_table
from .common import (
    TarprocCommand,
    WriteOptions,
    common_options,
    output_option,
    progress,
    say,
    shared_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarcreate plan.tsv -C /data/images -o train.tar
  tar2tsv shard.tar -f '__key__ cls txt' | tarcreate -o copy.tar
  find imgs -name '*.jpg' | sort | sed '1i @jpg' | tarcreate --key-format %06d | tarsplit -n 1000 -o shards/s
  tarcreate labels.jsonl -C /data | tarcat --shuffle 1000 > train.tar
  tarcreate --classes-from-dirs imagenet/train --classes classes.txt | tarsplit -s 1e9 -o train-%06d.tar

\b
A plan has a header row (TSV/CSV; JSONL rows are objects) and one row per sample:
  __key__   the sample's key (another column with --key-column, or numbered with --key-format FORMAT)
  cls       a field: the member KEY.cls holds the cell's text (UTF-8)
  @jpg      a file field: the cell is a path relative to -C DIR; the member KEY.jpg holds the file
Empty cells (and JSON nulls) leave the field out; __name__ columns (__url__) are ignored.
Format from the suffix (.tsv .csv .jsonl, also compressed: .tsv.gz), else --format, else from
the first line. TSV cells use the backslash escapes tar2tsv writes (\\\\ \\t \\n \\r).

\b
Errors name the plan, the row (its line number; the header is row 1) and the column:
  tarcreate: error: plan.tsv: row 17, column jpg: no such file 'imgs/x.jpg'
Paths that are absolute or climb out of -C DIR are refused unless -P. The plan is read one row
at a time; keys are remembered (to refuse duplicates), file contents are not.

\b
--classes-from-dirs ROOT makes the plan from an image-folder tree, one directory per class
(ROOT/CLASS/.../NAME.EXT, as torchvision's ImageFolder reads it): sample CLASS/.../NAME with the
image as field EXT (lower-cased: .JPEG gives jpeg) and cls, the class's index among the sorted
class directories; --classes FILE writes the class names, one a line (line i: class i). Dots in
a file name's stem become '_' (readers split names at the first dot). Samples come shuffled
across classes (--seed; --no-shuffle: class by class); files without an image suffix
(jpg jpeg png webp bmp gif tif tiff) are left out and counted on stderr.
"""


def _options(f: Any) -> Any:
    decorators = [
        click.argument("plan", default="-", metavar="[PLAN]"),
        output_option,
        click.option("-C", "--directory", "base_dir", default=".", show_default=True, metavar="DIR",
                     help="Directory that @FIELD paths are relative to."),
        shared_option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default=None,
                     help="Plan format [default: from the suffix, else from the first line]."),
        click.option("--key-format", "key_format", metavar="FORMAT",
                     help="Number samples with a printf FORMAT (e.g. %06d, from 0) instead of a key column."),
        click.option("--key-column", default=KEY_COLUMN, show_default=True, metavar="NAME",
                     help="The column holding sample keys."),
        click.option("-P", "--absolute-names", is_flag=True,
                     help="Allow absolute @FIELD paths and paths with '..' out of -C DIR."),
        click.option("--classes-from-dirs", "class_root", metavar="ROOT", default=None,
                     help="Make the plan from an image-folder tree, a directory per class (see below)."),
        click.option("--classes", "classes_out", metavar="FILE", default=None,
                     help="With --classes-from-dirs: write the class names there, one a line (line i: label i)."),
        shared_option("--seed", type=int, default=0, show_default=True,
                     help="With --classes-from-dirs: the seed of the order, shuffled across classes."),
        click.option("--no-shuffle", is_flag=True, help="With --classes-from-dirs: class by class, in name order."),
        writer_options,
        common_options,
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def create(
    writing: WriteOptions,
    quiet: bool,
    plan: str,
    output: str,
    base_dir: str,
    fmt: str | None,
    key_format: str | None,
    key_column: str,
    absolute_names: bool,
    class_root: str | None,
    classes_out: str | None,
    seed: int,
    no_shuffle: bool,
) -> None:
    """Build a tar of samples from a TSV, CSV or JSONL plan (stdout or -o).

    PLAN is a path, '-' (stdin, the default), pipe:CMD or a URL; one row per sample. Output is
    deterministic: fields in sorted order, fixed mtime and owner.
    """
    if key_format is not None:
        check_key_format(key_format)
    if fmt is None:
        fmt = format_for_name(plan) if plan != "-" else None
    prog = click.get_current_context().info_name or "tarcreate"
    if class_root is not None:
        from_dirs(writing, quiet, prog, plan, output, class_root, classes_out, None if no_shuffle else seed, key_format)
        return
    if classes_out is not None or no_shuffle:
        raise click.UsageError("--classes and --no-shuffle go with --classes-from-dirs ROOT")
    with open_source(plan) as stream:
        rows = read_table(stream, plan, fmt)
        samples = plan_samples(
            rows, plan, base_dir=base_dir, key_column=key_column, key_format=key_format,
            absolute_names=absolute_names,
        )
        with contextlib.closing(samples):
            write_tar(progress(samples, quiet, prog), output, writing)


def from_dirs(writing: WriteOptions, quiet: bool, prog: str, plan: str, output: str, root: str,
              classes_out: str | None, seed: int | None, key_format: str | None) -> None:
    """``--classes-from-dirs``: the samples of an image-folder tree (``tables.class_folder_plan``)."""
    if plan != "-":
        raise click.UsageError("give a PLAN or --classes-from-dirs ROOT, not both")
    folders = class_folder_plan(root, seed)
    if folders.skipped:
        say(f"{prog}: {folders.skipped} files without an image suffix left out")
    if classes_out is not None:
        write_atomically(classes_out, "".join(name + "\n" for name in folders.classes))
    samples = plan_samples(folders.rows, root, base_dir=root, key_format=key_format)
    with contextlib.closing(samples):
        write_tar(progress(samples, quiet, prog), output, writing)


main = click.command("tarcreate", cls=TarprocCommand, epilog=EPILOG)(_options(create))
tsv2tar = click.command("tsv2tar", cls=TarprocCommand, epilog=EPILOG.replace("tarcreate", "tsv2tar"))(
    _options(create)
)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarcreate")
