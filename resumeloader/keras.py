"""Keras 3 ``fit`` that resumes at the exact batch: `ResumeCallback` and `epoch_dataset`.

The code lives in `resumeloader.integrations.keras`; see its docstrings.
"""

from resumeloader.integrations.keras import ResumeCallback, epoch_dataset

__all__ = ["ResumeCallback", "epoch_dataset"]
