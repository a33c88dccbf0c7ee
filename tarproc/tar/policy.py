"""The read policy: how a reader treats duplicates, big members, links, zero blocks and failing shards.

These five settings travel together through every reader (``iter_members``, ``read_samples``, the
index readers, the commands' option bundles, ``tarproc.Dataset``), so they are one value, checked
once when it is made.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError

DEFAULT_MAX_MEMBER_SIZE = 2 << 30  # 2 GiB
DUP_POLICIES = ("error", "warn", "skip")
LINK_POLICIES = ("follow", "skip", "strict")
ON_ERROR_POLICIES = ("fail", "skip-shard")


def _choice(what: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionError(f"bad {what} policy {value!r}; use one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ReadPolicy:
    """How to read tar shards: a frozen value, validated when made (``OptionError`` if not valid).

    Attributes:
        dup: a field that comes twice in one sample: ``"error"`` (default) raises
            ``DuplicateError``, ``"warn"`` says so and keeps the first, ``"skip"`` keeps the first
            silently.
        max_member_size: the largest member, in bytes, that is read (default 2 GiB); a bigger one
            is a ``TarFormatError``. An int >= 0.
        links: hard and symbolic links to earlier members: ``"follow"`` (default) reads them as
            their targets' bytes (a hard link that can't be had is a ``LinkError``; a symbolic one
            is left out, said and counted), ``"strict"`` makes that symbolic link an error too,
            ``"skip"`` leaves all links out (counted).
        ignore_zeros: read on past end-of-archive blocks, as GNU tar's ``-i`` does (concatenated
            archives); the default, False, requires that only zeros follow them.
        on_error: a missing or damaged shard: ``"fail"`` (default) raises, ``"skip-shard"``
            reports it and goes on with the next shard.

    >>> ReadPolicy(dup="skip").links
    'follow'
    >>> ReadPolicy(links="maybe")
    Traceback (most recent call last):
    ...
    tarproc.errors.OptionError: bad links policy 'maybe'; use one of follow, skip, strict
    """

    dup: str = "error"
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE
    links: str = "follow"
    ignore_zeros: bool = False
    on_error: str = "fail"

    def __post_init__(self) -> None:
        _choice("duplicate", self.dup, DUP_POLICIES)
        _choice("links", self.links, LINK_POLICIES)
        _choice("error", self.on_error, ON_ERROR_POLICIES)
        size = self.max_member_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise OptionError(f"bad max_member_size {size!r}; must be a number of bytes >= 0")
        if not isinstance(self.ignore_zeros, bool):
            # 0 and 1 (and numpy's bools) were read as flags before the policy was a value: they still are
            if self.ignore_zeros not in (0, 1):
                raise OptionError(f"bad ignore_zeros {self.ignore_zeros!r}; must be True or False")
            object.__setattr__(self, "ignore_zeros", bool(self.ignore_zeros))


def policy_with_keywords(policy: ReadPolicy, old: dict[str, Any], allowed: tuple[str, ...], where: str) -> ReadPolicy:
    """``policy`` with the read keywords a caller gave the old way (``dup=``, ``links=`` ...) applied.

    Those keywords are deprecated (one release): each use warns (``DeprecationWarning``, pointing
    at the caller of ``where``). A keyword not in ``allowed`` is the ``TypeError`` Python gives.
    """
    if not old:
        return policy
    for name in old:
        if name not in allowed:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
    given = ", ".join(f"{name}=" for name in old)
    warnings.warn(f"{where}({given}...) is deprecated: pass policy=ReadPolicy({given}...) instead",
                  DeprecationWarning, stacklevel=3)
    return dataclasses.replace(policy, **old)


TAR_FIELDS = ("max_member_size", "links", "ignore_zeros")  # what a tar stream's reader uses of a policy
SAMPLE_FIELDS = ("dup", *TAR_FIELDS, "on_error")  # and a sample reader: all of it

__all__ = [
    "DEFAULT_MAX_MEMBER_SIZE",
    "DUP_POLICIES",
    "LINK_POLICIES",
    "ON_ERROR_POLICIES",
    "SAMPLE_FIELDS",
    "TAR_FIELDS",
    "ReadPolicy",
    "policy_with_keywords",
]
