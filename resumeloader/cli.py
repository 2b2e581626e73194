"""The ``resumeloader`` command (``demo``, ``inspect``, ``verify``): `resumeloader.tools.cli`."""

from resumeloader.tools.cli import main

__all__ = ["main"]
