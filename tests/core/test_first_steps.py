"""The traps a new user fell into, each closed: the README's recipe on an ImageNet-style tree, a
DataLoader given a batch_size, parameters given to the wrong object, and values of the wrong kind."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tarhelpers import encode_image, write_tar

import tarproc
from tarproc import ParameterError
from tarproc.decode import AugmentSpec
from tarproc.decode.audio import AudioSpec
from tarproc.decode.spec import DATASET_PARAMETERS, LOADER_PARAMETERS
from tarproc.decode.video import VideoSpec
from tarproc.errors import DecodeError, OptionError

torch = pytest.importorskip("torch")
DataLoader = torch.utils.data.DataLoader
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's commands (tarcreate, tarsplit)


def readme_section(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(heading)
    end = text.find("\n### ", start + len(heading))
    return text[start:end]


def imagenet_tree(root: Path, classes: int = 3, per_class: int = 4) -> list[int]:
    """``root/imagenet/train/nCLASS/nCLASS_I.JPEG`` as ImageNet's train tree is laid out; the labels."""
    labels = []
    for c in range(classes):
        folder = root / "imagenet" / "train" / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((40 + 4 * i, 56, 3), 30 * c + i, np.uint8)
            (folder / f"n{c:08d}_{i}.JPEG").write_bytes(encode_image(pixels))
            labels.append(c)
    return labels


def test_the_readme_recipe_runs_a_full_epoch_on_an_imagenet_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README's tarcreate line, then its Dataset recipe: ``.JPEG`` files are field ``jpeg``, which a
    ``to_tuple=("jpg", "cls")`` recipe failed on mid-epoch."""
    labels = imagenet_tree(tmp_path)
    commands = [line for line in readme_section("### tar2tsv, tarcreate, tarfirst").splitlines()
                if line.startswith("tarcreate --classes-from-dirs imagenet/train")]
    assert len(commands) == 1
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-o", "pipefail", "-c", commands[0]], cwd=tmp_path, env=env, check=True, timeout=120)
    shards = sorted(p.name for p in tmp_path.glob("train-*.tar"))
    assert shards == ["train-0000.tar"]  # the name the recipe's brace list starts with
    assert (tmp_path / "classes.txt").read_text().split() == [f"n{c:08d}" for c in range(3)]

    recipe = readme_section("### tarproc.Dataset: feed a PyTorch training loop").split("```python\n", 1)[1]
    recipe = recipe.split("```", 1)[0]
    for old, new in (("{0000..0147}", "{0000..0000}"), ("range(90)", "range(1)"), ("num_workers=8", "num_workers=2")):
        assert recipe.count(old) == 1, old
        recipe = recipe.replace(old, new)
    body = re.search(r"^( +)\.\.\. .*$", recipe, re.MULTILINE)
    assert body is not None
    recipe = recipe.replace(body.group(0), f"{body.group(1)}seen.append((tuple(images.shape), images.dtype, labels.tolist()))")
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"seen": []}
    exec(compile(recipe, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    seen = scope["seen"]
    assert sum(len(batch[2]) for batch in seen) == len(labels)
    assert sorted(label for batch in seen for label in batch[2]) == labels
    assert all(shape[1:] == (3, 224, 224) and dtype == torch.float32 for shape, dtype, _ in seen)


def test_a_missing_image_column_says_which_alternative_the_sample_has(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "s.tar", [{"__key__": "n1/a", "jpeg": encode_image(np.zeros((8, 8, 3), np.uint8)),
                                           "cls": 1}])
    ds = tarproc.Dataset(str(path), decode=AugmentSpec(size=8), to_tuple=("jpg", "cls"))
    with pytest.raises(DecodeError, match=r"no field jpg \(it has: cls, jpeg\); give the column as 'jpg;jpeg' to take "
                                          r"whichever of them a sample has"):
        list(ds)
    ds = tarproc.Dataset(str(path), decode=AugmentSpec(size=8), to_tuple=("jpg;jpeg", "cls"))
    ((images, labels),) = list(ds)
    assert tuple(images.shape) == (1, 8, 8, 3) and labels.tolist() == [1]


# ---------------------------------------------------------------------------------------------
# DataLoader(ds, batch_size=16): batches of batches


@pytest.fixture()
def shard(tmp_path: Path) -> str:
    pixels = [np.full((12, 12, 3), 10 * i, np.uint8) for i in range(10)]
    return str(write_tar(tmp_path / "s.tar", [{"__key__": f"k{i}", "cls": i, "jpg": encode_image(pixels[i])}
                                              for i in range(10)]))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kwargs", [{"to_tuple": ("cls",)}, {}, {"to_tuple": ("jpg", "cls"), "decode": AugmentSpec(size=8)},
                                    {"decode": AugmentSpec(size=8)}], ids=["tuple", "dict", "images", "image-dict"])
def test_a_dataloader_given_a_batch_size_is_an_option_error(shard: str, workers: int, kwargs: dict[str, Any]) -> None:
    """It stacked 16 of the Dataset's batches into one: a label tensor of shape [16, 16]."""
    ds = tarproc.Dataset(shard, batch_size=2, **kwargs)
    for batch_size in (16, 1):  # 1: the DataLoader's default
        with pytest.raises(OptionError, match=r"stack the Dataset's batches .*give the DataLoader batch_size=None, "
                                              r"as in DataLoader\(ds, batch_size=None, num_workers=8\), or iterate "
                                              r"ds\.loader\(num_workers=8\)"):
            list(DataLoader(ds, batch_size=batch_size, num_workers=workers))
    with pytest.raises(OptionError, match="batch_size=None"):
        list(DataLoader(ds, num_workers=workers))


def _plain(batch: Any) -> Any:
    """A batch as plain data (its type, its columns as lists) to compare."""
    if isinstance(batch, dict):
        return type(batch).__name__, {k: _plain(v) for k, v in sorted(batch.items())}
    if isinstance(batch, (tuple, list)):
        return type(batch).__name__, [_plain(v) for v in batch]
    return batch.tolist() if hasattr(batch, "tolist") else batch


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_and_the_loader_yield_the_batches_they_did(shard: str, workers: int) -> None:
    """The plain types torch made of them before (a list of columns in this process, a tuple from a
    worker's shared memory, a dict), the same values as iterating the Dataset."""
    for kwargs in ({"to_tuple": ("cls",)}, {"to_tuple": ("jpg", "cls"), "decode": AugmentSpec(size=8)},
                   {"decode": AugmentSpec(size=8)}):
        ds = tarproc.Dataset(shard, batch_size=4, **kwargs)
        direct = [_plain(b)[1] for b in ds]
        for batches in (DataLoader(ds, batch_size=None, num_workers=workers), ds.loader(num_workers=workers)):
            got = [_plain(b) for b in batches]
            kinds = {kind for kind, _ in got}
            if "to_tuple" not in kwargs:
                assert kinds == {"dict"}
            else:
                assert kinds == ({"tuple"} if workers and "decode" in kwargs else {"list"})
            values = [v for _, v in got]
            if workers:  # two readers make other batches: every sample once, each with its image
                columns = [v if isinstance(v, list) else [v[k] for k in ("jpg", "cls") if k in v] for v in values]
                rows = sorted((c[-1][i], c[0][i] if len(c) > 1 else None) for c in columns for i in range(len(c[-1])))
                assert [label for label, _ in rows] == list(range(10))
                assert all(image is None or image[0][0][0] == 10 * label for label, image in rows)
            else:
                assert values == direct


# ---------------------------------------------------------------------------------------------
# a parameter given to the wrong object, values of the wrong kind


def test_the_named_parameters_are_the_real_ones() -> None:
    from tarproc.dataset.loader import Loader  # noqa: F401 - the DataLoader's names are checked below

    names = [n for n, p in inspect.signature(tarproc.Dataset).parameters.items() if p.kind != p.VAR_KEYWORD]
    assert list(DATASET_PARAMETERS) == names
    dataloader = set(inspect.signature(DataLoader).parameters)
    assert set(LOADER_PARAMETERS) - {"in_order"} <= dataloader


@pytest.mark.parametrize(("make", "message"), [
    (lambda: AugmentSpec(size=224, image="jpg"),
     r"AugmentSpec has no parameter image: image= is a Dataset parameter: tarproc\.Dataset\(urls, image=\.\.\., "
     r"decode=AugmentSpec\(\.\.\.\)\)"),
    (lambda: AugmentSpec(num_workers=8), r"num_workers= is a DataLoader parameter: ds\.loader\(num_workers=\.\.\.\)"),
    (lambda: AugmentSpec(sample_rate=16000), r"sample_rate= is an AudioSpec parameter: .*AudioSpec\(sample_rate="),
    (lambda: AugmentSpec(sise=224), r"AugmentSpec has no parameter sise \(did you mean size or resize\?\)"),
    (lambda: AudioSpec(size=224), r"AudioSpec has no parameter size: size= is an AugmentSpec parameter"),
    (lambda: AudioSpec(image="wav"), r"image= is a Dataset parameter: .*decode=AudioSpec\(\.\.\.\)"),
    (lambda: VideoSpec(frames=8, image="mp4"), r"VideoSpec has no parameter image: image= is a Dataset parameter"),
    (lambda: VideoSpec(flip=0.5), r"VideoSpec has no parameter flip: flip= is an AugmentSpec parameter"),
])
def test_a_spec_given_another_objects_parameter_says_where_it_goes(make: Any, message: str) -> None:
    with pytest.raises(OptionError, match=message) as caught:
        make()
    assert isinstance(caught.value, TypeError) and isinstance(caught.value, ParameterError)  # as Python's own was


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"size": 224}, r"Dataset has no parameter size: size= is an AugmentSpec parameter \(also VideoSpec's\): "
                    r"tarproc\.Dataset\(urls, decode=AugmentSpec\(size=\.\.\.\)\)"),
    ({"num_workers": 8}, r"ds\.loader\(num_workers=\.\.\.\)"),
    ({"ignore_zeros": True}, r"read=tarproc\.ReadPolicy\(ignore_zeros=\.\.\.\)"),
    ({"min_speed": 1}, r"network=tarproc\.Network\(min_speed=\.\.\.\)"),
    ({"batchsize": 8}, r"Dataset has no parameter batchsize \(did you mean batch_size"),
])
def test_a_dataset_given_another_objects_parameter_says_where_it_goes(shard: str, kwargs: dict[str, Any],
                                                                      message: str) -> None:
    with pytest.raises(ParameterError, match=message):
        tarproc.Dataset(shard, **kwargs)
    with pytest.raises(TypeError):  # what it was: code catching that still does
        tarproc.Dataset(shard, **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": None}, r"bad batch_size None: the Dataset makes the batches, give it their size .* batch_size=None "
                           r"goes to the DataLoader over it: DataLoader\(ds, batch_size=None\), or ds\.loader\(\)"),
    ({"batch_size": "64"}, r"bad batch_size '64'; must be a whole number"),
    ({"batch_size": 2.5}, r"bad batch_size 2\.5"),
    ({"shuffle": None}, r"bad shuffle None"),
    ({"threads": "2"}, r"bad threads '2'"),
    ({"repeat": True, "batches_per_epoch": 1.5}, r"bad batches_per_epoch 1\.5"),
])
def test_values_of_the_wrong_kind_are_option_errors(shard: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        tarproc.Dataset(shard, **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"size": (48, 80)}, r"bad size \(48, 80\); give one number: images are cropped to SIZE x SIZE squares "
                         r"\(rectangular output is not supported"),
    ({"size": [224, 224]}, r"bad size \(224, 224\); give one number"),
    ({"size": "224"}, r"bad size '224'; must be a whole number >= 1"),
    ({"size": 224.0}, r"bad size 224\.0"),
    ({"resize": True}, r"bad resize True"),
    ({"max_pixels": None}, r"bad max_pixels None"),
    ({"random_crop": 1, "size": 8}, r"bad random_crop 1"),
    ({"seed": "0"}, r"bad seed '0'"),
    ({"mean": 0.5}, r"bad mean 0\.5; give 3 numbers \(R, G, B\)"),
    ({"scale": 0.5}, r"bad scale 0\.5; give 2 numbers \(LO, HI\)"),
])
def test_augment_spec_values_of_the_wrong_kind_are_option_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        AugmentSpec(**kwargs)


def test_augment_spec_keeps_sequences_as_tuples_and_says_its_dtype() -> None:
    spec = AugmentSpec(size=8, mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5], scale=[0.5, 1.0])
    assert spec.mean == (0.5, 0.5, 0.5) and spec.scale == (0.5, 1.0) and hash(spec) == hash(dataclasses.replace(spec))
    assert AugmentSpec(size=8).output_dtype == "uint8" and spec.output_dtype == "float32"
    assert AugmentSpec(size=8, dtype="float32").output_dtype == "float32"
    doc = inspect.getdoc(AugmentSpec) or ""
    assert "uint8 (0..255) without" in doc and "float32 with them" in doc


def test_the_specs_document_every_field() -> None:
    for cls in (AugmentSpec, AudioSpec):
        entries = set(re.findall(r"^\s{4,}(\w+): ", inspect.getdoc(cls) or "", re.MULTILINE))
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in entries]
        assert missing == [], f"{cls.__name__} fields without an entry in its docstring: {missing}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "size" in inspect.signature(AugmentSpec).parameters  # help() still shows the fields
