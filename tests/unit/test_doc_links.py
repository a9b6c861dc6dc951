"""Every relative link in README.md and docs/**/*.md resolves: the file (or folder) exists, and
an anchor (``page.md#heading``, ``#heading``) names a heading of that page, slugged as GitHub
and the docs site (mkdocs.yml's toc slugify) slug it. The README stays one page (issue 44:
at most 130 lines), and docs/index.md maps every page of docs/."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def prose(text: str) -> str:
    """``text`` without fenced code blocks, inline code spans and HTML comments."""
    text = re.sub(r"<!--.*?-->", "", _FENCE.sub("", text), flags=re.S)
    return _CODE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, each space
    a hyphen (so ``shm — `allreduce_shm.py` `` is ``shm--allreduce_shmpy``)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # a link: its text
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set:
    seen: dict = {}
    out = set()
    for m in _HEADING.finditer(_FENCE.sub("", path.read_text())):
        s = slug(m[1])
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def broken_links(path: Path) -> list:
    """The relative links of ``path`` that do not resolve, each with the reason."""
    bad = []
    for target in _LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):        # http:, https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no {dest.relative_to(ROOT) if ROOT in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: {dest.name} has no heading #{anchor}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    assert not broken_links(page), broken_links(page)


def test_readme_is_one_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 130, f"README.md has {lines} lines; at most 130 (move the rest into docs/)"


def test_index_maps_every_page():
    index = ROOT / "docs" / "index.md"
    linked = {(index.parent / t.partition("#")[0]).resolve()
              for t in _LINK.findall(prose(index.read_text()))}
    missing = [str(p.relative_to(ROOT)) for p in PAGES[1:] if p != index and p not in linked]
    assert not missing, f"docs/index.md does not link: {missing}"


def test_the_check_can_fail(tmp_path):
    (tmp_path / "b.md").write_text("# B page\n\n## shm — `allreduce_shm.py`\n\n## Twice\n\n"
                                   "## Twice\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#shm--allreduce_shmpy) [ok](b.md#twice-1) [ok](#a) "
                    "[web](https://example.org/x) `[code](nowhere.md)`\n\n# A\n\n"
                    "```\n[fenced](nowhere.md)\n```\n"
                    "[gone](nowhere.md) [anchor](b.md#no-such) ![img](c.png)\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["nowhere.md", "b.md#no-such",
                                                               "c.png"]
