"""Verification tools: resume checks, the kill-and-restart harness, traces, reports, the
demo, checkpoint inspection, run plans and the CLI. Public entry points:
`resumeloader.testing` and the ``resumeloader`` command."""
