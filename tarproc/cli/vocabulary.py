"""The commands' shared vocabulary: what each flag that several commands have means in all of them.

A flag used by more than one command has one meaning, written here once, and each command
declares it through a shared option (``common.shared_option`` or an option bundle). Where a
command mirrors a Unix tool, that tool's habit may win: such exceptions are listed here, with
why. Spellings that moved keep working for one release (``DEPRECATED``), with one warning line.
``tests/cli/test_vocabulary.py`` checks the commands against this module, and ``docs/commands.md``
shows it as a table (``python -m tarproc.cli.docs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flag:
    """What a shared flag means, and the commands where it means something else (and why)."""

    meaning: str
    exceptions: dict[str, str] = field(default_factory=dict)


VOCABULARY: dict[str, Flag] = {
    # reading: every command that reads shards (common.input_options and its variants)
    "-T": Flag("Read input URLs from FILE, one per line ('-' = stdin)."),
    "--files-from": Flag("Long form of -T."),
    "--on-error": Flag(
        "On bad input: a missing or damaged shard stops the command (fail) or is reported and skipped "
        "(skip-shard); commands that decode images can also skip an image that doesn't decode (skip)."),
    "--dup": Flag("A duplicate field, or a key that reappears later in a shard: error, warn and drop, or drop."),
    "--max-member-size": Flag("Largest tar member accepted; a bigger one is an error naming it."),
    "--links": Flag("What to do with hard and symbolic links to an earlier member."),
    "-i": Flag("Read on past end-of-archive blocks (as GNU tar -i)."),
    "--ignore-zeros": Flag("Long form of -i."),
    # reading remote inputs
    "--retries": Flag(
        "After a failure, try again up to N more times, waiting longer each time: a remote read (commands "
        "that read shards) or a shard's whole run (tarjob, which reads nothing itself)."),
    "--timeout": Flag("Seconds a remote input's connect or read may wait."),
    "--prefetch": Flag("Bytes of remote input read ahead by threads (0: no read-ahead)."),
    "--min-speed": Flag("Remote reads slower than BYTES a second over --speed-time are retried."),
    "--speed-time": Flag("How long remote reads may stay under --min-speed."),
    "--cache": Flag("Keep verified copies of remote shards in DIR and read them from there."),
    "--cache-size": Flag("Bound the --cache (least recently used shards go first)."),
    # writing
    "-o": Flag("Where the output goes: '-' (stdout), a path or a URL (tarsplit: a pattern of shard names)."),
    "--output": Flag("Long form of -o."),
    "--force": Flag("Write binary output (a tar stream, an image, bytes) even when stdout is a terminal."),
    "--overwrite": Flag("Replace a file the command otherwise refuses to replace (tarkeys: existing keys; tarindex: "
                        "another tool's index)."),
    "--mtime": Flag("mtime of written members."),
    "--uid": Flag("Owner id of written members."),
    "--gid": Flag("Group id of written members."),
    "--uname": Flag("Owner name of written members."),
    "--gname": Flag("Group name of written members."),
    "--mode": Flag("Permission bits of written members."),
    # selecting samples
    "-c": Flag(
        "How many to take, then stop: samples (tarshow: samples shown; tarrecv: batches).",
        {"tarproc": "-c CMD is the shell command, as in sh -c and bash -c: tarproc's most typed line "
                    "(tarproc -p 16 -c '...'); tarproc takes no count, so the two never meet in one command."}),
    "--count": Flag("Long form of -c (the count)."),
    "--skip": Flag("Skip this many input samples first."),
    "-n": Flag(
        "Samples per output shard at most (tarsplit).",
        {"tarsort": "-n compares as numbers, as sort -n does."}),
    "-s": Flag(
        "Largest output shard, in bytes (tarsplit).",
        {"tarproc": "-s SCRIPT is the script-file form of -c CMD; tarproc writes no shards.",
         "tarjob": "-s SPEC is the shard list every tarjob line starts with, and the line its Kubernetes and "
                   "Slurm tasks run (tarjob --index I -s SPEC): moving it would break manifests already "
                   "written; tarjob writes no shards."}),
    "-f": Flag(
        "Which fields the command uses: field specs, one grammar for all commands ('Field specs' in the "
        "README): 'jpg;png' is the first of jpg and png a sample has.",
        {"tarproc": "-f LIST keeps every field matching its glob patterns ('jpg,json' keeps both), as cut -f 1,3 "
                    "keeps both fields, and pairs with --exclude. Read as specs, 'jpg,json' would keep only the "
                    "first present, and existing command lines would lose fields.",
         "tarserve": "-f NAMES lists the other fields to send as bytes, every one of them ('jpg,json' sends both; "
                     "'' sends none), as cut -f 1,3 does. Read as specs, existing command lines would send "
                     "fewer fields."}),
    "--fields": Flag("Long form of -f.",
                     {"tarproc": "the long form of its -f (a list of fields to keep, above).",
                      "tarserve": "the long form of its -f (a list of fields to send, above)."}),
    "--missing": Flag("A sample lacking a field the command needs: an error, or what to do instead."),
    "--shuffle": Flag("Shuffle with a buffer of N samples."),
    "--seed": Flag("Random seed of what the command randomizes (shuffles, random order, crops...)."),
    # running
    "-p": Flag("How many run at once, as xargs -P: the long name says what runs (--readers, --processes, "
               "--senders)."),
    "--senders": Flag("How many sender processes: tarserve starts them, tarrecv waits for them to finish."),
    "--threads": Flag("Long form of -p where threads run: tarjpeg's re-layout threads; tarserve's decoders."),
    "--processes": Flag("Long form of -p where processes run: tarproc's commands, tardecode's decoders, "
                        "tarshow --decode's checks."),
    "--command-timeout": Flag("Seconds a command run for a sample (tarproc) or a shard (tarjob) may take; then its "
                              "whole process group is killed."),
    "--tmpdir": Flag("Directory for temporary files [default: $TMPDIR or /tmp]."),
    # reporting
    "-q": Flag("No progress bar (and no summary)."),
    "--quiet": Flag("Long form of -q."),
    "-v": Flag("Say more on stderr: what was written, for each shard or member."),
    "--verbose": Flag("Long form of -v."),
    "--stats": Flag("Report counts (what was read, written, skipped) on stderr."),
    "--strict": Flag("Problems the command would otherwise report and pass over are errors (exit 1)."),
    "--traceback": Flag("Show the Python traceback of an error (for debugging)."),
    "--version": Flag("Print the version and exit."),
    # files other than tar
    "--classes": Flag(
        "The class names file: one name a line, line i naming label i (tarshow reads it).",
        {"tarcreate": "--classes FILE is where tarcreate --classes-from-dirs writes that file: the same file, "
                      "written there and read by tarshow.",
         "tsv2tar": "tarcreate's other name: --classes FILE is where --classes-from-dirs writes that file."}),
    "--format": Flag("Format of the command's other file (tar2tsv's table, tarcreate's plan, tarindex's index)."),
    "--name": Flag("Name given to what the command makes (a wids dataset, a Kubernetes or Slurm job)."),
    # decoding images (tardecode, tarserve)
    "--field": Flag("The image field: the first of these names a sample has."),
    "--output-field": Flag("Name of the decoded image array."),
    "--device": Flag("Decoding backend: cpu, dali-cpu or gpu; auto = gpu if present."),
    "--decode": Flag(
        "Another spelling of --device.",
        {"tarshow": "--decode is a flag of --summary and --report: decode every image, audio and video field and "
                    "list those that fail. It picks no backend (the checks run on the CPU), so it takes no value; "
                    "tarshow has no --device."}),
    "-b": Flag("Images per batch."),
    "--batch-size": Flag("Long form of -b."),
    "--size": Flag("Output N x N images."),
    "--resize": Flag("Scale the shorter side to S."),
    "--random-crop": Flag("Random resized crop to --size."),
    "--scale": Flag("Area fraction range of --random-crop."),
    "--ratio": Flag("Aspect ratio range of --random-crop."),
    "--flip": Flag("Mirror horizontally with probability P."),
    "--rotate": Flag("Rotate by a random angle in [-DEG, DEG]."),
    "--jitter": Flag("Colour jitter ranges."),
    "--max-pixels": Flag("Largest image decoded (width x height, from its header)."),
    "--mean": Flag("Normalize: subtract this mean."),
    "--std": Flag("Normalize: divide by this std."),
    "--layout": Flag("Array layout (HWC or CHW)."),
    "--dtype": Flag("Array dtype."),
    # ZeroMQ transport (tarserve, tarrecv)
    "--hwm": Flag("High-water mark: batches queued per connection."),
    "--curve-keys": Flag("Encrypt and authenticate with the CURVE keys in DIR (made by tarkeys)."),
}
"""Every flag that more than one command has, with its one meaning."""


@dataclass(frozen=True)
class Deprecation:
    """An old spelling that still works for one release, with one warning line on stderr."""

    old: str  # the old spelling
    new: str  # the spelling of the same option now
    later: str = ""  # what the old spelling will mean in 1.1, where it will mean something else

    def message(self) -> str:
        line = f"{self.old} is deprecated here; use {self.new}"
        return f"{line} (in 1.1 it will mean {self.later})" if self.later else line


DEPRECATED: dict[str, list[Deprecation]] = {
    "tarproc": [
        Deprecation("--timeout", "--command-timeout", "the network timeout, now --read-timeout here"),
        Deprecation("--on-error", "--on-command-error", "what to do with a bad shard, now --on-bad-shard here"),
        Deprecation("--procs", "--processes"),
    ],
    "tarjob": [
        Deprecation("--timeout", "--command-timeout"),
        Deprecation("--force", "--redo"),
    ],
    "tarrecv": [Deprecation("--timeout", "--idle-timeout")],
    "tarpcat": [Deprecation("--prefetch", "--prefetch-samples", "bytes read ahead, as --prefetch-bytes here")],
    "tarkeys": [Deprecation("--force", "--overwrite")],
    "tarcreate": [Deprecation("--key", "--key-format")],
    "tsv2tar": [Deprecation("--key", "--key-format")],
    "tarsort": [Deprecation("--memory", "--buffer-size")],
    "tarfirst": [Deprecation("-n", "--nth")],
}
"""Per command, the old spellings that keep working through 1.0 (hidden from --help). Where the
old spelling will mean something else in 1.1, it keeps its old meaning until then, and says so."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_table(uses: dict[str, list[str]]) -> str:
    """The vocabulary as Markdown: ``uses`` maps each flag to the commands that have it."""
    lines = [
        "## Vocabulary",
        "",
        "Generated from `tarproc/cli/vocabulary.py`: a flag that several commands have means one thing in all",
        "of them, except where the last column says why not (`tests/cli/test_vocabulary.py` checks it).",
        "",
        "| Flag | Meaning | Commands | Exceptions, and why |",
        "|---|---|---|---|",
    ]
    for flag, entry in VOCABULARY.items():
        commands = ", ".join(name for name in uses.get(flag, []) if name not in entry.exceptions)
        notes = [f"{name}: {why}" for name, why in entry.exceptions.items()]
        for name, deprecations in DEPRECATED.items():
            notes += [f"{name}: {d.old} is the old spelling of {d.new} until 1.1"
                      + (", then it means this." if d.later else ".") for d in deprecations if d.old == flag]
        exceptions = " ".join(notes)
        lines.append(f"| `{flag}` | {_cell(entry.meaning)} | {commands} | {_cell(exceptions)} |")
    lines += [
        "",
        "### Deprecated spellings",
        "",
        "They work through 1.0, each with one warning line on stderr, and are hidden from `--help`.",
        "",
        "| Command | Old | New | In 1.1 the old spelling means |",
        "|---|---|---|---|",
    ]
    for name, deprecations in DEPRECATED.items():
        for d in deprecations:
            lines.append(f"| {name} | `{d.old}` | `{d.new}` | {_cell(d.later) or 'nothing (an unknown option)'} |")
    return "\n".join(lines) + "\n"
