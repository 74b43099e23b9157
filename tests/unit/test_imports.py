"""A module's imports tell its place: jaxlm's top-level imports form no cycle, and an import inside a
function says on its line (or the line above) why it is not at the top."""
import ast
import pathlib
import subprocess
import sys

import jaxlm

PACKAGE = pathlib.Path(jaxlm.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(node: ast.AST, known: dict) -> list[str]:
    """The jaxlm modules an import statement names (`from a import b` counts a.b when it is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{a.name}" for a in node.names]
        return [n for n in names if n in known] or ([node.module] if node.module in known else [])
    return []


def top_level_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        graph[name] = {m for node in tree.body for m in imported(node, known) if m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_top_level_imports_form_no_cycle():
    assert find_cycle(top_level_graph()) == []


def test_a_cycle_is_found_when_there_is_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_imports_inside_functions_state_their_reason():
    unexplained = []
    for name, path in sorted(modules().items()):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    here, above = lines[inner.lineno - 1], lines[inner.lineno - 2]
                    if "#" not in here and not above.strip().startswith("#"):
                        unexplained.append(f"{name}:{inner.lineno}: {here.strip()}")
    assert unexplained == []


def test_the_metrics_writer_writes_events_without_importing_pytorch(tmp_path):
    """tensorboardX imports torch where it is installed (2 s of every run's start, 300 MB); the run's writer hides
    it for that import, and torch imports as before afterwards."""
    probe = ("import sys; from jaxlm.train.metrics import summary_writer; writer = summary_writer(sys.argv[1]); "
             "writer.add_scalar('train/loss', 1.5, 3); writer.close(); print('torch' in sys.modules); "
             "import torch; print(torch.ones(2).sum().item())")
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["False", "2.0"], proc.stdout + proc.stderr
    events = list(tmp_path.glob("events.out.tfevents.*"))
    assert len(events) == 1 and b"train/loss" in events[0].read_bytes()
