"""The docs site's pages: every table is whole, the nav lists every page, and the pages say what is
(history goes to CHANGELOG.md). ``mkdocs build --strict`` (in .ci/run) checks the links and anchors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The hand-written and generated pages: README.md and docs/**/*.md, less the results folders' own files."""
    def in_a_results_folder(page: Path) -> bool:  # docs/results/NAME/...: a sweep's report.md, compare.md
        parts = page.relative_to(DOCS).parts
        return parts[0] == "results" and len(parts) > 2

    return [ROOT / "README.md", *(p for p in sorted(DOCS.rglob("*.md")) if not in_a_results_folder(p))]


def tables(text: str) -> list[list[str]]:
    """The runs of consecutive table lines (lines starting with ``|``) outside code fences."""
    runs, run, fence = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("|"):
            run.append(line)
            continue
        if run:
            runs.append(run)
            run = []
    return runs + ([run] if run else [])


def cells(row: str) -> int:
    """The cell count of a table row (escaped ``\\|`` and pipes inside code spans are not separators)."""
    row = re.sub(r"`[^`]*`", "code", row.replace("\\|", ""))
    return row.strip().strip("|").count("|") + 1


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_is_whole(page):
    """Each table starts with a header and a separator row and keeps its width: a blank line inside a
    table (as once at the key reference's `batch-size`) leaves rows without a header, shown as text."""
    for run in tables(page.read_text()):
        assert len(run) >= 2 and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", run[1].strip()), (page.name, run[:2])
        width = cells(run[0])
        assert all(cells(row) == width for row in run), (page.name, [r[:60] for r in run if cells(r) != width])


def test_the_nav_lists_every_page_and_only_existing_ones():
    nav = re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    listed = {DOCS / p for p in nav}
    assert all(p.is_file() for p in listed), [str(p) for p in listed if not p.is_file()]
    assert set(pages()[1:]) == listed, set(pages()[1:]) ^ listed


def test_the_key_and_strategy_references_keep_their_markers():
    """Their content is generated between the markers (``sflower keys --write``)."""
    for name, marker in (("config.md", "sflower-keys"), ("strategies.md", "sflower-strategies")):
        text = (DOCS / "reference" / name).read_text()
        assert text.count(f"<!-- {marker} -->") == 1 and text.count(f"<!-- end {marker} -->") == 1, name
        assert text.index(f"<!-- {marker} -->") < text.index(f"<!-- end {marker} -->"), name


HISTORY = re.compile(r"\bissue \d+|\bthis session\b|\bpreviously\b|\bthe earlier claim\b|\buntil this\b", re.I)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_say_what_is(page):
    """History (issue numbers, what was true before) belongs in CHANGELOG.md, not in the docs."""
    hits = [line.strip()[:80] for line in page.read_text().splitlines() if HISTORY.search(line)]
    assert not hits, hits


def test_the_changelog_is_a_page_of_the_site():
    assert (ROOT / "CHANGELOG.md").is_file()
    assert '--8<-- "CHANGELOG.md"' in (DOCS / "changelog.md").read_text()


# --- Every repository path the docs and the code's docstrings and comments name exists ----------------------------

#: The top folders of the repository: a path that starts with one of them is a repository path.
TOP_FOLDERS = ("fl_app", "strategies", "simulation", "tests", "docs", "benchmarks", "examples", "presets")
#: A repository path: a top folder and a slash, not preceded by a path character (so ``RUN_DIR/privacy/...`` or
#: ``https://host/docs/...`` are not one). A template's ``<...>``/``{...}`` part, an upper-case placeholder
#: segment (``NAME``, ``REV``) and a trailing ``...`` stand for anything.
REPO_PATH = re.compile(r"(?<![\w./$<>{}:-])((?:" + "|".join(TOP_FOLDERS) + r")/[\w./*-]*)([<{]?)")
#: A bare file name in a code span (``gas.py``) must be some file's name in the repository, unless it is one of
#: the papers' authors' own files, which the pages cite with their repository.
BARE_FILE = re.compile(r"`([A-Za-z0-9_]+\.py)`")
AUTHORS_FILES = {"GAS_main.py": "eejiarong/GAS", "main.py": "ShenJinglong/StalRingSFL",
                 "vanilla_sl.py": "ShenJinglong/StalRingSFL"}
CODE_FOLDERS = ("fl_app", "strategies", "simulation", "tests", "benchmarks", "examples", "docs")


def missing_paths(text: str) -> list[str]:
    """The repository paths named in ``text`` that name no file or folder of the checkout (globs: none matched)."""
    missing = []
    for match in REPO_PATH.finditer(text):
        path, template = match.group(1).removesuffix("..."), match.group(2)
        path = path.rstrip(".,:;").rstrip("/") + ("*" if template else "")
        placeholders = re.sub(r"\b[A-Z][A-Z_]+\b", "*", path)
        if not any(ROOT.glob(pattern) if "*" in pattern else (ROOT / pattern).exists()
                   for pattern in (path, placeholders)):
            missing.append(match.group(1))
    return missing


def prose_of_python(path: Path) -> str:
    """A module's docstrings and other bare string statements and its comments, one per line (not its code)."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    texts = [node.value.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]
    texts += [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
              if tok.type == tokenize.COMMENT]
    return "\n".join(texts)


def python_files() -> list[Path]:
    return [p for folder in CODE_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def test_the_path_check_sees_paths_and_only_paths():
    """The check itself: a missing path is caught; run-directory paths, URLs and placeholders are not paths."""
    assert missing_paths("see `strategies/algorithms/gas.py` and simulation/bench/") == [
        "strategies/algorithms/gas.py", "simulation/bench/"]
    assert missing_paths("`RUN_DIR/privacy/tail-0.npy`, https://example.org/docs/x, runs/tests/a.csv") == []
    assert missing_paths("`docs/results/NAME/report.md`, `presets/NAME.toml`, `docs/results/<name>/`, "
                         "`tests/test_*.py`, `fl_app/models/...`, (fl_app/learning/task.py).") == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_name_only_paths_that_exist(page):
    """Every repository path on a page exists (README.md, docs/**/*.md, the results folders' pages too)."""
    text = page.read_text()
    assert not missing_paths(text), missing_paths(text)
    bare = [name for name in BARE_FILE.findall(text)
            if name not in AUTHORS_FILES and not any(ROOT.glob(f"**/{name}"))]
    assert not bare, f"file names that no repository file has: {bare}"


@pytest.mark.parametrize("path", python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docstrings_and_comments_name_only_paths_that_exist(path):
    """The docstrings and comments of every module name only repository paths that exist (the code's string
    literals are not checked: a benchmark names files of older revisions to ``git show`` them)."""
    assert not missing_paths(prose_of_python(path)), missing_paths(prose_of_python(path))


# --- The one hook list: the base classes' docstrings -------------------------------------------------------------

#: The classes whose docstrings list the hooks (rendered by docs/reference/hooks.md).
HOOK_CLASSES = ("strategies.core.base:SFLStrategy", "strategies.core.loops:SyncStrategy",
                "strategies.core.loops:AsyncStrategy", "strategies.core.split:SplitMixin",
                "strategies.core.split:SyncSplitStrategy")


def listed_hooks(doc: str) -> list[str]:
    """The names a hook list's bullets open with (``- ``name(args)``, ``other`` (...): contract``)."""
    names = []
    for line in doc.splitlines():
        if line.strip().startswith("- ``"):
            head = line.strip()[2:].split(":", 1)[0]
            names += [re.sub(r"\(.*", "", n) for n in re.findall(r"``([^`]+)``", head)]
    return names


@pytest.mark.parametrize("where", HOOK_CLASSES)
def test_every_listed_hook_exists_and_the_reference_page_renders_the_list(where):
    """Each hook a base class's docstring lists is an attribute of that class, and the reference page
    renders that docstring (the one list: design.md and add-a-strategy.md link to it)."""
    import importlib

    module, cls_name = where.split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    hooks = listed_hooks(cls.__doc__ or "")
    assert len(hooks) >= 2, (where, hooks)
    missing = [h for h in hooks if not hasattr(cls, h) and h not in getattr(cls, "__annotations__", {})]
    assert not missing, f"{where} lists hooks it does not have: {missing}"
    assert f"::: {module}.{cls_name}\n" in (DOCS / "reference" / "hooks.md").read_text()


def test_the_guides_link_to_the_hook_list_instead_of_copying_it():
    for page in ("explanation/design.md", "how-to/add-a-strategy.md"):
        text = (DOCS / page).read_text()
        assert "reference/hooks.md" in text, page
        assert "`timed_cut(pid)`" not in text and "`collect_client_models(uploads)`" not in text, page


# --- The inline plugin of "Add a strategy" works as shown --------------------------------------------------------

def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_the_inline_plugin_loads_checks_its_keys_and_computes_the_geometric_median(tmp_path):
    """The page's ``pyproject.toml`` and ``median_splitfed.py`` blocks, installed nowhere: the module is put on
    ``sys.path`` and loaded through ``strategy=module:Class``, as the example plugin's test does."""
    import sys
    import tomllib

    import torch

    from fl_app.run.config import RunConfig
    from fl_app.run.errors import ConfigError
    from strategies.algorithms.splitfed import SplitFedV1
    from strategies.core.registry import get_strategy

    page = (DOCS / "how-to" / "add-a-strategy.md").read_text()
    project = tomllib.loads(next(b for b in _blocks(page, "toml") if "[project]" in b))
    module_name, class_name = project["project"]["entry-points"]["sflower.strategies"]["splitfed-median"].split(":")
    assert project["tool"]["setuptools"]["py-modules"] == [module_name] and "sflower" in project["project"]["dependencies"]
    source = next(b for b in _blocks(page, "python") if f"class {class_name}(" in b)
    (tmp_path / f"{module_name}.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        spec = f"{module_name}:{class_name}"
        cls = get_strategy(spec)
        cfg = RunConfig.from_mapping({"strategy": spec, "gm-iterations": 200})
        with pytest.raises(ConfigError):
            RunConfig.from_mapping({"strategy": spec, "gm-iterations": 0})  # at_least=1
        with pytest.raises(ConfigError):
            RunConfig.from_mapping({"strategy": spec, "gm-eps": 0.0})  # above=0
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module_name, None)
    assert issubclass(cls, SplitFedV1) and cls.name == "splitfed-median" and cfg.gm_iterations == 200
    strategy = cls.__new__(cls)
    strategy.cfg = cfg
    models = [{"w": torch.tensor([v]), "n": torch.tensor(7)} for v in (0.0, 1.0, 10.0)]
    # 1-D: the geometric median is the (weighted) median: 1 with equal weights, 10 when 10 weighs more than half
    assert torch.allclose(strategy.aggregate_models(models, [1.0, 1.0, 1.0])["w"], torch.tensor([1.0]), atol=1e-3)
    assert torch.allclose(strategy.aggregate_models(models, [1.0, 1.0, 5.0])["w"], torch.tensor([10.0]), atol=1e-3)
    assert int(strategy.aggregate_models(models, [1.0, 1.0, 1.0])["n"]) == 7
