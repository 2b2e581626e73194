"""``MODULE:FACTORY``: how the commands that run your code (``show``, ``plan``) find your loader.

``MODULE`` is a module importable from the current directory (``train`` for
``train.py``, ``my_project.data``) or the path of a Python file (``data/input.py``);
``FACTORY`` a function of no arguments in it returning a `ResumableLoader` or a
`Pipeline` (with a batch stage). `build` imports the module and calls the function.
Nothing here imports TensorFlow: it is loaded only if your module loads it (building a
`ResumableLoader` does, a `Pipeline` does not), so a command that needs only the
order (``plan``) stays TensorFlow-free for a pipeline factory.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib

__all__ = ["Made", "build", "loader_of"]

_LOADER_MODULE = "resumeloader.tfdata.loader"


class Made:
    """What a factory made: a loader, or a pipeline.

    Attributes:
        value: the `ResumableLoader` or `Pipeline` itself.
        plan: its `Plan` (a pipeline's: endless, the whole order as one shard).
        loader: the loader, or None for a pipeline.
    """

    def __init__(self, value: Any, spec: str, option: str) -> None:
        self.value = value
        self.loader = value if _is_loader(value) else None
        if self.loader is not None:
            self.plan: plan_lib.Plan = self.loader.plan
        elif isinstance(value, pipeline_lib.Pipeline):
            self.plan = plan_lib.Plan(value, num_epochs=None)
        else:
            msg = (
                f"{option} {spec!r} must return a ResumableLoader or a Pipeline. Received: "
                f"{type(value).__name__}."
            )
            raise ValueError(msg)


def _is_loader(value: Any) -> bool:
    module = sys.modules.get(_LOADER_MODULE)  # a loader exists only once it is imported
    return module is not None and isinstance(value, module.ResumableLoader)


def _module(name: str, spec: str, option: str) -> Any:
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            msg = f"{option} {spec!r} names no file: {path} does not exist."
            raise ValueError(msg)
        module_name = os.path.splitext(os.path.basename(path))[0]
        found = importlib.util.spec_from_file_location(module_name, path)
        assert found is not None and found.loader is not None
        module = importlib.util.module_from_spec(found)
        sys.modules[module_name] = module  # pickling (process workers) finds it by name
        found.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def build(spec: str, *, option: str = "MODULE:FACTORY") -> Made:
    """Imports ``MODULE`` of `spec` (``"MODULE:FACTORY"``), calls ``FACTORY()``, returns
    what it made.

    Args:
        spec: ``"module:function"`` or ``"path/to/file.py:function"``.
        option: how messages name the argument (e.g. ``"--pipeline"``).

    Raises:
        ValueError: `spec` is not ``MODULE:FACTORY``, names no module or function, or
            the function returns neither a `ResumableLoader` nor a `Pipeline`.
    """
    name, _, function_name = spec.rpartition(":")
    if not name or not function_name:
        msg = f"{option} must be MODULE:FACTORY. Received: {option} {spec!r}."
        raise ValueError(msg)
    try:
        function = getattr(_module(name, spec, option), function_name)
    except (ImportError, AttributeError) as err:
        msg = f"{option} {spec!r} names no function: {err}."
        raise ValueError(msg) from err
    if not callable(function):
        msg = f"{option} {spec!r} names {type(function).__name__} {function!r:.60}, not a function."
        raise ValueError(msg)
    return Made(function(), spec, option)


def loader_of(made: Made) -> Any:
    """The loader `made` is, or a loader of its pipeline (which imports TensorFlow)."""
    if made.loader is not None:
        return made.loader
    from resumeloader.tfdata import loader as loader_lib

    return loader_lib.ResumableLoader.from_pipeline(made.value)
