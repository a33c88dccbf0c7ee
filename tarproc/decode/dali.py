"""The ``dali-cpu`` and ``gpu`` backends: one NVIDIA DALI graph, fed with encoded bytes and plans.

The graph: ``fn.external_source`` of encoded bytes and of each image's plan (window start/end,
output size, flip flag, rotation angle and colour parameters, all computed on the host by
``AugmentSpec.plan``), ``fn.decoders.image`` (``device="mixed"``: the GPU and its hardware JPEG
engine; ``"cpu"`` with ``device_id=None``: no GPU needed), ``fn.resize`` of the window with
antialiased linear interpolation (when the spec rotates: of the source region under the rotated
window, then ``fn.warp_affine``, as ``rotation_steps`` says),
``fn.color_twist`` (only when the spec jitters colours) and ``fn.crop_mirror_normalize`` for flip,
mean/std, dtype and layout. The operators run where the decoder puts the images: on the GPU after
``mixed``.

A DALI pipeline is no longer usable after an error, and one bad image fails its whole batch: the
pipeline is then rebuilt, each image of the batch is checked on the cpu path, and the good ones go
through DALI again (or, should that fail too, keep their cpu results), so one bad image never
loses the rest of its batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..content import jpeg_ends
from .cpu import CpuDecoder, ImageError, Job, Result, image_size
from .spec import AugmentSpec, Plan, rotation_steps

_DTYPES = {"uint8": "UINT8", "float16": "FLOAT16", "float32": "FLOAT"}


def dali_available() -> bool:
    """True when NVIDIA DALI can be imported (``pip install tarproc[gpu]``)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def _dali(module: str) -> Any:
    """A DALI module, typed Any: DALI's own type hints don't describe its generated operators."""
    return importlib.import_module(f"nvidia.dali.{module}")


def gpu_count() -> int:
    """CUDA devices DALI sees (0 without DALI, driver or GPU)."""
    try:
        return int(_dali("backend").GetCUDADeviceCount())
    except Exception:  # no DALI, no driver, no device: all mean "no GPU"
        return 0


class DaliDecoder:
    """Decode batches of jobs with a DALI pipeline on the CPU (``gpu=False``) or the GPU."""

    def __init__(
        self, spec: AugmentSpec, batch_size: int = 64, threads: int = 2, gpu: bool = False, device_id: int = 0
    ) -> None:
        if not dali_available():
            from ..errors import OptionError

            raise OptionError("the DALI backends need NVIDIA DALI: pip install 'tarproc[gpu]'")
        self.spec = spec
        self.batch_size = batch_size
        self.threads = threads
        self.gpu = gpu
        self.device_id = device_id
        self.name = "gpu" if gpu else "dali-cpu"
        self.retries = 0  # batches that failed in DALI and were sorted out image by image
        self._cpu = CpuDecoder(spec, 1, dct_scaling=False)
        self._pipe: Any = None
        self._build()

    def describe(self) -> str:
        where = f"GPU {self.device_id}, mixed decoder" if self.gpu else "CPU"
        return f"{self.name} (NVIDIA DALI on {where}, {self.threads} threads, batches of {self.batch_size})"

    def _build(self) -> None:
        fn, types = _dali("fn"), _dali("types")
        pipeline_def = _dali("pipeline").pipeline_def

        spec = self.spec
        mean, std = spec.mean_std_255
        geometric = spec.geometric

        # feed_input needs the data before run(): no prefetching and no asynchronous execution
        @pipeline_def(
            batch_size=self.batch_size, num_threads=self.threads,
            device_id=self.device_id if self.gpu else None,
            prefetch_queue_depth=1, exec_async=False, exec_pipelined=False,
        )
        def graph() -> Any:
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
            images = fn.decoders.image(encoded, device="mixed" if self.gpu else "cpu",
                                       output_type=types.RGB, adjust_orientation=False)
            if spec.rotate:
                # the rotated window in the same two steps as the cpu backend (rotation_steps)
                start = fn.external_source(name="start", dtype=types.FLOAT, ndim=1)
                end = fn.external_source(name="end", dtype=types.FLOAT, ndim=1)
                size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1)
                matrix = fn.external_source(name="matrix", dtype=types.FLOAT, ndim=2)
                out_size = fn.external_source(name="out_size", dtype=types.FLOAT, ndim=1)
                images = fn.resize(images, roi_start=start, roi_end=end, size=size,
                                   interp_type=types.INTERP_LINEAR, antialias=True)
                images = fn.warp_affine(images, matrix=matrix, size=out_size, fill_value=0,
                                        interp_type=types.INTERP_LINEAR, inverse_map=True)
            elif geometric:
                start = fn.external_source(name="start", dtype=types.FLOAT, ndim=1)
                end = fn.external_source(name="end", dtype=types.FLOAT, ndim=1)
                size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1)
                images = fn.resize(images, roi_start=start, roi_end=end, size=size,
                                   interp_type=types.INTERP_LINEAR, antialias=True)
            if spec.jitter:
                color = {name: fn.external_source(name=name, dtype=types.FLOAT, ndim=0)
                         for name in ("brightness", "contrast", "saturation", "hue")}
                images = fn.color_twist(images, **color)  # uint8 out: rounded and clipped, as on the cpu
            return fn.crop_mirror_normalize(
                images, mirror=flip, mean=mean, std=std, dtype=getattr(types, _DTYPES[spec.output_dtype]),
                output_layout=spec.layout,
            )

        self._pipe = graph()
        self._pipe.build()

    def _feed(self, datas: list[bytes], plans: list[Plan], sizes: list[tuple[int, int]]) -> Any:
        """Run one batch; ``sizes`` are the images' stored (height, width), which rotation needs."""
        pipe = self._pipe
        pipe.feed_input("encoded", [np.frombuffer(d, np.uint8) for d in datas])
        pipe.feed_input("flip", [np.array(int(p.flip), np.int32) for p in plans])
        if self.spec.rotate:
            steps = []
            for plan, (h, w) in zip(plans, sizes, strict=True):
                # a window wholly outside the rotated image: any region, sampled far outside it
                steps.append(rotation_steps(plan, w, h) or ((0, 0, w, h), (1, 1), (0, 0, -1e6, 0, 0, -1e6)))
            # DALI takes coordinates in tensor shape order: (y, x) and (height, width)
            pipe.feed_input("start", [np.array([b[1], b[0]], np.float32) for b, _, _ in steps])
            pipe.feed_input("end", [np.array([b[3], b[2]], np.float32) for b, _, _ in steps])
            pipe.feed_input("size", [np.array([sz[1], sz[0]], np.float32) for _, sz, _ in steps])
            pipe.feed_input("matrix", [np.array(m, np.float32).reshape(2, 3) for _, _, m in steps])
            pipe.feed_input("out_size", [np.array([p.out[1], p.out[0]], np.float32) for p in plans])
        elif self.spec.geometric:
            pipe.feed_input("start", [np.array([p.window[1], p.window[0]], np.float32) for p in plans])
            pipe.feed_input("end", [np.array([p.window[3], p.window[2]], np.float32) for p in plans])
            pipe.feed_input("size", [np.array([p.out[1], p.out[0]], np.float32) for p in plans])
        if self.spec.jitter:
            neutral = (1.0, 1.0, 1.0, 0.0)
            for i, name in enumerate(("brightness", "contrast", "saturation", "hue")):
                pipe.feed_input(name, [np.array((p.color or neutral)[i], np.float32) for p in plans])
        (out,) = pipe.run()
        return out

    def run_on_device(self, datas: list[bytes], plans: list[Plan]) -> Any:
        """One batch, left where DALI put it (a TensorList; on the GPU, for DLPack hand-over).

        The buffers are reused by the next call: consume or copy them first.
        """
        return self._feed(datas, plans, [image_size(d) for d in datas])

    def _run_dali(self, datas: list[bytes], plans: list[Plan], sizes: list[tuple[int, int]]) -> list[np.ndarray]:
        out = self._feed(datas, plans, sizes)
        if self.gpu:
            out = out.as_cpu()
        return [np.array(t) for t in out]

    def run(self, batches: Iterable[list[Job]]) -> Iterator[list[Result]]:
        for batch in batches:
            yield self.decode_batch(batch)

    def decode_batch(self, batch: list[Job]) -> list[Result]:
        results: list[Result] = [None] * len(batch)
        good: list[int] = []
        plans: list[Plan] = []
        sizes: list[tuple[int, int]] = []
        for i, (data, key) in enumerate(batch):
            if self.gpu and data[:3] == b"\xff\xd8\xff" and not jpeg_ends(data):
                # GPU decoders decode a cut stream without a word: the cpu path's rule, checked here
                results[i] = ImageError("damaged JPEG data: cut short (no end-of-image marker after its scan)")
                continue
            try:
                h, w = image_size(data)
                plan = self.spec.plan(key, h, w)
            except ImageError as e:
                results[i] = e
                continue
            except ValueError as e:
                results[i] = ImageError(str(e))
                continue
            good.append(i)
            plans.append(plan)
            sizes.append((h, w))
        if not good:
            return results
        try:
            arrays = self._run_dali([batch[i][0] for i in good], plans, sizes)
        except RuntimeError:
            return self._sort_out(batch, results, good, plans, sizes)
        for i, array in zip(good, arrays, strict=True):
            results[i] = array
        return results

    def _sort_out(
        self, batch: list[Job], results: list[Result], good: list[int], plans: list[Plan], sizes: list[tuple[int, int]]
    ) -> list[Result]:
        """After a failed batch: find the bad images on the cpu path, run the rest through DALI again."""
        self.retries += 1
        self._build()
        survivors, survivor_plans, survivor_sizes = [], [], []
        for i, plan, size in zip(good, plans, sizes, strict=True):
            results[i] = self._cpu.decode_one(batch[i])
            if not isinstance(results[i], ImageError):
                survivors.append(i)
                survivor_plans.append(plan)
                survivor_sizes.append(size)
        if survivors:
            try:
                arrays = self._run_dali([batch[i][0] for i in survivors], survivor_plans, survivor_sizes)
            except RuntimeError:
                self._build()  # DALI can't read an image Pillow can: keep the cpu results
            else:
                for i, array in zip(survivors, arrays, strict=True):
                    results[i] = array
        return results

    def close(self) -> None:
        self._pipe = None
        self._cpu.close()
