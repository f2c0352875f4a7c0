"""README's two commands are the ones CI and a new user run."""

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    ci_command = [ln for ln in ci.splitlines() if "pytest" in ln and not ln.startswith("#")]
    assert len(ci_command) == 1
    assert ci_command[0].strip() in [b.strip() for b in _bash_blocks(readme)]


def test_readme_main_command_names_existing_specs_and_commands():
    readme = (REPO / "README.md").read_text()
    main = _bash_blocks(readme)[0]
    words = shlex.split(main)
    specs = [w for w in words if w.startswith("experiments/")]
    assert specs == ["experiments/quickstart.py"]
    assert all((REPO / s).is_file() for s in specs)
    assert "sweep" in words and "report" in words and "runs/quickstart" in words
    # Every image the README shows is committed.
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (REPO / image).is_file(), image
