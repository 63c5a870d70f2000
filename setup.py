"""Builds the compiled core, eventspool._core.native, with this machine's C compiler.

Everything else about the package is in pyproject.toml; setuptools reads this file only
for the extension module, which pyproject.toml cannot declare with Cython sources.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# -O2, unless CFLAGS names a level of its own, as the sanitizer test's build does.
LEVEL_GIVEN = any(flag.startswith("-O") for flag in os.environ.get("CFLAGS", "").split())
OPTIMISATION = [] if LEVEL_GIVEN else ["-O2"]

CORE = Extension(
    "eventspool._core.native",
    sources=["src/eventspool/_core/native.pyx"],
    depends=[
        "src/eventspool/_core/bytes_util.h",
        "src/eventspool/_core/fault_in.h",
        "src/eventspool/_core/delivery.pxi",
        "src/eventspool/_core/envelope.pxi",
        "src/eventspool/_core/handoff.pxi",
        "src/eventspool/_core/mapped_file.pxi",
        "src/eventspool/_core/ids.pxi",
        "src/eventspool/_core/intake.pxi",
        "src/eventspool/_core/record.pxi",
        "src/eventspool/_core/ring.pxi",
        "src/eventspool/_core/route.pxi",
        "src/eventspool/_core/transfer.pxi",
        "src/eventspool/_core/wire.pxi",
    ],
    extra_compile_args=[*OPTIMISATION, "-Wno-unused-function"],
)

setup(ext_modules=cythonize([CORE], language_level=3))
