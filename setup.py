"""Build the optional C accelerator ``admission.intent._speedups``.

Everything else about the package is declared in pyproject.toml.  The
extension is ``optional``: where it cannot be compiled (no compiler, no Python
headers) the build warns and installs the pure-Python package, which encodes
the same bytes, only slower (admission/intent/_encoding.py is the definition).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "admission.intent._speedups",
            sources=["admission/intent/_speedups.c"],
            optional=True,
        )
    ],
)
