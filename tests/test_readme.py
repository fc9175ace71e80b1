"""The README stays true to the code: every setting, job field and error code is in it."""

from __future__ import annotations

from pathlib import Path

from handler.errors import RETRYABLE, Code
from handler.schema import JobInput
from handler.settings import setting_names

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented():
    missing = [name for name in setting_names() if f"`{name}`" not in README]
    assert not missing, missing


def test_every_job_field_is_documented():
    missing = [name for name in JobInput.model_fields if f"`{name}`" not in README]
    assert not missing, missing


def test_every_error_code_is_documented_with_its_retry_hint():
    for code in Code:
        row = next(
            (line for line in README.splitlines() if line.startswith(f"| `{code.value}`")), None
        )
        assert row is not None, code
        assert row.split("|")[2].strip() == ("yes" if code in RETRYABLE else "no"), row


def test_settings_table_is_the_generated_one():
    from handler.settings import settings_markdown

    start = README.index("<!-- settings:start")
    table = README[README.index("\n", start) + 1 : README.index("<!-- settings:end -->")]
    assert table == settings_markdown(), "run: python -m handler.settings, paste into README"
