"""Deprecated: the tar core is the package ``tarproc.tar`` since 1.0; this name goes away in 1.1.

``import tarproc.tario`` still gives the public names it had (``TarWriter``, ``iter_members``,
``FileRange``, ...), with one ``DeprecationWarning``: write ``from tarproc.tar import ...``.
"""

from __future__ import annotations

import warnings

from . import tar
from .tar import *  # noqa: F403 - the old module's public names, all of them

__all__ = tar.__all__

warnings.warn("tarproc.tario is deprecated: import from tarproc.tar (the same names)", DeprecationWarning,
              stacklevel=2)
