"""The roofline model's arithmetic (mlir_nn.runtime.perf_model), on hand-made kernel resources."""

from mlir_nn.runtime.perf_model import H200, KernelResources, predict, shared_load_bytes

NODE = {"op": "sum_to", "kernels": ["k03_sum_to_partial", "k03_sum_to_total"], "flops": (1024, 0), "bytes": (0, 0)}
RESOURCES = {k: KernelResources(registers=32, smem=0, spill_bytes=0, fma=0, shared_loads=0) for k in NODE["kernels"]}


def test_a_nodes_compute_is_scaled_by_its_main_kernels_grid_not_its_one_block_total():
    (row,) = predict([NODE], RESOURCES, {}, batch=4096, grids={"k03_sum_to_partial": 128, "k03_sum_to_total": 1})
    assert row["sm_fraction"] == round(128 / H200["sms"], 3)
    (full,) = predict([NODE], RESOURCES, {}, batch=4096)
    assert full["sm_fraction"] == 1.0


def test_shared_load_bytes_counts_vector_widths():
    body = ("ld.shared.v4.f32 {%f1, %f2, %f3, %f4}, [%r1];\n ld.shared.f32 %f5, [%r2];\n"
            " ld.shared.v2.b64 {%rd1, %rd2}, [%r3];")
    assert shared_load_bytes(body) == 16 + 4 + 16
