"""The agreement statistics have one home (craftmd.agreement): no other module computes kappa, alpha, Spearman or AUC."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("craftmd", "dataset_builder", "generation", "scoring", "analysis", "cards", "bench")
#: The library calls behind the statistics, and the statistics' names: only craftmd/agreement.py may hold them.
LIBRARY = {"spearmanr", "kendalltau", "mannwhitneyu", "cohens_kappa", "fleiss_kappa", "roc_auc_score"}
NAMES = {"kappa", "weighted_kappa", "krippendorff_alpha", "spearman", "spearman_test", "kendall_tau", "auc", "auc_ci"}


def test_one_home_for_the_agreement_statistics():
    home = ROOT / "craftmd" / "agreement.py"
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == home:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and any(a.name in LIBRARY for a in node.names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {[a.name for a in node.names]}")
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in NAMES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} defines {node.name}")
    assert not found, "\n".join(found)


def test_kappa_and_auc_by_hand():
    from craftmd.agreement import auc, kappa, spearman

    # 10 pairs: both yes 4, both no 3, a yes b no 2, a no b yes 1 -> po 0.7, pe 0.6*0.5 + 0.4*0.5 = 0.5, kappa 0.4
    a = [1] * 4 + [0] * 3 + [1] * 2 + [0]
    b = [1] * 4 + [0] * 3 + [0] * 2 + [1]
    assert kappa(a, b) == pytest.approx(0.4) and kappa([1, 1], [1, 1]) is None
    # yes scores 3, 2; no scores 1, 2: pairs (3>1, 3>2, 2>1, 2=2 counts 1/2) -> 3.5 / 4
    assert auc([3, 2], [1, 2]) == pytest.approx(0.875) and auc([], [1]) is None
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8) and spearman([1, 1, 1], [1, 2, 3]) is None
