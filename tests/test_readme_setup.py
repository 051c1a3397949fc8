"""README's set-up: the lines a newcomer pastes, in the order they are pasted, and .ci/run runs
the same lines."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_cpu_torch_line_comes_before_the_two_commands():
    cmds = _setup_commands()
    assert len(cmds) == 3, cmds
    cpu, sweep, tests = cmds
    assert cpu.startswith("pip install torch==") and "whl/cpu" in cpu
    assert "python -m bench sweep" in sweep and "pip install -e ." in sweep
    assert "python -m pytest" in tests


def test_ci_runs_readmes_cpu_line_with_its_options_and_readmes_test_command():
    cpu, _sweep, tests = _setup_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert cpu in ci  # the same options: --timeout and --retries, and the fallback to pip's own wheels
    assert "--timeout" in cpu and "--retries" in cpu and "||" in cpu
    assert tests in ci
    assert ci.index(cpu) < ci.index(tests)
