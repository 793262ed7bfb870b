"""The rooms and their arrows, read from the code itself: which package may import which."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("include", "feature_store", "lookup", "spark_jobs", "model", "experiments", "dags")
# What each room may import of the project's rooms (besides itself). Nothing imports experiments.
ALLOWED = {
    "model": set(),  # a leaf library: torch, numpy, pandas, faiss, deltalake and itself
    "include": set(),  # plumbing: config, session factory, CLI helpers, SQL entry point
    "feature_store": {"include", "model"},  # model only for model.tiers and the registry, see below
    # the online lookup reads the declarations and the tier rule of feature_store; nothing but the
    # DAGs (which wire its publication) and the experiments imports it
    "lookup": {"include", "feature_store", "model"},
    "spark_jobs": {"include", "feature_store", "model"},
    "dags": {"include", "feature_store", "lookup", "model"},
    "experiments": {"include", "feature_store", "lookup", "spark_jobs", "model"},
}


def imports(room: str) -> dict[str, set[str]]:
    """module path -> the project modules it imports (at any depth, lazily or not)."""
    out = {}
    for path in sorted((ROOT / room).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        out[str(path.relative_to(ROOT))] = {n for n in names if n.split(".")[0] in ROOMS}
    return out


def test_each_room_imports_only_what_it_may():
    wrong = []
    for room, allowed in ALLOWED.items():
        for path, names in imports(room).items():
            for n in names:
                if n.split(".")[0] not in allowed | {room}:
                    wrong.append(f"{path} imports {n}")
    assert wrong == []


def test_no_two_modules_import_each_other_at_any_depth():
    """Imports at module top and inside functions alike: a circle hides which module a name belongs to."""
    graph = {path[:-3].replace("/", "."): names for room in ROOMS for path, names in imports(room).items()}
    graph = {m: {n for n in names if n in graph and n != m} for m, names in graph.items()}
    circles, done = [], set()

    def visit(module, trail):
        if module in trail:
            circles.append(trail[trail.index(module):] + [module])
            return
        if module in done:
            return
        for n in sorted(graph[module]):
            visit(n, trail + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert circles == []


def test_the_lookup_uses_only_torch_free_model_modules():
    # The online lookup must start without torch: of model/, the lookup and feature_store read the
    # tier names, the registry's model sizes and a consumer's code space only, and importing those
    # loads no torch.
    import subprocess
    import sys

    used = {n for room in ("feature_store", "lookup") for names in imports(room).values() for n in names
            if n.startswith("model")}
    assert used <= {"model.tiers", "model.tiers.TIERS", "model.tiers.EXACT", "model.tiers.USER_MEAN",
                    "model.tiers.NEIGHBOR", "model.tiers.NONE", "model.tiers.ITEM_MEAN",
                    "model.tiers.ORDER", "model.registry", "model.registry.code_dim",
                    "model.registry.consumer_code_version"}, used
    assert "import" not in (ROOT / "model" / "tiers.py").read_text().split('"""', 2)[2]
    code = ("import sys, lookup.serve, lookup.online, lookup.redis_store, model.registry; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_truth_of_a_simulated_log_is_read_by_the_evaluation_alone():
    """The truth (the probabilities the synthetic labels were drawn with) is written by the generator,
    handed to the impression ingest, declared and written as a table, and read by
    experiments/truth.py: no model, job or lookup code names it."""
    named = sorted(str(p.relative_to(ROOT)) for room in ROOMS for p in (ROOT / room).glob("*.py")
                   if "TRUTH" in p.read_text() or "truth.read_truth" in p.read_text())
    assert named == ["experiments/model_eval.py", "experiments/replay.py", "experiments/task_transfer.py", "experiments/truth.py",
                     "feature_store/tables.py", "include/synthetic_world.py", "spark_jobs/ingest.py",
                     "spark_jobs/ingest_load.py"], named
    assert "p_click" not in "".join(p.read_text() for p in (ROOT / "model").glob("*.py"))


def test_no_module_reaches_into_another_modules_private_names():
    wrong = []
    for room in ROOMS:
        for path in sorted((ROOT / room).glob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ROOMS:
                    wrong += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                              if a.name.startswith("_")]
                elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                      and isinstance(node.value, ast.Name) and node.value.id in {"mdata", "registry", "training"}):
                    wrong.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert wrong == []
