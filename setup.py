"""Build the optional C fast paths; metadata lives in pyproject.toml.

Both extensions are optional: without a C compiler tarproc installs and runs on its pure-Python
tar reader (the reference implementation), and without libjpeg-turbo's headers (Debian:
libjpeg62-turbo-dev) the cpu decode backend uses simplejpeg and Pillow for every image: the same
pixels, only slower for training crops.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("tarproc._speedups", ["tarproc/_speedups.c"], optional=True),
    Extension("tarproc._jpeg", ["tarproc/_jpeg.c"], libraries=["jpeg"], extra_compile_args=["-O3"], optional=True),
])
