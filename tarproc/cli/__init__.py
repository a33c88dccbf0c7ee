"""The commands: one thin module each (parse options, call the core, format output).

``COMMANDS`` maps each command name to ``module:attribute``; pyproject's console scripts, the
``bin/`` shims and the generated reference in ``docs/`` all follow it.
"""

COMMANDS = {
    "tarcat": "tarproc.cli.tarcat:main",
    "tarsplit": "tarproc.cli.tarsplit:main",
    "tarpcat": "tarproc.cli.tarpcat:main",
    "tarshow": "tarproc.cli.tarshow:main",
    "tar2tsv": "tarproc.cli.tar2tsv:main",
    "tarcreate": "tarproc.cli.tarcreate:main",
    "tsv2tar": "tarproc.cli.tarcreate:tsv2tar",
    "tarfirst": "tarproc.cli.tarfirst:main",
    "tarindex": "tarproc.cli.tarindex:main",
    "tarproc": "tarproc.cli.tarproc:main",
    "tarsort": "tarproc.cli.tarsort:main",
    "tardecode": "tarproc.cli.tardecode:main",
    "tarserve": "tarproc.cli.tarserve:main",
    "tarrecv": "tarproc.cli.tarrecv:main",
    "tarkeys": "tarproc.cli.tarkeys:main",
    "tarjob": "tarproc.cli.tarjob:main",
    "tarjpeg": "tarproc.cli.tarjpeg:main",
}
