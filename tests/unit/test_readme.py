"""The README's library examples run as written."""
import re

from conftest import ROOT


def library_examples() -> list[str]:
    """The python blocks of the README's "As a library" section, in order."""
    section = (ROOT / "README.md").read_text().split("## As a library", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_library_example_runs(capsys):
    exec(compile(library_examples()[0], "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert re.search(r"loss \d+\.\d+, grad norm \d+\.\d+", printed)
    assert "(2, 2, 1000) (2, 2)" in printed


def test_readme_nnx_example_runs(capsys):
    exec(compile(library_examples()[1], "README.md", "exec"), {"__name__": "readme"})
    assert "nnx (2, 2, 1000) (2, 16, 1000)" in capsys.readouterr().out


def test_readme_eval_example_runs(capsys):
    exec(compile(library_examples()[2], "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    assert re.search(r"log-likelihoods \[-\d+\.\d+ +-\d+\.\d+\]", printed), printed


def test_readme_sections_appear_once():
    """An edit that pasted a section twice (it happened once) leaves two headings of one name."""
    headings = re.findall(r"^#{2,3} .+$", (ROOT / "README.md").read_text(), re.M)
    assert len(headings) == len(set(headings)), sorted(h for h in headings if headings.count(h) > 1)


def test_readme_names_every_model_preset_and_its_config():
    """Both lists of presets once lacked llama-1b."""
    from jaxlm.models import PRESETS
    readme = (ROOT / "README.md").read_text()
    library = readme.split("Presets (in `jaxlm.models.PRESETS` and `configs/`): ", 1)[1].split("; each has", 1)[0]
    assert set(re.findall(r"`([\w.-]+)`", library)) == set(PRESETS)
    configs = readme.split("Configs in `configs/`: ", 1)[1].split("; a config may", 1)[0]
    assert set(PRESETS) <= set(re.findall(r"`([\w.-]+)`", configs))
    assert all((ROOT / "configs" / f"{name}.yaml").is_file() for name in PRESETS)


def test_each_config_trains_in_runs_and_data_named_as_its_file():
    """`make demo DEMO_CONFIG=configs/NAME.yaml` evaluates runs/NAME, and `make clean-demo` removes it with data/NAME
    (the demo's evaluation once named runs/bert-tiny whatever the config)."""
    from jaxlm import config as config_lib
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = config_lib.load(str(path), [])
        assert (config.train.run_dir, config.data.prepared_dir) == (f"runs/{path.stem}", f"data/{path.stem}"), path
    makefile = (ROOT / "Makefile").read_text()
    assert "eval runs/$(DEMO_NAME) --out eval/$(DEMO_NAME)" in makefile
    assert "rm -rf runs/$(DEMO_NAME) data/$(DEMO_NAME) eval/$(DEMO_NAME)" in makefile
