"""`search/` hands back paths and never grades: answer extraction and math-verify grouping live outside it
(`specscale/answers.py`, given to the runtime by the composition roots)."""

from test_imports import import_graph


def test_search_does_not_import_grading():
    graph = import_graph()
    search = {m: targets for m, targets in graph.items() if m.startswith("specscale.search.")}
    assert search and all(not t.startswith("specscale.grading") for targets in search.values() for t in targets)
