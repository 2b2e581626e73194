"""The ``resumeloader`` command (a façade of `resumeloader.tools.cli`)."""

from resumeloader.tools.cli import main

__all__ = ["main"]
