"""tfds data sources: read by batch and identified by builder, version, split and file
instructions (a tiny dataset built locally by a builder defined here; no download)."""

from __future__ import annotations

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("array_record")

from resumeloader import ResumableLoader, StateMismatchError  # noqa: E402
from resumeloader.sources import TFDSSource, adapt  # noqa: E402


class Tiny(tfds.core.GeneratorBasedBuilder):
    """40 examples of an id and a word, generated here."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict(
            {"id": tfds.features.Scalar(np.int64), "word": tfds.features.Text()}
        )
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(40)}

    def _generate_examples(self, count):
        for i in range(count):
            yield i, {"id": i, "word": f"w{i}"}


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    built = Tiny(data_dir=str(tmp_path_factory.mktemp("tfds")), file_format="array_record")
    built.download_and_prepare()
    return built


def test_adapt_tfds_data_source_reads_through_tfds_source(builder):
    """A tfds data source is recognised, and its records come through the loader."""
    data = builder.as_data_source(split="train[:10]")
    loader = ResumableLoader(data, batch_size=10, seed=0, shuffle=False, num_epochs=1)

    batch = next(iter(loader))

    assert isinstance(adapt(data), TFDSSource)
    assert batch["id"].numpy().tolist() == [data[i]["id"] for i in range(10)]
    assert batch["word"].numpy().tolist() == [data[i]["word"] for i in range(10)]


def test_loader_restore_with_other_tfds_split_slice_refused(builder):
    """train[:10] and train[10:20] have as many records, other identities: refused."""
    make = lambda split: ResumableLoader(  # noqa: E731
        builder.as_data_source(split=split), batch_size=4, seed=0
    )
    state = make("train[:10]").get_state()

    with pytest.raises(StateMismatchError) as info:
        make("train[10:20]").set_state(state)

    message = str(info.value)
    assert "source.identity: checkpoint has 'tfds tiny/1.0.0 train[:10]" in message
    assert "this loader has 'tfds tiny/1.0.0 train[10:20]" in message


def test_loader_restore_with_same_tfds_split_accepted(builder):
    """The same builder, version and split restores (another data source object)."""
    make = lambda: ResumableLoader(  # noqa: E731
        builder.as_data_source(split="train[:10]"), batch_size=4, seed=0
    )
    first = make()
    first.advance(1)

    again = make()
    again.set_state(first.get_state())

    assert again.position == 4
