"""The docs stay true to the code: every setting (docs/settings.md, generated), job field and
error code (docs/job.md) is documented, and the README links every document."""

from __future__ import annotations

from pathlib import Path

from handler.errors import RETRYABLE, Code
from handler.schema import JobInput
from handler.settings import setting_names

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
JOB = (ROOT / "docs" / "job.md").read_text()
SETTINGS = (ROOT / "docs" / "settings.md").read_text()


def test_every_setting_is_documented():
    missing = [name for name in setting_names() if f"`{name}`" not in SETTINGS]
    assert not missing, missing


def test_every_job_field_is_documented():
    missing = [name for name in JobInput.model_fields if f"`{name}`" not in JOB]
    assert not missing, missing


def test_every_error_code_is_documented_with_its_retry_hint():
    for code in Code:
        row = next(
            (line for line in JOB.splitlines() if line.startswith(f"| `{code.value}`")), None
        )
        assert row is not None, code
        assert row.split("|")[2].strip() == ("yes" if code in RETRYABLE else "no"), row


def test_settings_table_is_the_generated_one():
    from handler.settings import settings_markdown

    start = SETTINGS.index("<!-- settings:start")
    table = SETTINGS[SETTINGS.index("\n", start) + 1 : SETTINGS.index("<!-- settings:end -->")]
    assert table == settings_markdown(), "run: python -m handler.settings, paste into docs"


def test_the_readme_is_a_front_door_that_links_every_document():
    assert len(README.splitlines()) <= 300
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in README, doc.name
    assert "(bench/README.md)" in README


def test_relative_links_in_the_docs_resolve():
    import re

    for path in [ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name}: {target}"
