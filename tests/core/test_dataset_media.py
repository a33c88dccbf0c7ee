"""Audio and video fields through tarproc.Dataset (real encoded files), the default handlers, and collate."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from mediahelpers import encode_audio, encode_video, frame_level, wav_file, wave64_file
from tarhelpers import encode_image, write_tar

from tarproc.dataset import Dataset
from tarproc.dataset.fields import DEFAULT_HANDLERS, gunzip, handler_for, merge_handlers, pad_collate
from tarproc.decode import AugmentSpec
from tarproc.decode.audio import AudioSpec, decode_audio
from tarproc.decode.spec import plan_key
from tarproc.decode.video import VideoSpec
from tarproc.errors import DatasetError, DecodeError, MissingDependencyError, OptionError, SampleError

torch = pytest.importorskip("torch")
pytest.importorskip("av")
DataLoader = torch.utils.data.DataLoader

SECONDS = [0.5, 1.0, 0.75, 0.25, 0.6]


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A speech-recognition shard: KEY.flac or KEY.wav (16 kHz, mono or stereo) + KEY.txt."""
    path = tmp_path_factory.mktemp("speech") / "speech-0000.tar"
    samples = []
    for i, seconds in enumerate(SECONDS):
        ext = "flac" if i % 2 else "wav"
        samples.append({"__key__": f"utt{i}", ext: encode_audio(ext, seconds, 16000, 1 + i % 2), "txt": f"words {i}"})
    return str(write_tar(path, samples))


def test_speech_batches_padded_with_lengths(speech: str) -> None:
    ds = Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=16000, channels=1)},
                 to_tuple=("flac;wav", "flac.lengths;wav.lengths", "txt"), collate="pad", tensors="numpy")
    ((audio, lengths, text),) = list(ds)
    assert audio.shape == (5, 1, 16000) and audio.dtype == np.float32
    assert lengths.tolist() == [round(s * 16000) for s in SECONDS] and lengths.dtype == np.int64
    assert text == [f"words {i}" for i in range(5)]
    for i, (row, n) in enumerate(zip(audio, lengths, strict=True)):
        assert not row[:, n:].any()  # zeros after each clip's end
        middle = row[0, n // 4: 3 * n // 4]
        # the tone (a sine of amplitude 0.5); stereo (odd i: 440 and 880 Hz) mixed to mono is their mean
        assert float(np.sqrt((middle ** 2).mean())) == pytest.approx(0.25 if i % 2 else 0.354, abs=0.01)
    # in a dict batch, every padded field comes with FIELD.lengths
    (batch,) = list(Dataset(speech, batch_size=5, decode={"wav": AudioSpec(sample_rate=8000)}, collate="pad",
                            map=lambda s: s if "wav" in s else None, tensors="numpy"))
    assert batch["wav"].shape == (3, 1, 6000) and batch["wav.lengths"].tolist() == [4000, 6000, 4800]


def test_speech_in_dataloader_workers_as_torch_tensors(speech: str) -> None:
    ds = Dataset(speech, batch_size=2, decode={"flac;wav": AudioSpec(sample_rate=8000, seconds=0.5)},
                 to_tuple=("flac;wav", "txt"))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert sum(len(t) for _, t in batches) == 5
    audio, _ = batches[0]
    assert isinstance(audio, torch.Tensor) and audio.dtype == torch.float32 and audio.shape == (2, 1, 4000)
    padded = Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000)}, collate="pad",
                     to_tuple=("flac;wav", "flac.lengths;wav.lengths"))
    ((audio, lengths),) = list(DataLoader(padded, batch_size=None, num_workers=1))
    assert audio.shape == (5, 1, 8000) and lengths.dtype == torch.int64 and lengths.tolist() == [s * 8000 for s in SECONDS]


def test_without_pad_variable_lengths_are_a_list(speech: str) -> None:
    ds = Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000)}, to_tuple=("flac;wav",),
                 tensors="numpy")
    ((audio,),) = list(ds)
    assert isinstance(audio, list) and [a.shape[1] for a in audio] == [s * 8000 for s in SECONDS]


def _starts(batch: np.ndarray, ramp_rate: int = 2000) -> list[int]:
    return [round(float(row[0, 0]) * ramp_rate) for row in batch]


def test_random_crop_is_seeded_by_key_and_epoch_and_resumes(tmp_path: Path) -> None:
    ramp = (np.arange(1000, dtype=np.float32) / 2000)[None]  # sample i is i/2000: a crop tells its offset
    wav = encode_audio("wav", rate=1000, signal=ramp)
    path = str(write_tar(tmp_path / "r.tar", [{"__key__": f"k{i:02d}", "wav": wav} for i in range(12)]))
    spec = AudioSpec(sample_rate=1000, seconds=0.2, random_crop=True)

    def dataset(seed: int = 4) -> Dataset:
        return Dataset(path, batch_size=4, seed=seed, decode={"wav": spec}, to_tuple=("wav", "__key__"), tensors="numpy")

    ds = dataset()
    ds.set_epoch(2)
    first = [(_starts(a), keys) for a, keys in ds]
    starts = [s for b, _ in first for s in b]
    assert len(set(starts)) > 8 and all(0 <= s <= 800 for s in starts)
    ds.set_epoch(2)
    assert [(_starts(a), keys) for a, keys in ds] == first  # the same epoch: the same crops
    seeded = AudioSpec(sample_rate=1000, seconds=0.2, random_crop=True, seed=4)  # the dataset's seed, the plan key
    assert starts[0] == seeded.crop_start(plan_key("k00", 2), 1000)
    ds.set_epoch(3)
    assert [s for a, _ in ds for s in _starts(a)] != starts  # the next epoch: new crops
    assert [s for a, _ in dataset(seed=5) for s in _starts(a)] != [s for a, _ in dataset() for s in _starts(a)]
    # resume mid-epoch: the rest of the epoch has exactly the crops an uninterrupted run had
    loader = dataset().loader(num_workers=2)
    loader.dataset.set_epoch(2)
    taken = []
    for audio, keys in loader:
        taken.append((_starts(np.asarray(audio)), list(keys)))
        break
    resumed = dataset().loader(num_workers=2)
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    rest = [(_starts(np.asarray(a)), list(k)) for a, k in resumed]
    assert sorted(taken + rest) == sorted(first)


def test_video_clips(tmp_path: Path) -> None:
    clips = [encode_video(ext, frames=24, fps=12, height=48, width=64) for ext in ("mp4", "webm", "mkv")]
    path = str(write_tar(tmp_path / "v.tar", [
        {"__key__": f"v{i}", ("mp4", "webm", "mkv")[i % 3]: clips[i % 3], "cls": i % 3} for i in range(6)
    ]))
    spec = VideoSpec(frames=4, fps=6, size=(24, 32), layout="TCHW")
    ds = Dataset(path, batch_size=3, decode={"mp4;webm;mkv": spec}, to_tuple=("mp4;webm;mkv", "cls"))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    video, labels = batches[0]
    assert video.shape == (3, 4, 3, 24, 32) and video.dtype == torch.uint8 and labels.tolist() == [0, 1, 2]
    levels = video.float().mean(dim=(2, 3, 4))  # frame 0, 2, 4, 6 of the stored 12 fps
    expected = torch.tensor([frame_level(i, 24) for i in (0, 2, 4, 6)], dtype=torch.float32)
    assert torch.allclose(levels, expected.expand(3, 4), atol=3)
    randomly = Dataset(path, batch_size=6, decode={"mp4;webm;mkv": VideoSpec(frames=2, random_clip=True)},
                       to_tuple=("mp4;webm;mkv",), tensors="numpy")
    ((a,),) = list(randomly)
    ((b,),) = list(Dataset(path, batch_size=6, decode={"mp4;webm;mkv": VideoSpec(frames=2, random_clip=True)},
                           to_tuple=("mp4;webm;mkv",), tensors="numpy"))
    assert np.array_equal(a, b) and len({int(clip.mean()) for clip in a}) > 1  # seeded, and not all at the start


def test_images_and_audio_in_one_dataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    image = encode_image(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8))
    path = str(write_tar(tmp_path / "av.tar", [
        {"__key__": f"k{i}", "jpg": image, "flac": encode_audio("flac", 0.3, 8000), "json": json.dumps({"i": i})}
        for i in range(4)
    ]))
    ds = Dataset(path, batch_size=4, decode={"jpg": AugmentSpec(size=16), "flac": AudioSpec(sample_rate=8000, seconds=0.25)},
                 tensors="numpy")
    (batch,) = list(ds)
    assert np.asarray(batch["jpg"]).shape == (4, 16, 16, 3) and batch["flac"].shape == (4, 1, 2000)
    assert batch["json"] == [{"i": i} for i in range(4)]
    assert ds.decode_stats.decoded == 4


def test_undecodable_media_fail_or_skip(tmp_path: Path) -> None:
    good = encode_audio("flac", 0.2, 8000)
    path = str(write_tar(tmp_path / "bad.tar", [
        {"__key__": f"k{i}", "flac": good if i != 2 else good[:40], "cls": i} for i in range(5)
    ]))
    spec = {"flac": AudioSpec(sample_rate=8000)}
    with pytest.raises(DecodeError, match=r"bad\.tar: cannot decode field 'flac' of sample 'k2': cannot read the media"):
        list(Dataset(path, batch_size=5, decode=spec))
    with pytest.raises(DatasetError) as caught:
        list(DataLoader(Dataset(path, batch_size=5, decode=spec), batch_size=None, num_workers=1))
    assert "\n" not in str(caught.value) and "'k2'" in str(caught.value) and "'flac'" in str(caught.value)
    ds = Dataset(path, batch_size=5, decode=spec, on_error="skip", to_tuple=("cls",), tensors="numpy")
    ((labels,),) = list(ds)
    assert labels.tolist() == [0, 1, 3, 4] and ds.decode_stats.skipped == 1 and ds.decode_stats.decoded == 4
    with pytest.raises(DecodeError, match=r"sample 'k0'.*no field wav \(it has: cls, flac\)"):
        list(Dataset(path, batch_size=5, decode={"wav": AudioSpec()}))


def test_64_bit_integer_wavs_decode_and_a_frame_pyav_refuses_is_skipped(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64-bit integer PCM WAV made PyAV raise a ValueError out of decode_audio, which ended an
    on_error="skip" epoch: it decodes now (numpy; PyAV's frames read plane by plane), and what PyAV
    still refuses is the project's DecodeError, skipped and counted."""
    import struct
    import warnings

    from tarproc.decode import audio
    from tarproc.errors import DataWarning

    values = np.array([0.5, -0.25, 0.125, -1.0])
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 64000, 8, 64)
    raw = (values * 2 ** 63).astype("<i8").tobytes()
    samples = [{"__key__": f"k{i}", "wav": encode_audio("wav", 0.1, 8000), "cls": i} for i in range(5)]
    samples[1]["wav"], samples[3]["wav"] = wav_file(fmt, raw), wave64_file(fmt, raw)
    path = str(write_tar(tmp_path / "s64.tar", samples))
    spec = {"wav": AudioSpec(sample_rate=8000, seconds=0.001)}  # 8 samples
    ds = Dataset(path, batch_size=5, decode=spec, on_error="skip", to_tuple=("wav", "cls"), tensors="numpy")
    ((clips, labels),) = list(ds)
    assert labels.tolist() == [0, 1, 2, 3, 4] and ds.decode_stats.skipped == 0
    assert clips[1].tolist() == clips[3].tolist() == [values.tolist() + [0.0] * 4]

    convert = audio._frame_samples

    def refuse_64_bits(frame: Any) -> np.ndarray:  # what PyAV did with them: a ValueError
        if frame.format.name.startswith("s64"):
            raise ValueError("Conversion from 's64' format to numpy array is not supported.")
        return convert(frame)

    monkeypatch.setattr(audio, "_frame_samples", refuse_64_bits)
    ds = Dataset(path, batch_size=5, decode=spec, on_error="skip", to_tuple=("cls",), tensors="numpy")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ((labels,),) = list(ds)
    assert labels.tolist() == [0, 1, 2, 4] and ds.decode_stats.skipped == 1
    skips = [str(w.message) for w in said if issubclass(w.category, DataWarning)]
    assert len(skips) == 1 and "'k3'" in skips[0] and "cannot decode the audio: Conversion from 's64'" in skips[0]
    with pytest.raises(DecodeError, match=r"s64\.tar: cannot decode field 'wav' of sample 'k3'"):
        list(Dataset(path, batch_size=5, decode=spec))


def test_missing_pyav_is_an_error_not_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(write_tar(tmp_path / "f.tar", [{"__key__": "a", "flac": encode_audio("flac", 0.1, 8000)}]))
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tarproc\[media\]'"):
        list(Dataset(path, decode={"flac": AudioSpec()}, on_error="skip"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decode": AudioSpec()}, r"needs the audio field it is for: decode=\{'flac': AudioSpec"),
    ({"decode": VideoSpec()}, "needs the video field"),
    ({"decode": {"wav": 16000}}, "bad decode spec for 'wav'"),
    ({"decode": {3: AudioSpec()}}, "bad decode field 3"),
    ({"decode": "wav"}, "bad decode 'wav'"),
    ({"decode": {"jpg": AugmentSpec(size=8), "png": AugmentSpec(size=8)}}, "one AugmentSpec"),
    ({"decode": {"jpg": AugmentSpec(size=8)}, "image": "png"}, "give the image fields once"),
    ({"decode": {"wav;flac": AudioSpec(), "flac": AudioSpec()}}, "field 'flac' is in two decode specs"),
    ({"decode": {";": AudioSpec()}}, "bad field list"),
    ({"decode": {"jpg": AugmentSpec(size=8), "wav;jpg": AudioSpec()}}, "field 'jpg' is in two decode specs"),
    ({"collate": "zero"}, "bad collate 'zero'"),
    ({"collate": 3}, "bad collate 3"),
    ({"handlers": ["cls"]}, "bad handlers"),
    ({"handlers": {"cls": 3}}, "bad handler for 'cls'"),
])
def test_bad_options_are_named_errors(speech: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        Dataset(speech, **kwargs)


# ---------------------------------------------------------------------------------------------------
# collate


def test_collate_hook_and_pad_errors(speech: str) -> None:
    seen = []

    def lengths_only(rows: list[Any]) -> Any:
        seen.append(len(rows))
        return {"n": np.array([(r["wav"] if "wav" in r else r["flac"]).shape[1] for r in rows])}

    ds = Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000)}, collate=lengths_only,
                 tensors="numpy")
    (batch,) = list(ds)
    assert seen == [5] and batch["n"].tolist() == [s * 8000 for s in SECONDS]
    # the hook runs in DataLoader workers too (a spawned worker gets it pickled: a module function)
    (batch,) = list(DataLoader(Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000)},
                                       collate=_first_key), batch_size=None, num_workers=1))
    assert batch == "utt0"

    def broken(rows: list[Any]) -> Any:
        raise KeyError("nope")

    with pytest.raises(SampleError, match=r"collate 'broken' failed: KeyError"):
        list(Dataset(speech, batch_size=5, collate=broken))
    # pad pads the last axis only: a stereo and a mono clip can't be one array
    mixed = Dataset(speech, batch_size=2, decode={"flac;wav": AudioSpec(sample_rate=8000, channels=None)}, collate="pad",
                    to_tuple=("flac;wav",))
    with pytest.raises(SampleError, match=r"cannot pad column '0'.*\(1, 4000\).*\(2, 8000\)"):
        list(mixed)


def _first_key(rows: list[Any]) -> Any:
    return rows[0]["__key__"]


def test_pad_collate_rules() -> None:
    rows = [{"__key__": "a", "ids": np.array([1, 2, 3]), "img": np.zeros((2, 2, 3)), "cls": 1, "t": "x"},
            {"__key__": "b", "ids": np.array([4]), "img": np.zeros((2, 2, 3)), "cls": 2, "t": "y"}]
    batch = pad_collate(rows)
    assert batch["ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and batch["ids.lengths"].tolist() == [3, 1]
    assert batch["img"].shape == (2, 2, 2, 3) and "img.lengths" not in batch  # 3-D arrays: stacked, not padded
    assert batch["cls"].tolist() == [1, 2] and batch["t"] == ["x", "y"] and batch["__key__"] == ["a", "b"]
    same = pad_collate([{"x": np.ones(2)}, {"x": np.ones(2)}])
    assert same["x.lengths"].tolist() == [2, 2]  # always there: the batch's structure doesn't depend on the data
    tensors = pad_collate([(torch.ones(2),), (torch.ones(4),)])
    assert tensors[0].shape == (2, 4)
    with pytest.raises(SampleError, match="differ in more than their last axis"):
        pad_collate([{"x": np.ones(2, dtype=np.int64)}, {"x": np.ones(2, dtype=np.float32)}])


# ---------------------------------------------------------------------------------------------------
# handlers


def test_default_handlers_of_webdataset(tmp_path: Path) -> None:
    npz, pth = io.BytesIO(), io.BytesIO()
    np.savez(npz, a=np.arange(3), b=np.eye(2))
    torch.save({"w": torch.arange(4)}, pth)
    path = str(write_tar(tmp_path / "h.tar", [{
        "__key__": "k", "npz": npz.getvalue(), "pth": pth.getvalue(), "msgpack": msgpack.packb({"a": [1, 2]}),
        "mp": msgpack.packb("x"), "inx": b"12\n", "transcript": b"hello world", "json.gz": gzip.compress(b'{"z": 1}'),
        "txt.gz": gzip.compress("été".encode()), "bin.gz": gzip.compress(b"\x00\x01"), "seg.cls": b"4",
    }]))
    (batch,) = list(Dataset(path, batch_size=1, tensors="numpy"))
    arrays = batch["npz"][0]
    assert sorted(arrays) == ["a", "b"] and arrays["a"].tolist() == [0, 1, 2] and arrays["b"].shape == (2, 2)
    assert batch["pth"][0]["w"].tolist() == [0, 1, 2, 3]
    assert batch["msgpack"] == [{"a": [1, 2]}] and batch["mp"] == ["x"]
    assert batch["inx"].tolist() == [12] and batch["transcript"] == ["hello world"] and batch["seg.cls"].tolist() == [4]
    assert batch["json.gz"] == [{"z": 1}] and batch["txt.gz"] == ["été"] and batch["bin.gz"] == [b"\x00\x01"]


def test_pth_runs_no_code(tmp_path: Path) -> None:
    import pickle

    class Evil:
        def __reduce__(self) -> Any:
            return (print, ("pwned",))

    data = io.BytesIO()
    torch.save({"x": Evil()}, data, pickle_module=pickle)
    with pytest.raises(DecodeError, match=r"field 'pth' of sample 'k': handler '_pth' failed: UnpicklingError"):
        list(Dataset(str(write_tar(tmp_path / "e.tar", [{"__key__": "k", "pth": data.getvalue()}]))))


def test_cbor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(write_tar(tmp_path / "c.tar", [{"__key__": "k", "cbor": bytes([0xA1, 0x61, 0x61, 0x01])}]))  # {"a": 1}
    try:
        import cbor2  # noqa: F401
    except ImportError:
        pass
    else:
        assert list(Dataset(path, tensors="numpy"))[0]["cbor"] == [{"a": 1}]
    monkeypatch.setitem(sys.modules, "cbor2", None)
    with pytest.raises(MissingDependencyError, match="pip install cbor2"):
        list(Dataset(path, on_error="skip"))  # a missing package is not the sample's fault: no skip
    assert list(Dataset(path, handlers={"cbor": None}, tensors="numpy"))[0]["cbor"] == [bytes([0xA1, 0x61, 0x61, 0x01])]


def test_handlers_extend_the_defaults(tmp_path: Path) -> None:
    path = str(write_tar(tmp_path / "x.tar", [
        {"__key__": "k", "cls": b"3", "json": b'{"a": 1}', "txt": b"hi", "seg.png": b"PNG?", "npy.gz": b"?"}
    ]))
    (batch,) = list(Dataset(path, handlers={"cls": float, "seg.png": len, "json": None}, tensors="numpy", map=_no_gz))
    assert batch["cls"].tolist() == [3.0] and batch["seg.png"].tolist() == [4]  # overridden, by extension and name
    assert batch["json"] == [b'{"a": 1}'] and batch["txt"] == ["hi"]  # None keeps bytes; the other defaults stay
    (batch,) = list(Dataset(path, handlers={"cls": int}, default_handlers=False, tensors="numpy", map=_no_gz))
    assert batch["cls"].tolist() == [3] and batch["txt"] == [b"hi"] and batch["json"] == [b'{"a": 1}']
    with pytest.raises(DecodeError, match=r"field 'npy.gz' of sample 'k': handler 'gz\+_npy' failed"):
        list(Dataset(path))
    assert merge_handlers(None) == DEFAULT_HANDLERS and merge_handlers({"gz": None})["gz"] is None
    assert handler_for("npy.gz", merge_handlers({"gz": None})) is None  # a handler for gz itself wins


def _no_gz(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.endswith(".gz")}


def test_gunzip_limits() -> None:
    assert gunzip(gzip.compress(b"x" * 100), limit=100) == b"x" * 100
    with pytest.raises(ValueError, match="more than 99 bytes"):
        gunzip(gzip.compress(b"x" * 100), limit=99)
    with pytest.raises(ValueError, match="cut short"):
        gunzip(gzip.compress(b"x" * 100)[:-12])


def test_gunzip_reads_every_member() -> None:
    # pigz, bgzip and `cat a.gz b.gz` write several members: all of them are the data (as gzip -d
    # says), and the limit is on them together
    two = gzip.compress(b"x" * 60) + gzip.compress(b"y" * 60)
    assert gunzip(two) == b"x" * 60 + b"y" * 60
    assert handler_for("txt.gz", DEFAULT_HANDLERS)(gzip.compress(b"ab") + gzip.compress(b"cd")) == "abcd"
    with pytest.raises(ValueError, match="more than 100 bytes"):
        gunzip(two, limit=100)
    with pytest.raises(ValueError, match="cut short"):
        gunzip(two[:-12])


def test_an_npz_field_that_inflates_past_the_limit_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # its arrays are compressed (savez_compressed): a small field can be gigabytes of zeros
    from tarproc.dataset import fields

    packed = io.BytesIO()
    np.savez_compressed(packed, a=np.zeros(1 << 16, np.uint8))
    assert len(packed.getvalue()) < 1000
    assert fields.DEFAULT_HANDLERS["npz"](packed.getvalue())["a"].shape == (1 << 16,)
    monkeypatch.setattr(fields, "DEFAULT_MAX_MEMBER_SIZE", 1 << 15)
    with pytest.raises(ValueError, match="more than 32,768"):
        fields.DEFAULT_HANDLERS["npz"](packed.getvalue())


def test_decode_audio_matches_the_dataset(speech: str) -> None:
    """The dataset's rows are decode_audio of the field with the sample's plan key, nothing more."""
    spec = AudioSpec(sample_rate=8000, seconds=0.3, random_crop=True, seed=0)
    ds = Dataset(speech, batch_size=5, decode={"flac;wav": spec}, to_tuple=("flac;wav",), tensors="numpy")
    ((audio,),) = list(ds)
    from tarproc.samples import read_samples

    for row, sample in zip(audio, read_samples(speech), strict=True):
        data = sample.get("flac", sample.get("wav"))
        assert np.array_equal(row, decode_audio(data, spec, plan_key(sample["__key__"], 0)))


def test_media_dataset_pickles_for_spawned_workers(speech: str) -> None:
    import pickle

    ds = Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000, seconds=0.3, random_crop=True)},
                 collate="pad", to_tuple=("flac;wav",), tensors="numpy")
    copy = pickle.loads(pickle.dumps(ds))
    ((a,),), ((b,),) = list(ds), list(copy)
    assert a.shape == (5, 1, 2400) and np.array_equal(a, b)
    # in a dict batch, alternatives are separate fields: pad says so rather than padding a hole
    with pytest.raises(SampleError, match=r"cannot pad field 'wav': 2 of the batch's 5 samples have no such field"):
        list(Dataset(speech, batch_size=5, decode={"flac;wav": AudioSpec(sample_rate=8000)}, collate="pad"))
    hooked = pickle.loads(pickle.dumps(Dataset(speech, batch_size=5, collate=_first_key)))
    assert list(hooked) == ["utt0"]


def test_pad_collate_names_a_value_of_another_rank() -> None:
    # a 0-d array among 1-d ones: the error names the column, it is not an internal StopIteration
    rows = [{"__key__": "a", "x": np.arange(3)}, {"__key__": "b", "x": np.array(7)}]
    with pytest.raises(SampleError, match=r"cannot pad column 'x'.*int64 \(3,\) and int64 \(\)"):
        pad_collate(rows)
