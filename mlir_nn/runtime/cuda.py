"""Run a compiled ``.mlirnn`` CUDA artifact: numpy + cuda-bindings, no MLIR, no egglog.

``CudaStep`` loads the artifact's cubins on a device, keeps the parameters (weights and
optimizer state) in device buffers and, per call, copies the mini-batch in, launches
the plan's kernels in order, and copies the outputs back.

Two ways to call it:

* ``run(inputs, params)`` — the Executable protocol used by ``mlir_nn.jit`` and
  ``Trainer``: the host parameter arrays are uploaded before the step and the updated
  values written back into them after it, so ``p.data`` is always current and writes
  into it are honoured (two parameter copies per step);
* ``upload_params(params)`` once, then ``step(inputs)`` repeatedly (parameters stay on
  the device and are updated there), and ``download_params(params)`` whenever the host
  arrays should see them (e.g. at the end of an epoch).

Arguments are checked with ``check_arguments`` before anything reaches the device.
The first call for each batch size synchronizes after every launch, so a failing
kernel is named in the error; the second captures the step's copies and launches as a
CUDA graph (its buffers and parameter pointers are fixed per batch size), and every later
call replays that graph: one launch per step instead of one per kernel.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlir_nn.backends.base import check_arguments
from mlir_nn.ir import Graph, make_node
from mlir_nn.runtime.artifact import Artifact
from mlir_nn.runtime.driver import CudaUnavailable, Device
from mlir_nn.runtime.plan import ITEMSIZE, BoundPlan, Copy, Launch, PlanError, View, bind, check_launch_abi

CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float, "f64": ctypes.c_double}


def signature_graph(signature: dict[str, Any]) -> Graph:
    """A Graph with the artifact's inputs and parameters, for ``check_arguments``."""
    def leaf(op: str, d: dict[str, Any]) -> Any:
        return make_node(op, (), name=d["name"], shape=tuple(d["shape"]), dtype=d["dtype"])

    return Graph(tuple(leaf("input", d) for d in signature["inputs"]),
                 tuple(leaf("param", d) for d in signature["params"]), (), (), name=signature["name"])


def check_arch(artifact_arch: str, device: Device) -> None:
    """A cubin runs on its own major version with an equal or newer minor version."""
    major, minor = int(artifact_arch[3:-1]), int(artifact_arch[-1])
    dev_major, dev_minor = device.capability
    if major != dev_major or minor > dev_minor:
        raise CudaUnavailable(f"the artifact holds cubins for {artifact_arch}, but {device.name} is {device.arch}; "
                              f"recompile with: mlir-nn compile --target cuda --arch {device.arch}")


@dataclass
class _Bound:
    """Device state for one set of input shapes: buffers and packed launches."""

    plan: BoundPlan
    buffers: dict[str, int]  # buffer id -> device pointer (inputs, allocations)
    steps: list[Copy | tuple[Any, Launch, ctypes.Array, list[Any]]]  # copies and (function, launch, params, keep)
    checked: bool = False
    graph: Any = None  # the captured CUDA graph of ``steps`` (instantiated), from the second call


class CudaStep:
    """One artifact loaded on one device (see the module docstring)."""

    def __init__(self, artifact: Artifact, device: Device | None = None) -> None:
        self.artifact = artifact
        self.device = device or Device()
        check_arch(artifact.arch, self.device)
        sig = artifact.signature
        self.graph = signature_graph(sig)
        self.n_inputs, self.n_outputs = len(sig["inputs"]), len(sig["outputs"])
        plan_args = artifact.plan["args"]
        if len(plan_args) != self.n_inputs + len(sig["params"]):
            raise PlanError(f"{sig['name']}: the plan takes {len(plan_args)} buffers, the signature has "
                            f"{self.n_inputs} inputs and {len(sig['params'])} parameters")
        param_index = {p["name"]: i for i, p in enumerate(sig["params"])}
        self.update_slots = [param_index[name] for name in sig["updates"]]
        self.param_ids = [a["id"] for a in plan_args[self.n_inputs:]]
        self.param_ptrs: list[int] = []
        self._params_host: list[np.ndarray] = []
        self._bound: dict[tuple, _Bound] = {}
        self.modules = {name: self.device.load_module(image, name) for name, image in artifact.cubins.items()}
        self.functions: dict[tuple[str, str], Any] = {}
        self.stream: Any = None  # where graphs are captured and replayed

    # ------------------------------------------------------------------ parameters

    def upload_params(self, params: list[np.ndarray]) -> None:
        """Copy host parameter arrays to the device (allocating the buffers the first time)."""
        check_arguments(self.graph, [np.zeros(self._input_shape(i, 1), d["dtype"])
                                     for i, d in enumerate(self.artifact.signature["inputs"])], params)
        self._upload(params)

    def _upload(self, params: list[np.ndarray]) -> None:
        """``upload_params`` for parameters already checked."""
        if not self.param_ptrs:
            self.param_ptrs = [self.device.alloc(p.nbytes, f"parameter {d['name']}")
                               for p, d in zip(params, self.artifact.signature["params"])]
        for ptr, p, d in zip(self.param_ptrs, params, self.artifact.signature["params"]):
            self.device.upload(ptr, p, f"parameter {d['name']}")
        self._params_host = list(params)

    def download_params(self, params: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Device parameter values, written into ``params`` in place when given."""
        if not self.param_ptrs:
            raise RuntimeError(f"{self.graph.name}: no parameters on the device yet; call upload_params first")
        sig = self.artifact.signature["params"]
        out = params if params is not None else [np.empty(p.shape, p.dtype) for p in self._params_host]
        for ptr, p, d in zip(self.param_ptrs, out, sig):
            if not p.flags.c_contiguous or not p.flags.writeable:
                raise ValueError(f"{self.graph.name}: parameter {d['name']} must be a writable C-contiguous array")
            self.device.download(p, ptr, f"parameter {d['name']}")
        return out

    # ------------------------------------------------------------------ running

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Executable protocol: upload params, run the step, write the new values into ``params``."""
        check_arguments(self.graph, inputs, params)  # once: the calls below take checked arguments
        for p, d in zip(params, self.artifact.signature["params"]):
            if not p.flags.c_contiguous:  # refused before the step, so no parameter is half-written
                raise ValueError(f"{self.graph.name}: parameter {d['name']} must be a C-contiguous array")
        self._upload(params)
        outputs = self._step(inputs)
        self.download_params(params)
        return outputs

    def step(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One step on device-resident parameters; returns the outputs."""
        if not self.param_ptrs:
            raise RuntimeError(f"{self.graph.name}: no parameters on the device yet; call upload_params first")
        check_arguments(self.graph, inputs, self._params_host)
        return self._step(inputs)

    def _step(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """``step`` for inputs already checked, with the parameters on the device."""
        self.device.activate()
        bound = self._bind([tuple(a.shape) for a in inputs])
        for arg, a, d in zip(bound.plan.args, inputs, self.artifact.signature["inputs"]):
            self.device.upload(bound.buffers[arg.buffer], a, f"input {d['name']}")
        what = f"{self.graph.name}: running the step's kernels"
        if not bound.checked:
            self._launch_all(bound)
            self.device.synchronize(what)
            bound.checked = True
        else:
            if bound.graph is None:
                self.stream = self.stream or self.device.stream()
                bound.graph = self.device.capture(self.stream, lambda: self._launch_all(bound, self.stream), what)
            self.device.replay(bound.graph, self.stream, what)
        outputs = []
        for view, d in zip(bound.plan.results[:self.n_outputs], self.artifact.signature["outputs"]):
            out = np.empty(view.shape, d["dtype"])
            self.device.download(out, self._address(bound, view), f"output of {self.graph.name}")
            outputs.append(out)
        for view, slot in zip(bound.plan.results[self.n_outputs:], self.update_slots):
            dst = self.param_ptrs[slot]
            src = self._address(bound, view)
            if src != dst:
                self.device.copy(dst, src, view.nbytes, f"update of parameter {self.param_ids[slot]}")
        return outputs

    def _launch_all(self, bound: _Bound, stream: Any = None) -> None:
        """Enqueue the step's copies and launches (on ``stream`` while capturing a graph)."""
        for item in bound.steps:
            if isinstance(item, Copy):
                self.device.copy(self._address(bound, item.dst), self._address(bound, item.src),
                                 item.src.nbytes, f"{self.graph.name}: buffer copy", stream)
                continue
            function, launch, params, _ = item
            what = f"{launch.binary}::{launch.kernel}"
            self.device.launch(function, launch.grid, launch.block, launch.smem, params, what, stream)
            if not bound.checked:
                self.device.synchronize(f"kernel {what} (grid {launch.grid}, block {launch.block})")

    def _address(self, bound: _Bound, view: View) -> int:
        base = bound.buffers.get(view.buffer)
        if base is None:
            base = self.param_ptrs[self.param_ids.index(view.buffer)]
        return base + view.offset * ITEMSIZE[view.dtype]

    def _input_shape(self, i: int, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == "N" else d for d in self.artifact.signature["inputs"][i]["shape"])

    def _bind(self, input_shapes: list[tuple[int, ...]]) -> _Bound:
        key = tuple(input_shapes)
        if key in self._bound:
            return self._bound[key]
        param_shapes = [tuple(p.shape) for p in self._params_host]
        plan = bind(self.artifact.plan, list(input_shapes) + param_shapes)
        _check_update_aliasing(plan, self.param_ids, self.update_slots, self.n_outputs)
        buffers = {}
        for view, d in zip(plan.args[:self.n_inputs], self.artifact.signature["inputs"]):
            buffers[view.buffer] = self.device.alloc(view.nbytes, f"input {d['name']}")
        for name, nbytes in plan.allocs.items():
            buffers[name] = self.device.alloc(nbytes, f"buffer {name} of {self.graph.name}")
        bound = _Bound(plan, buffers, [])
        for action in plan.actions:
            if isinstance(action, Copy):
                bound.steps.append(action)
            else:
                if action.binary in self.artifact.ptx:
                    check_launch_abi(action, self.artifact.ptx[action.binary])
                key_fn = (action.binary, action.kernel)
                if key_fn not in self.functions:
                    self.functions[key_fn] = self.device.function(self.modules[action.binary], action.kernel,
                                                                  f"{action.binary}::{action.kernel}")
                params, keep = _pack(action, lambda v, b=bound: self._address(b, v))
                bound.steps.append((self.functions[key_fn], action, params, keep))
        self._bound[key] = bound
        return bound

    def close(self) -> None:
        """Free every device buffer and module of this step."""
        for bound in self._bound.values():
            self.device.destroy(bound.graph)
            for ptr in bound.buffers.values():
                self.device.free(ptr)
        self.device.destroy(stream=self.stream)
        self.stream = None
        for ptr in self.param_ptrs:
            self.device.free(ptr)
        for module in self.modules.values():
            self.device.unload(module)
        self._bound, self.param_ptrs, self.modules = {}, [], {}


def _pack(launch: Launch, address: Any) -> tuple[ctypes.Array, list[Any]]:
    """cuLaunchKernel's kernelParams: an array of pointers to each parameter value."""
    values: list[Any] = []
    for kind, value in launch.params:
        if kind == "ptr":
            values.append(ctypes.c_uint64(address(View(value, (), "float32"))))
        else:
            values.append(CTYPES[kind](value))
    array = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
    return array, values


def _check_update_aliasing(plan: BoundPlan, param_ids: list[str], slots: list[int], n_outputs: int) -> None:
    """Updates are copied into parameter buffers after the step; none may read another's destination."""
    destinations = {param_ids[slot] for slot in slots}
    for view, slot in zip(plan.results[n_outputs:], slots):
        if view.buffer in destinations and view.buffer != param_ids[slot]:
            raise PlanError(f"the new value of {param_ids[slot]} lives in parameter buffer {view.buffer}, which is "
                            "itself updated; this runtime cannot order those copies")
