"""Workers: a frozen option value, each field checked, each kind mapped to its backend once."""

from __future__ import annotations

import dataclasses

import pytest

from resumeloader import Workers
from resumeloader.workers import registry


def test_workers_default_kind_follows_the_number_of_workers():
    """No workers: the calling thread; workers: threads, unless told otherwise."""
    assert Workers().kind == "inline" and Workers(0).num_workers == 0
    assert Workers(2).kind == "thread"
    assert Workers(2, kind="process", timeout=3, window=5) == Workers(
        num_workers=2, kind="process", timeout=3.0, window=5
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [({"num_workers": -1}, ValueError, "`num_workers`"),
     ({"num_workers": 1.5}, TypeError, "`num_workers`"),
     ({"num_workers": 2, "kind": "fork"}, ValueError, "`kind` must be one of 'inline'"),
     ({"num_workers": 2, "timeout": 0}, ValueError, "`timeout`"),
     ({"num_workers": 2, "timeout": float("nan")}, ValueError, "`timeout`"),
     ({"num_workers": 2, "timeout": "1"}, TypeError, "`timeout`"),
     ({"num_workers": 2, "window": 0}, ValueError, "`window`"),
     ({"timeout": 1.0}, ValueError, "`timeout` needs num_workers >= 1"),
     ({"window": 3}, ValueError, "`window` needs num_workers >= 1"),
     ({"num_workers": 2, "kind": "inline"}, ValueError, "kind='inline'"),
     ({"kind": "thread"}, ValueError, "kind='thread' needs num_workers >= 1"),
     ({"kind": "process"}, ValueError, "kind='process' needs num_workers >= 1"),
     ({"num_workers": "fast"}, ValueError, "a non-negative integer or 'auto'"),
     ({"num_workers": "auto", "kind": "thread"}, ValueError, "'auto' without a kind"),
     ({"num_workers": 2, "kind": "auto"}, ValueError, "chooses the number of workers"),
     ({"kind": "auto", "window": 2}, ValueError, "`window` is not an option of kind='auto'"),
     ({"kind": "auto", "options": 3}, TypeError, "a Tuning or None")],
    ids=["negative", "float", "unknown-kind", "timeout-zero", "timeout-nan", "timeout-str",
         "window-zero", "timeout-inline", "window-inline", "inline-with-workers",
         "threads-without-workers", "processes-without-workers", "fast", "auto-thread",
         "auto-count", "auto-window", "auto-options"],
)
def test_workers_invalid_raises_naming_field(kwargs, error, fragment):
    """Each invalid field, or one its kind cannot take, is refused on construction."""
    with pytest.raises(error) as info:
        Workers(**kwargs)
    assert fragment in str(info.value) and "Received:" in str(info.value)


def test_workers_is_a_frozen_value():
    """Workers compare by value and cannot be changed."""
    workers = Workers(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        workers.num_workers = 3  # type: ignore[misc]
    assert dataclasses.replace(workers, kind="process") == Workers(2, kind="process")


@pytest.mark.parametrize("kind", sorted(registry.BACKENDS))
def test_registry_maps_every_kind_to_a_backend_class_of_that_kind(kind):
    """Each registered kind names a class that says it is that kind."""
    assert registry.backend_class(kind).kind == kind


@dataclasses.dataclass(frozen=True)
class FakeOptions:
    """The options value of the fake kind."""

    label: str = "default"


class FakeBackend:
    """A backend of this test module: what a new kind needs (one class, one registry entry)."""

    kind = "fake"
    option_fields = ("window",)
    options_type = FakeOptions

    def __init__(self, workers, producer):
        self.producer = producer

    @classmethod
    def check(cls, workers):
        pass


def test_registered_backend_is_chosen_by_its_kind_and_refuses_other_kinds_fields(monkeypatch):
    """A kind added to the registry is what `Workers(kind=...)` builds, with its own options
    value (its default when none is given); a field that its backend does not take is
    refused, naming the fields it takes."""
    monkeypatch.setitem(registry.BACKENDS, "fake", f"{__name__}:FakeBackend")
    workers = Workers(3, kind="fake", window=4, options=FakeOptions("mine"))
    assert isinstance(workers.backend(producer="p"), FakeBackend)
    assert workers.options == FakeOptions("mine")
    assert Workers(3, kind="fake").options == FakeOptions()
    with pytest.raises(ValueError, match=r"`timeout` is not an option of kind='fake' \(its "
                                         r"options: window\)") as info:
        Workers(3, kind="fake", timeout=2.0)
    assert "Received: timeout=2.0." in str(info.value)
