"""Training datasets over sharded tar files: ``Dataset`` (a torch ``IterableDataset`` when torch is
installed, a plain iterable otherwise) and ``Loader`` (a DataLoader that keeps the position).

::

    import torch, tarproc
    from tarproc.decode import AugmentSpec, IMAGENET_MEAN, IMAGENET_STD

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    ds = tarproc.Dataset("train-{0000..0147}.tar", decode=spec, shuffle=1000, to_tuple=("jpg", "cls"), batch_size=64)
    for epoch in range(90):
        ds.set_epoch(epoch)
        for images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=8):
            ...

The rules (who reads what, epochs, resume, errors) are in ``docs/training.md``; the split of an
epoch among ranks and workers in ``tarproc.dataset.split``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import EncodedImages, EpochClock, Position
    from .fields import DEFAULT_HANDLERS, apply_handlers, collate
    from .loader import HAVE_TORCH, Dataset, Loader
    from .mix import Mix
    from .split import Assignment, Part, epoch_order, rank_plan, remaining, split_by_shard, split_work

# imported on first use: the planning modules (split, counts: the commands count shards for their
# progress bars) must not pay for torch, which the Dataset's module imports
_LAZY = {
    "EncodedImages": "core", "EpochClock": "core", "Position": "core",
    "DEFAULT_HANDLERS": "fields", "apply_handlers": "fields", "collate": "fields",
    "HAVE_TORCH": "loader", "Dataset": "loader", "Loader": "loader",
    "Mix": "mix",
    "Assignment": "split", "Part": "split", "epoch_order": "split", "rank_plan": "split", "remaining": "split",
    "split_by_shard": "split", "split_work": "split",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tarproc.dataset' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_HANDLERS", "HAVE_TORCH", "Assignment", "Dataset", "EncodedImages", "EpochClock", "Loader", "Mix", "Part",
    "Position", "apply_handlers", "collate", "epoch_order", "rank_plan", "remaining",
    "split_by_shard", "split_work",
]
