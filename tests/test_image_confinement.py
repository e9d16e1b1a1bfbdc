"""A row's image path is data: one that leads out of ``image_base_path`` (``..``, an absolute
path, a ``file://`` URL, a symlink) or to a file that is no image is that row's recorded error,
naming the path, and the file's bytes reach no output: not a shard, not a request sent live or
in a batch, not the ``--export-prompts`` file, not an error message.

The same hostile rows go through a live ``llm`` run, a ``batch_api`` run and a dry run.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from batch_spec_support import cli_env, mmirage, read_jsonl, shard_rows, write_rows, write_yaml
from llm_kit.errors import ItemError
from llm_kit.images import MAX_IMAGE_BYTES, split_data_url
from llm_kit.providers.anthropic import AnthropicCodec
from llm_kit.types import ImagePart, Message
from mmirage.config.processing_params import InputVar, ProcessingParams
from mmirage.core.render.variables import RowError, VariableExtractor, resolve_image
from provider_emulator.runner import EmulatorHandle

KEY = "sk-image-test-LEAK-5c81f0a2"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
NOTES = b"HOSTILE-NOTES: this text file is named like an image\n"
OUTSIDE = b"HOSTILE-OUTSIDE: a file next to, not inside, image_base_path\n"

# (row's image value, the fragment of the recorded error that names it)
HOSTILE = [
    ("../../../../../../../../etc/passwd", "../../../../../../../../etc/passwd"),
    ("/proc/self/environ", "/proc/self/environ"),
    ("file:///etc/hostname", "file:///etc/hostname"),
    ("link.png", "link.png"),  # a symlink to /etc/passwd
    ("notes.png", "notes.png"),  # text, not an image
    ("../outside.txt", "../outside.txt"),
]


def _base64_forms(data: bytes) -> list[bytes]:
    """How ``data`` would look inside a data URL or a base64 stream, at each alignment."""
    forms = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + data)
        forms.append(encoded[4 : len(encoded) - 4])  # drop the edges the shift changed
    return forms


def _forbidden() -> dict[str, list[bytes]]:
    passwd = Path("/etc/passwd").read_bytes()
    hostname = Path("/etc/hostname").read_bytes() if Path("/etc/hostname").exists() else b""
    return {
        "/etc/passwd": [passwd[:40], base64.b64encode(passwd)[:40]],
        # The hostname itself may be in status files: only a data URL of it is forbidden.
        "/etc/hostname": [base64.b64encode(hostname)[:-4]] if len(hostname) > 8 else [],
        "the key in /proc/self/environ": [KEY.encode(), *_base64_forms(KEY.encode())],
        "notes.png": [NOTES[:30], *_base64_forms(NOTES[:30])],
        "outside.txt": [OUTSIDE[:30], *_base64_forms(OUTSIDE[:30])],
    }


def _setup(root: Path, processor: dict[str, Any], output_type: str) -> Path:
    images = root / "images"
    images.mkdir(parents=True)
    (images / "ok.png").write_bytes(PNG)
    (images / "notes.png").write_bytes(NOTES)
    (root / "outside.txt").write_bytes(OUTSIDE)
    os.symlink("/etc/passwd", images / "link.png")
    rows = [{"q": "good", "img": "ok.png"}] + [{"q": f"bad {i}", "img": v} for i, (v, _) in
                                               enumerate(HOSTILE)]  # fmt: skip
    config = {
        "processors": [processor],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": write_rows(root / "rows.jsonl", rows),
                    "type": "JSONL",
                    "output_dir": str(root / "out"),
                    "image_base_path": str(images),
                }
            ],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}, {"name": "img", "key": "img", "type": "image"}],
            "outputs": [{"name": "answer", "type": output_type, "prompt": "Describe {{ q }}"}],
            "output_schema": {"q": "{{ q }}", "answer": "{{ answer }}"},
        },
    }
    return write_yaml(root / "pipeline.yaml", config)


def _check_rows(root: Path) -> None:
    rows = shard_rows(root / "out")
    assert len(rows) == 1 + len(HOSTILE)
    assert rows[0]["__errors__"] is None, rows[0]
    for row, (_, named) in zip(rows[1:], HOSTILE, strict=True):
        error = json.dumps(row["__errors__"])
        assert named in error, (named, error)
        assert "image" in error and row["answer"] is None


def _check_no_bytes(root: Path, outputs: list[str]) -> None:
    leaks = []
    fixtures = {root / "images", root / "outside.txt"}  # the hostile files themselves
    written = {
        str(p): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not fixtures & {p, *p.parents}
    }
    written.update({f"stream {i}": text.encode() for i, text in enumerate(outputs)})
    for what, needles in _forbidden().items():
        for name, data in written.items():
            if any(needle in data for needle in needles):
                leaks.append(f"{what} in {name}")
    assert not leaks, leaks


def _batch_processor(emulator: EmulatorHandle, root: Path) -> dict[str, Any]:
    return {
        "type": "batch_api",
        "provider": "openai",
        "model": "gpt-4o-mini",
        "base_url": emulator.openai_base_url,
        "metadata_output_path": str(root / "meta" / "batch_metadata.jsonl"),
    }


def test_live_run_reads_no_hostile_image(emulator: EmulatorHandle, tmp_path: Path) -> None:
    processor = {
        "type": "llm",
        "message_format": "openai",
        "base_url": emulator.openai_base_url,
        "model": "echo",
        "max_retries": 0,
    }
    config = _setup(tmp_path, processor, "llm")
    before = emulator.stats()["requests"]
    run = mmirage("run", config, env=cli_env(OPENAI_API_KEY=KEY))
    assert run.code == 1 and f"{len(HOSTILE)} row(s) failed" in run.err, str(run)
    assert emulator.stats()["requests"] - before == 1  # only the good row was sent
    _check_rows(tmp_path)
    _check_no_bytes(tmp_path, [run.out, run.err])


@pytest.mark.parametrize("dry_run", [False, True], ids=["batch", "export_prompts"])
def test_batch_run_reads_no_hostile_image(
    dry_run: bool, emulator: EmulatorHandle, tmp_path: Path
) -> None:
    config = _setup(tmp_path, _batch_processor(emulator, tmp_path), "batch_api")
    export = ["--export-prompts", str(tmp_path / "prompts.jsonl")] if dry_run else []
    run = mmirage("run", config, *export, env=cli_env(OPENAI_API_KEY=KEY))
    assert run.code == 1 and f"{len(HOSTILE)} row(s) failed" in run.err, str(run)
    if dry_run:  # a dry run publishes no shard: the failed rows are reported on stderr
        exported = read_jsonl(next(tmp_path.glob("prompts.*.jsonl")))
        assert len(exported) == 1 and base64.b64encode(PNG).decode() in json.dumps(exported)
        assert HOSTILE[0][1] in run.err
    else:
        _check_rows(tmp_path)
    _check_no_bytes(tmp_path, [run.out, run.err])


# -- the rules, one by one ----------------------------------------------------------------------


def test_absolute_paths_need_the_opt_in_but_never_pass_for_a_non_image(tmp_path: Path) -> None:
    base, elsewhere = tmp_path / "images", tmp_path / "elsewhere"
    base.mkdir()
    elsewhere.mkdir()
    (base / "in.png").write_bytes(PNG)
    (elsewhere / "out.png").write_bytes(PNG)
    inside, outside = str(base / "in.png"), str(elsewhere / "out.png")
    assert resolve_image(inside, "img", str(base)) == inside  # absolute, but inside: fine
    with pytest.raises(RowError, match="allow_absolute_image_paths: true"):
        resolve_image(outside, "img", str(base))
    with pytest.raises(RowError, match="allow_absolute_image_paths: true"):
        resolve_image(f"file://{outside}", "img", str(base))
    assert resolve_image(outside, "img", str(base), allow_absolute=True) == outside
    with pytest.raises(RowError, match=r"/proc/self/environ.*not an image") as refused:
        resolve_image("/proc/self/environ", "img", str(base), allow_absolute=True)
    assert refused.value.path == "/proc/self/environ"
    with pytest.raises(RowError, match="leads outside"):  # relative paths stay confined
        resolve_image("../elsewhere/out.png", "img", str(base), allow_absolute=True)


def test_the_opt_in_is_a_processing_params_field() -> None:
    inputs = [InputVar("img", "img", type="image")]
    params = ProcessingParams(inputs, [], {}, allow_absolute_image_paths=True)
    extractor = VariableExtractor.for_params(params, None)
    assert extractor.allow_absolute_image_paths is True
    assert ProcessingParams(inputs, [], {}).allow_absolute_image_paths is False


def test_a_symlink_out_of_the_base_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real.png").write_bytes(PNG)
    base = tmp_path / "images"
    base.mkdir()
    os.symlink(tmp_path / "real.png", base / "link.png")
    with pytest.raises(RowError, match=r"'link.png' leads outside"):
        resolve_image("link.png", "img", str(base))


def test_an_image_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    big.write_bytes(PNG + b"\0" * (MAX_IMAGE_BYTES + 1 - len(PNG)))
    with pytest.raises(RowError, match=r"big.png.*over the 20971520-byte limit"):
        resolve_image("big.png", "img", str(tmp_path))
    with pytest.raises(ItemError, match="over the 20971520-byte limit"):
        ImagePart(str(big)).resolved_url()


def test_llm_kit_sends_no_non_image_file_and_quotes_no_bytes(tmp_path: Path) -> None:
    with pytest.raises(ItemError, match=r"/proc/self/environ.*not an image") as refused:
        ImagePart("/proc/self/environ").resolved_url()
    assert "PATH=" not in str(refused.value)
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(ItemError, match="not a regular file"):
        ImagePart(str(fifo)).resolved_url()


def test_an_error_about_an_inline_image_quotes_no_bytes() -> None:
    data = base64.b64encode(NOTES).decode()
    part = ImagePart(f"data:application/octet-stream;base64,{data}")
    with pytest.raises(ItemError, match="an inline application/octet-stream image") as refused:
        AnthropicCodec().encode("claude", [Message("user", (part,))], {}, None)
    assert data[:20] not in str(refused.value)
    with pytest.raises(ItemError) as malformed:
        split_data_url(f"data:{data}")
    assert data[:20] not in str(malformed.value)
