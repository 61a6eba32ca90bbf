"""Every promise the README and the user docs make about resume, bad input, faults, safe loading
and services has a row in the promise table of docs/reliability.md, and every row names tests that
exist.

A promise is a sentence, bullet or table row of the pages below that says what the program
guarantees: it uses one of PROMISE_WORDS (exit codes, "one line", "exactly", "never", loopback...).
Each must contain the quoted phrase of at least one row of the table in docs/reliability.md's
section "Promises and their tests"; each row's phrase must be a promise one of the pages makes, and
each named test (`tests/test_x.py::test_name`) must be a test function in that file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TABLE_PAGE = ROOT / "docs" / "reliability.md"
TABLE_SECTION = "Promises and their tests"
# The pages whose promises the table covers, every section of each (bad input, resume, faults,
# orchestration and its services, real models' missing files, scale-out, safe loading, exported adapters).
PAGES = ("README.md", "docs/reliability.md", "docs/cli.md", "docs/configuration.md", "docs/real-models.md",
         "docs/explorers.md", "docs/orchestration.md", "docs/distributed.md", "docs/tracking.md", "docs/study.md",
         "docs/adapters.md")
# Sections every page set must still have: the README's security section and the reliability
# page's own, so the pages cannot lose their promises by losing a heading.
REQUIRED = {"README.md": ("Security and safe loading",),
            "docs/reliability.md": ("Bad input", "Resume after a crash", "Faults", "Safe loading", "Services")}
PROMISE_WORDS = re.compile(
    r"exit code|\bexit [12]\b|one line|bit for bit|\bexactly\b|\bnever\b|\bidentical|"
    r"nothing (is )?(written|created|downloaded)|nothing created|before (anything|an output|the model|starting)|"
    r"127\.0\.0\.1|loopback|weights_only|ends with\s+the run|work as written|retry once|is unchanged|"
    r"stops (the run|with)|the run stops|skipped|safetensors only|a crash at any moment", re.I)
# Sentences those words find that advise or describe rather than promise.
ADVICE = ("prefer an SSH tunnel", "before training on")
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]]*\])?`")


def sections(text: str) -> dict[str, str]:
    """Heading (any level, without the #s) -> its text up to the next heading; code blocks dropped."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    parts = re.split(r"^#{1,4} (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def normal(text: str) -> str:
    return " ".join(text.split())


def units(body: str) -> list[str]:
    """A section's sentences, bullets and table rows, whitespace-normalised."""
    found = []
    for block in re.split(r"\n\s*\n", body):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("|"):
            found += [normal(line) for line in lines[2:] if line.startswith("|")]  # rows, not header
            continue
        for item in re.split(r"\n(?=- )", block.strip()):
            found += [normal(s) for s in re.split(r"(?<=[.;:])\s+(?=[A-Z*])", item.strip()) if s.strip()]
    return found


def promises(pages: dict[str, str]) -> list[str]:
    """The promise units of every page (page name -> its text), the promise table itself left out."""
    found = []
    for name, text in pages.items():
        bodies = sections(text)
        missing = [section for section in REQUIRED.get(name, ()) if section not in bodies]
        assert not missing, f"{name}: sections not found: {missing}"
        found += [unit for section, body in bodies.items() if section != TABLE_SECTION for unit in units(body)
                  if PROMISE_WORDS.search(unit) and not any(advice in unit for advice in ADVICE)]
    return found


def table_rows(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(quoted promise phrase, [(test file, test name)]) per row of the promise table."""
    body = sections(text).get(TABLE_SECTION)
    assert body is not None, f"the promise page has no section '{TABLE_SECTION}'"
    rows = []
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0].startswith('"'):
            rows.append((normal(cells[0].strip('"')), TEST_REFERENCE.findall(cells[-1])))
    return rows


def read_pages() -> dict[str, str]:
    return {name: (ROOT / name).read_text(encoding="utf-8") for name in PAGES}


def uncovered(promise_units: list[str], rows) -> list[str]:
    return [unit for unit in promise_units if not any(phrase in unit for phrase, _ in rows)]


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


# ---------------------------------------------------------------------------------------------


def test_every_promise_of_the_readme_and_the_docs_has_a_row():
    pages = read_pages()
    missing = uncovered(promises(pages), table_rows(pages["docs/reliability.md"]))
    assert not missing, "promises without a row in docs/reliability.md's promise table:\n" + "\n".join(missing)


def test_every_row_quotes_a_promise_a_page_makes_and_names_existing_tests():
    pages = read_pages()
    made = promises(pages)
    rows = table_rows(pages["docs/reliability.md"])
    assert len(rows) >= 20, f"the promise table has only {len(rows)} rows"
    for phrase, tests in rows:
        assert any(phrase in unit for unit in made), f"row quotes no promise of the pages: {phrase!r}"
        assert tests, f"row names no test: {phrase!r}"
        for file, name in tests:
            assert (ROOT / file).is_file(), f"{file} (row {phrase!r}) does not exist"
            assert name in defined_tests(ROOT / file), f"{file} has no test {name} (row {phrase!r})"


def test_the_readme_points_to_the_promise_table():
    assert "docs/reliability.md" in README.read_text(encoding="utf-8")


def test_a_new_promise_without_a_row_is_found():
    """The parser can fail: a promise added to the README, and a bullet in a docs page, show up uncovered."""
    pages = read_pages()
    pages["README.md"] = pages["README.md"].replace(
        "## Security and safe loading\n", "## Security and safe loading\n\nA full moon never corrupts a checkpoint.\n\n", 1)
    pages["docs/distributed.md"] += "\n## Weather\n\n- **Cosmic rays** stop the run with exit code 2.\n"
    assert uncovered(promises(pages), table_rows(pages["docs/reliability.md"])) == [
        "A full moon never corrupts a checkpoint.", "- **Cosmic rays** stop the run with exit code 2."]


def test_a_row_naming_a_missing_test_is_found():
    rows = table_rows('## Promises and their tests\n\n| promise | tested in |\n|---|---|\n'
                      '| "x" | `tests/test_resume.py::test_no_such_test` |\n')
    assert rows == [("x", [("tests/test_resume.py", "test_no_such_test")])]
    assert "test_no_such_test" not in defined_tests(ROOT / "tests/test_resume.py")
