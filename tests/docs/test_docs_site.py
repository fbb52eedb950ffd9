"""The documentation site builds strictly and opens in a real browser.

`mkdocs build --strict` (mkdocs.yml) builds the site into a temporary folder;
a local HTTP server on 127.0.0.1 serves it for at most SERVE_SECONDS, and
headless Chromium (Debian's `chromium` package) opens the home page and an API
page: each must render its title, the search box and what Material's scripts
add (a copy button on each code block). Without the `docs` extra the module
is skipped, without Chromium the browser tests are, each with the reason.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

pytest.importorskip("mkdocs", reason="needs the docs extra: pip install '.[docs]'")
griffe = pytest.importorskip("griffe", reason="needs the docs extra")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVE_SECONDS = 120
CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))),
    None,
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium on PATH (Debian/Ubuntu: apt-get install chromium)",
)

# A server that stops itself: the site stays up SERVE_SECONDS at most, even
# if the test process dies; it prints its port once it listens.
_SERVE = """
import functools, http.server, sys, threading
handler = functools.partial(
    http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
handler.log_message = lambda *args: None
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
threading.Timer(float(sys.argv[2]), server.shutdown).start()
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _load_hook(name):
    path = os.path.join(ROOT, "docs", "_hooks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return folder


@pytest.fixture(scope="module")
def server(site):
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(site), str(SERVE_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _rendered(url):
    """The page's DOM after its scripts ran, from headless Chromium."""
    with tempfile.TemporaryDirectory() as profile:
        shown = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=5000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert shown.returncode == 0, shown.stderr[-2000:]
    return shown.stdout


def _assert_page(dom, title):
    assert f"<title>{title}</title>" in dom, dom[:2000]
    assert 'class="md-search__input"' in dom, "no search box"
    # Material's JavaScript adds a copy button to every code block.
    assert "md-code__button" in dom, "Material's scripts did not run"


def test_the_site_builds_with_every_page_and_api_module(site):
    for page in ("index.html", "install/index.html", "quickstart/index.html"):
        assert (site / page).is_file(), page
    for module in ("maskfit", "pruning", "sparse", "distribute", "layers"):
        assert (site / "api" / module / "index.html").is_file(), module
    assert (site / "search" / "search_index.json").is_file()


@needs_chromium
def test_home_page_renders_in_chromium(server):
    _assert_page(_rendered(server + "/"), "maskfit")


@needs_chromium
def test_api_page_renders_in_chromium(server):
    dom = _rendered(server + "/api/sparse/")
    _assert_page(dom, "maskfit.sparse - maskfit")
    assert 'id="maskfit.sparse.sparsify"' in dom


def test_the_build_check_names_an_undocumented_public_name(tmp_path):
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package."""
            __all__ = ["documented", "undocumented", "unrendered"]

            def documented():
                """Has a docstring."""

            def undocumented():
                pass

            def unrendered():
                """Has a docstring, but no anchor on the page."""
            '''
        )
    )
    hook = _load_hook("public_api")
    loaded = griffe.load("fakepkg", search_paths=[str(tmp_path)])
    found = hook.problems(
        loaded,
        {"fakepkg": "api/fakepkg.md"},
        {"api/fakepkg.md": {"fakepkg.documented"}},
    )
    assert len(found) == 2, found
    assert "fakepkg.undocumented" in found[0] and "no docstring" in found[0]
    assert "fakepkg.unrendered is not rendered" in found[1]


def test_doctests_in_docstrings_become_code_blocks():
    fences = _load_hook("doctest_fences")
    text = "Example:\n\n>>> x = [1][0]\n>>> x\n1\n\nAfter."
    assert fences.fence_doctests(text) == (
        "Example:\n\n```pycon\n>>> x = [1][0]\n>>> x\n1\n```\n\nAfter."
    )
    args = "Args:\n  a, b,\n  c: as for f.\n  d: more,\n    and more."
    assert fences.join_name_lists(args) == (
        "Args:\n  a, b, c: as for f.\n  d: more,\n    and more."
    )
