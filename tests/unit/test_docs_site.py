"""The docs are a site that builds, and the README is a landing page whose links lead somewhere.

`mkdocs build --strict` with MkDocs' validation on (mkdocs.yml) makes a page left out of the navigation, a
link to a page or file that isn't there, and an anchor no heading makes each a failure. The build runs in
this process (MkDocs' own `build`, as the command runs it), into a temporary folder.
"""

from __future__ import annotations

import logging
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
import yaml
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# What the issue asks MkDocs to report: a page missing from the nav, a dead link, a dead anchor.
VALIDATION = {
    "nav": {"omitted_files": "warn", "not_found": "warn", "absolute_links": "warn"},
    "links": {"not_found": "warn", "anchors": "warn", "absolute_links": "warn", "unrecognized_links": "warn"},
}


def _build(config_file: Path, site: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Build as `mkdocs build --strict` does; the warnings it logged (an Abort means there were some)."""
    config = load_config(str(config_file), strict=True, site_dir=str(site))
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        try:
            build(config)
        except Abort:
            pass
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_docs_build_strict_with_nothing_to_warn_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    warnings = _build(ROOT / "mkdocs.yml", tmp_path / "site", caplog)
    assert warnings == [], "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_the_site_config_keeps_strict_and_every_check_on() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True
    assert config["docs_dir"] == "docs"
    for section, checks in VALIDATION.items():
        assert config["validation"][section] == checks, section


def test_a_dead_anchor_a_dead_link_and_a_page_left_out_fail_the_build(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The same checks on a copy of the docs with one of each mistake: the build must name all three."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "captures.md").open("a", encoding="utf-8") as f:
        f.write("\n[a](sql.md#no-such-heading) [b](no-such-page.md)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the navigation\n", encoding="utf-8")
    warnings = "\n".join(_build(tmp_path / "mkdocs.yml", tmp_path / "site", caplog))
    assert "no-such-heading" in warnings
    assert "no-such-page.md" in warnings
    assert "orphan.md" in warnings


# -- the README ------------------------------------------------------------------------------------------------
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(```|~~~)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def headings(path: Path) -> set[str]:
    slugs: set[str] = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and (m := _HEADING.match(line)):
            slug = github_slug(m.group(2))
            n, unique = 1, slug
            while unique in slugs:  # GitHub numbers repeated headings: x, x-1, x-2
                unique, n = f"{slug}-{n}", n + 1
            slugs.add(unique)
    return slugs


def readme_links() -> list[str]:
    text = README.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # no links inside code blocks
    return _LINK.findall(text)


def test_the_readme_is_a_landing_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    for command in ("scripts/demo", "scripts/test"):
        assert f"\n{command} " in text, command
    assert any(link.startswith("docs/") for link in readme_links())


def test_every_link_in_the_readme_leads_to_a_file_and_a_heading_that_exist() -> None:
    links = readme_links()
    assert links
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):  # http:, https:, mailto: leave the repository
            continue
        target, _, anchor = link.partition("#")
        path = (README.parent / target).resolve() if target else README
        if not path.exists() or ROOT not in path.parents:
            broken.append(f"{link}: no such file in the repository")
        elif anchor and (path.suffix != ".md" or anchor not in headings(path)):
            broken.append(f"{link}: no heading makes #{anchor}")
    assert broken == [], broken


def test_the_link_check_knows_a_dead_anchor_from_a_live_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Set-up: two commands\n\n```sh\n# not a heading\n```\n## A `code` heading\n## Twice\n## Twice\n")
    assert headings(page) == {"set-up-two-commands", "a-code-heading", "twice", "twice-1"}
