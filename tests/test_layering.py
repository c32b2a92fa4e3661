"""The package's modules import in one direction: no circles, not even through imports
inside functions (the layers themselves are import-linter's contract, run by ``make lint``)."""

import grimp

PACKAGE = "mlir_nn"


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.find_modules_directly_imported_by(target)))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
    return groups


def test_no_import_circles():
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=True)
    assert _circles(graph) == []


def test_a_circle_is_found():
    graph = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    assert _circles(graph) == []
    graph.add_import(importer="p.c", imported="p.a")
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]


def test_only_tests_and_scripts_import_the_package_root():
    """``mlir_nn/__init__`` imports the user API; a stage importing it would climb back up."""
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=True)
    assert sorted(graph.find_modules_that_directly_import(PACKAGE)) == []
