"""The runner hands a processor its requests as one ``RequestBatch`` (columns): a processor
that indexes, slices or iterates it gets the ``OutputRequest``s it always got."""

from __future__ import annotations

from mmirage.core.process.base import OutputRequest, RequestBatch


def _batch(urls: list[list[str]] | None) -> RequestBatch:
    return RequestBatch(
        "caption",
        ["0::0", "0::1", "0::2"],
        ["p0", "p1", None],
        urls,
        [{"a": 0}, {"a": 1}, {"a": 2}],
        [{"id": 0}, {"id": 1}, {"id": 2}],
        [10, 11, 12],
    )


def test_a_batch_reads_as_its_requests() -> None:
    batch = _batch([["u0"], [], ["u2", "u3"]])
    expected = [
        OutputRequest("0::0", "caption", "p0", ["u0"], {"a": 0}, {"id": 0}, 10),
        OutputRequest("0::1", "caption", "p1", [], {"a": 1}, {"id": 1}, 11),
        OutputRequest("0::2", "caption", None, ["u2", "u3"], {"a": 2}, {"id": 2}, 12),
    ]
    assert len(batch) == 3
    assert list(batch) == expected
    assert [batch[i] for i in range(3)] == expected
    assert batch[-1] == expected[-1]
    assert batch[1:] == expected[1:]
    assert batch[::2] == expected[::2]


def test_without_images_each_request_has_a_list_of_its_own() -> None:
    batch = _batch(None)
    first, second = batch[0], batch[1]
    assert first.image_urls == [] and second.image_urls == []
    first.image_urls.append("mine")
    assert batch[1].image_urls == [] and batch[0].image_urls == []


def test_of_turns_requests_into_columns_and_keeps_a_batch() -> None:
    requests = list(_batch([["u0"], [], []]))
    batch = RequestBatch.of(requests)
    assert batch.row_keys == ["0::0", "0::1", "0::2"]
    assert batch.prompts == ["p0", "p1", None]
    assert list(batch) == requests
    assert RequestBatch.of(batch) is batch
    assert len(RequestBatch.of([])) == 0
