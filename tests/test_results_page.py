"""docs/results.md is exactly what benchmarks/write_results_page.py writes from benchmarks/results/*.json.

So no measured number can be edited by hand or go stale: a new or re-run benchmark JSON changes the page
only through the script (`python benchmarks/write_results_page.py`), and this test fails until it is run.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from write_results_page import PAGE, README, RESULTS, with_headline, write_page  # noqa: E402


def test_results_page_matches_what_the_script_writes() -> None:
    assert PAGE.read_text(encoding="utf-8") == write_page(), (
        "docs/results.md is stale: run `python benchmarks/write_results_page.py` and commit the page")


def test_readme_headline_table_matches_what_the_script_writes() -> None:
    readme = README.read_text(encoding="utf-8")
    assert readme == with_headline(readme), (
        "README.md's headline table is stale: run `python benchmarks/write_results_page.py` and commit README.md")


def test_readme_is_short_and_opens_with_the_commands_ci_runs() -> None:
    """Five minutes top to bottom; its first two code blocks are .ci/run's set-up and test commands, exactly."""
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    blocks = readme.split("```bash\n")[1:3]
    assert [block.split("\n```")[0] for block in blocks] == [
        "bash scripts/setup.sh && .venv/bin/spotlight train", ".venv/bin/python -m pytest -q"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/setup.sh\n.venv/bin/python -m pytest -q" in ci


def test_every_result_json_has_a_section_naming_commit_machine_and_command() -> None:
    page = write_page()
    for path in sorted(RESULTS.glob("*.json")):
        section = page.split(f'<a id="{path.stem}"></a>', 1)[1].split("<a id=", 1)[0]
        for line in ("- commit: ", "- machine: ", "- command: "):
            assert line in section, f"{path.name}: no '{line.strip()}' line"


def test_a_changed_number_changes_the_page(tmp_path: Path) -> None:
    """The check can fail: re-measuring one headline number gives a different page."""
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(RESULTS / "time_to_target.json", results / "time_to_target.json")
    before = write_page(results)
    data = json.loads((results / "time_to_target.json").read_text())
    data["summary"]["spotlight"]["group_reward_std"] = 0.5
    (results / "time_to_target.json").write_text(json.dumps(data))
    after = write_page(results)
    assert before != after and "| 0.500 |" in after


def test_missing_provenance_is_labelled_not_guessed(tmp_path: Path) -> None:
    (tmp_path / "mystery.json").write_text(json.dumps({"speedup": 1.5, "nested": {"x": 1}}))
    page = write_page(tmp_path)
    assert "- commit: not recorded" in page and "- machine: not recorded" in page
    assert "command line not recorded (`benchmarks/mystery.py`)" in page
    assert "| `speedup` | 1.500 |" in page
