"""The package version: the newest version heading of CHANGELOG.md (a test keeps them equal)."""

__version__ = "0.4.0"
