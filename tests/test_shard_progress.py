"""The shard progress bar counts rows as they finish (a row when its last output is done or
when it fails), not a processing group at a time: a run that is one group long moves."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from mmirage.config import load_mmirage_config_dict
from mmirage.core.loader import open_datasets, plan_shard
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.shard.answers import AnswerStore
from mmirage.core.shard.progress import RowCount, RowProgress
from mmirage.core.shard.reading import groups_from, source_offsets
from mmirage.core.shard.rows import RowWorker


class Streaming(Processor):
    """Answers one request at a time, noting how many rows the worker counted done after
    each answer of each output; row 2's first output fails."""

    def __init__(self) -> None:
        self.count = RowCount()
        self.seen: dict[str, list[int]] = {}

    async def stream(
        self, output: Any, requests: Sequence[OutputRequest]
    ) -> AsyncIterator[tuple[int, OutputResult]]:
        for index, request in enumerate(requests):
            if output.name == "a" and request.row_key.endswith(":2"):
                yield index, OutputResult(error="429 rate limited", retryable=True)
            else:
                yield index, OutputResult(value=f"<{request.prompt}>")
            self.seen.setdefault(output.name, []).append(self.count.done)

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        raise AssertionError("streamed")

    async def aclose(self) -> None:
        pass


async def test_rows_count_as_they_finish_not_per_group(tmp_path: Path) -> None:
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(8)))
    config = load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "base_url": "http://127.0.0.1:9", "model": "m"}],
            "loading_params": {
                "datasets": [{"path": str(rows), "type": "JSONL", "output_dir": str(tmp_path)}],
                "state_dir": str(tmp_path / "state"),
                "batch_size": 8,
            },
            "processing_params": {
                "inputs": [{"name": "text", "key": "text"}],
                "outputs": [
                    {"name": "a", "type": "llm", "prompt": "A {{ text }}"},
                    {"name": "b", "type": "llm", "prompt": "B {{ a }}"},
                ],
                "output_schema": {"b": "{{ b }}"},
            },
        }
    )
    sources = open_datasets(config.loading_params.datasets)
    shard = plan_shard(sources, 1, 0)[0]
    proc = Streaming()
    store = AnswerStore(tmp_path, "shard-0-of-1")
    store.open()
    worker = RowWorker(config, shard, source_offsets(sources), {"llm": proc}, store, proc.count)
    ((_, group),) = groups_from(shard, worker_cursor(), 100)
    records = await worker.process(group)
    store.close()
    # While the first output runs, only the row it failed is finished...
    assert proc.seen["a"] == [0, 0, 1, 1, 1, 1, 1, 1]
    # ...then every answer of the last output finishes one more row, before the group lands.
    assert proc.seen["b"] == [2, 3, 4, 5, 6, 7, 8]
    assert (proc.count.done, proc.count.failed) == (8, 1) == (len(records), 1)


def worker_cursor() -> Any:
    from mmirage.core.shard.output import ShardCheckpoint

    return ShardCheckpoint()


async def test_the_bar_takes_the_counts_at_its_own_pace() -> None:
    progress = RowProgress(10, "shard 0", done=2, failed=1)
    added: list[tuple[int, int]] = []
    progress.bar.add = lambda done, failed=0: added.append((done, failed))  # type: ignore[method-assign]
    progress.count.finish(failed=False)
    progress.count.finish(failed=True)
    assert added == []  # nothing drawn on the hot path
    progress.close()  # the last counts reach the bar when it closes
    assert added == [(2, 1)]
