"""The docs' pictures and their fit at 1280 px: the Graphviz sources of docs/diagrams/ render,
the built pages show them (no ASCII diagram left), a build without ``dot`` stops with one
sentence, code blocks fit the page, and search splits ``worker_concurrency`` into words.

The site is built for real (``mkdocs build --strict`` in a subprocess, into tmp folders); a
headless Chromium, where installed, measures the code blocks as a reader's browser lays them out.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from mkdocs.exceptions import PluginError

from docs_blocks import REPO

DOCS = REPO / "docs"
DIAGRAMS = sorted((DOCS / "diagrams").glob("*.dot"))
# Each picture and the page that shows it.
SHOWN_ON = {
    "run_data_flow": ["pipeline"],
    "batch_lifecycle": ["pipeline", "batch_api"],
    "slurm_layout": ["scaling_out"],
    "ray_layout": ["scaling_out"],
    "architecture": ["architecture"],
}
# Characters of a code line that fit a code block at 1280 px (measured in Chromium: 88 fit,
# 89 scroll). Blocks marked `{.text .wrap}` (program output) wrap instead.
CODE_COLUMNS = 88
SITE_PAGES = [
    "index.html",
    "getting-started/",
    "concepts/",
    "pipeline/",
    "batch_api/",
    "batching/",
    "processors/",
    "providers/",
    "emulator/",
    "scaling_out/",
    "recipes/",
    "architecture/",
    "troubleshooting/",
    "view/",
    "reference/configuration/",
    "reference/cli/",
]
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot not installed")


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_hook_diagrams", DOCS / "_hooks" / "diagrams.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build(site: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", **(env or {})},
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot not installed")
    folder = tmp_path_factory.mktemp("site")
    built = _build(folder)
    assert built.returncode == 0, built.stderr
    return folder


def test_there_is_a_source_for_each_picture() -> None:
    assert sorted(path.stem for path in DIAGRAMS) == sorted(SHOWN_ON)


@needs_dot
@pytest.mark.parametrize("source", DIAGRAMS, ids=lambda path: path.stem)
def test_each_source_renders_to_svg(source: Path) -> None:
    hook = _hook()
    svg = hook.render(source, hook.dot_command()).decode()
    assert "<svg" in svg and "</svg>" in svg
    assert 'class="node"' in svg


@needs_dot
def test_a_source_graphviz_refuses_fails_naming_it(tmp_path: Path) -> None:
    hook = _hook()
    broken = tmp_path / "broken.dot"
    broken.write_text("digraph { a -> }\n")
    with pytest.raises(PluginError, match=r"docs/diagrams/broken\.dot: Graphviz could not draw"):
        hook.render(broken, hook.dot_command())


@needs_dot
def test_a_source_graphviz_warns_about_fails_too(tmp_path: Path) -> None:
    hook = _hook()
    odd = tmp_path / "odd.dot"
    odd.write_text("digraph { compound=true; a -> b [lhead=cluster_none]; }\n")
    with pytest.raises(PluginError, match=r"docs/diagrams/odd\.dot: .*cluster_none"):
        hook.render(odd, hook.dot_command())


def test_without_dot_the_build_stops_with_one_sentence(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    built = _build(tmp_path / "site", env={"PATH": str(empty)})
    assert built.returncode != 0
    assert "The docs' diagrams need Graphviz's `dot` on PATH" in built.stderr
    assert "Traceback" not in built.stderr


def test_the_built_pages_show_the_pictures(site: Path) -> None:
    for name, pages in SHOWN_ON.items():
        svg = site / "diagrams" / f"{name}.svg"
        assert svg.read_text().lstrip().startswith("<?xml"), name
        for page in pages:
            html = (site / page / "index.html").read_text()
            assert f'src="../diagrams/{name}.svg"' in html, (page, name)
    assert not list(site.rglob("*.dot")), "the sources are not published"


def test_no_ascii_diagram_is_left(site: Path) -> None:
    drawn = [
        page.relative_to(site).as_posix()
        for page in site.rglob("index.html")
        if "──▶" in page.read_text() or "└──" in page.read_text()
    ]
    assert drawn == []


def _long_code_lines() -> Iterator[str]:
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            opening = _FENCE.match(lines[i])
            if not opening:
                i += 1
                continue
            indent, fence = opening["indent"], opening["fence"]
            wraps = ".wrap" in opening["info"]
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                text = lines[j].removeprefix(indent)
                if not wraps and len(text) > CODE_COLUMNS:
                    yield f"{page.relative_to(REPO)}:{j + 1}: {len(text)} characters"
                j += 1
            i = j + 1


def test_code_lines_fit_a_1280_px_page() -> None:
    assert list(_long_code_lines()) == []


def test_search_splits_words_on_underscores(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    words = [w for w in re.split(index["config"]["separator"], "worker_concurrency") if w]
    assert words == ["worker", "concurrency"]


def _wait_until_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    while True:
        assert server.poll() is None, "the HTTP server of the built site exited"
        try:
            with socket.create_connection(("127.0.0.1", port)):
                return
        except OSError:
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Each page in a 1280 px frame: the frames hold the harness's load event until they are laid
# out, so its handler counts the code blocks that scroll sideways and the pictures that did not
# load before --dump-dom writes the document out (no clock involved).
HARNESS = """<!doctype html><html><body><pre id="result">pending</pre>%s<script>
window.addEventListener("load", () => {
  const found = {};
  for (const frame of document.querySelectorAll("iframe")) {
    const doc = frame.contentDocument;
    const codes = [...doc.querySelectorAll(".md-content pre > code")];
    const images = [...doc.querySelectorAll(".md-content img")];
    found[frame.dataset.page] = {
      scrolling: codes.filter(c => c.scrollWidth > c.clientWidth + 1).length,
      blocks: codes.length,
      broken_images: images.filter(i => !i.complete || i.naturalWidth === 0).length,
    };
  }
  document.getElementById("result").textContent = "RESULT" + JSON.stringify(found) + "END";
});
</script></body></html>"""
FRAME = '<iframe data-page="{0}" src="{0}" style="width:1280px;height:900px"></iframe>'


def test_no_code_block_scrolls_sideways_in_a_browser(site: Path, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium installed")
    (site / "_measure.html").write_text(HARNESS % "".join(map(FRAME.format, SITE_PAGES)))
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_listening(port, server)
        dump = subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--window-size=1400,1000",
                "--dump-dom",
                f"http://127.0.0.1:{port}/_measure.html",
            ],
            capture_output=True,
            text=True,
        )
    finally:
        server.terminate()
        server.wait()
    dom = dump.stdout
    match = re.search(r"RESULT(.*)END", dom)
    assert match, dom[-2000:]
    found = json.loads(match.group(1).replace("&quot;", '"'))
    assert set(found) == set(SITE_PAGES)
    assert sum(page["blocks"] for page in found.values()) > 50
    scrolling = {page: v["scrolling"] for page, v in found.items() if v["scrolling"]}
    broken = {page: v["broken_images"] for page, v in found.items() if v["broken_images"]}
    assert scrolling == {} and broken == {}
