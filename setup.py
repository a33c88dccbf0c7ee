"""Build the optional C fast path of the tar reader; metadata lives in pyproject.toml.

The extension is optional: without a C compiler tarproc installs and runs on its pure-Python
reader (the reference implementation), only slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tarproc._speedups", ["tarproc/_speedups.c"], optional=True)])
