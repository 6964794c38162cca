"""The front door and the docs: the README stays short, no page narrates the project's history, every benchmark
table matches the committed CSV it is rendered from, and every relative link points at a file that exists."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_narrates_history(page):
    text = page.read_text()
    assert not re.search(r"\bsessions? \d+|backed out|DESIGN\.md|\bissue #?\d+", text, re.I), page.name


def test_rendered_tables_match_the_committed_results():
    result = subprocess.run([sys.executable, "scripts/render_tables.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links if "://" not in link and not (page.parent / link).exists()]
    assert missing == [], page.name
