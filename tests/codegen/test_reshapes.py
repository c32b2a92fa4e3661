"""Which reshapes lower to collapse/expand views."""

from mlir_nn.codegen.reshapes import reassociation


def test_merges_of_neighbouring_axes_and_where_the_batch_may_go():
    assert reassociation(("N", 16, 5, 5), ("N", 400)) == [[0], [1, 2, 3]]
    assert reassociation((2, 3, 4), (6, 4)) == [[0, 1], [2]]
    assert reassociation((1, "N", 3), ("N", 3)) == [[0, 1], [2]]
    assert reassociation((4, 1, 1), (4,)) == [[0, 1, 2]]
    assert reassociation((2, 3, 4), (3, 8)) is None  # not a merge of neighbours
    assert reassociation(("N", 2), (2, "N")) is None
    assert reassociation((2, "N", 3), ("N", 6)) is None  # the batch merges only with size-1 axes
