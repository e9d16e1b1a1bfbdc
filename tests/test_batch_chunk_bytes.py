"""``max_chunk_bytes`` is the size of the uploaded file (the spec's Batch API page): every
JSONL line counts with its newline, read back from the provider's files API."""

from __future__ import annotations

import itertools
from pathlib import Path

from batch_spec_support import mmirage
from provider_emulator import EmulatorConfig, running_emulator
from test_batch_spec import by_chunk, key_env, oai, ok, prepare, question_rows, spooled_sizes


def test_every_uploaded_file_fits_max_chunk_bytes_newlines_included(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(seed=25)) as emu:
        probe = prepare(tmp_path / "probe", emu, question_rows())
        ok(mmirage("run", "--config", probe.config, env=key_env()))
        (receipt,) = probe.lines()
        # What the first three requests fill without their newlines: with them, two fit.
        limit = sum(spooled_sizes(receipt)[:3]) - 3
        made = prepare(tmp_path / "run", emu, question_rows(), max_chunk_bytes=limit)
        ok(mmirage("run", "--config", made.config, env=key_env()))
        client = oai(emu)
        lines = by_chunk(made.lines())
        uploaded = [
            client.files.content(client.batches.retrieve(line["provider_batch_id"]).input_file_id)
            for line in lines
        ]
        files = [upload.content for upload in uploaded]
        assert [len(data) for data in files] == [line["total_bytes"] for line in lines]
        assert all(len(data) <= limit for data in files), ([len(d) for d in files], limit)
        chunks = [data.splitlines(keepends=True) for data in files]
        assert len(chunks[0]) == 2 and sum(len(chunk) for chunk in chunks) == 12
        for chunk, following in itertools.pairwise(chunks):
            assert sum(map(len, chunk)) + len(following[0]) > limit  # never split needlessly
