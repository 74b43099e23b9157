"""The README's library example runs as written."""
import re

from conftest import ROOT


def test_readme_library_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    section = text.split("## As a library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert re.search(r"loss \d+\.\d+, grad norm \d+\.\d+", printed)
    assert "(2, 2, 1000) (2, 2)" in printed
