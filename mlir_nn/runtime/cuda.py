"""Run a compiled ``.mlirnn`` CUDA artifact: numpy + cuda-bindings, no MLIR, no egglog.

``CudaStep`` loads the artifact's cubins on a device, keeps the parameters (weights and
optimizer state) in device buffers and, per call, copies the mini-batch in, launches
the plan's kernels in order, and copies the outputs back.

Three ways to call it:

* ``run(inputs, params)``: the host parameter arrays are uploaded before the step and
  the updated ones written back into them after it, so they are always current (two
  copies per updated parameter per step);
* ``upload_params(params)`` once, then ``step(inputs)`` repeatedly (parameters stay on
  the device and are updated there), and ``download_params(params)`` whenever the host
  arrays should see them;
* per slot: ``upload_param``/``download_param`` with ``bind`` and ``execute``, which is
  how ``mlir_nn.backends.cuda`` keeps parameters resident as ``mlir_nn.runtime.residency``
  directs. ``param_copies`` counts the parameter copies either way.

Arguments are checked (``check``) before anything reaches the device, and ``bind``
(plan, allocations) before any parameter buffer is written. The first call for each
batch size synchronizes after every launch, so a failing kernel is named in the error;
the second captures the whole step (its copies, launches and the copies of the updated
values into the parameter buffers) as a CUDA graph, its buffers and parameter pointers
being fixed per batch size, and every later call replays that graph: one launch per step
instead of one per kernel and copy. Only the inputs' uploads and the outputs' downloads
stay outside it: synchronous copies from and into numpy's (pageable) arrays.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlir_nn.ir import Graph, make_node
from mlir_nn.ir.arguments import check_arguments
from mlir_nn.runtime.artifact import Artifact
from mlir_nn.runtime.driver import CudaUnavailable, Device
from mlir_nn.runtime.plan import ITEMSIZE, BoundPlan, Copy, Launch, PlanError, View, bind, check_launch_abi

CTYPES = {"i64": ctypes.c_int64, "i32": ctypes.c_int32, "f32": ctypes.c_float, "f64": ctypes.c_double}


def signature_labels(signature: dict[str, Any]) -> dict[int, int]:
    """{input position: classes} of the signature's label inputs."""
    return {i: d["classes"] for i, d in enumerate(signature["inputs"]) if "classes" in d}


class ArgumentCheck:
    """An artifact's signature as the checks its arguments must pass before anything reaches
    the device: shapes, dtypes, finite inputs, class labels, C-contiguous parameters."""

    def __init__(self, signature: dict[str, Any]) -> None:
        self.signature = signature
        self.graph = signature_graph(signature)
        self.labels = signature_labels(signature)

    def __call__(self, inputs: list[np.ndarray], params: list[np.ndarray], layout: bool = True) -> None:
        check_arguments(self.graph, inputs, params, labels=self.labels)
        if layout:
            for p, d in zip(params, self.signature["params"]):
                if not p.flags.c_contiguous:  # refused before the step, so no parameter is half-written
                    raise ValueError(f"{self.graph.name}: parameter {d['name']} must be a C-contiguous array")


def signature_graph(signature: dict[str, Any]) -> Graph:
    """A Graph with the artifact's inputs and parameters, for ``check_arguments``."""
    def leaf(op: str, d: dict[str, Any]) -> Any:
        return make_node(op, (), name=d["name"], shape=tuple(d["shape"]), dtype=d["dtype"])

    return Graph(tuple(leaf("input", d) for d in signature["inputs"]),
                 tuple(leaf("param", d) for d in signature["params"]), (), (), name=signature["name"])


def arch_version(arch: str) -> tuple[int, int, bool]:
    """(major, minor, arch-specific) of ``sm_XY`` or ``sm_XYa`` (``sm_100`` is 10.0)."""
    m = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
    if m is None:
        raise PlanError(f"{arch!r} is not a CUDA arch of the form sm_XY or sm_XYa")
    return int(m.group(1)), int(m.group(2)), bool(m.group(3))


def runs_on(artifact_arch: str, capability: tuple[int, int]) -> bool:
    """True when a cubin for ``artifact_arch`` runs on a device of this compute capability: its
    own major version with an equal or newer minor version; an arch-specific one (``sm_90a``)
    on its exact version only."""
    major, minor, specific = arch_version(artifact_arch)
    dev_major, dev_minor = capability
    return major == dev_major and minor <= dev_minor and not (specific and minor != dev_minor)


def check_arch(artifact_arch: str, device: Device) -> None:
    """Raise ``CudaUnavailable`` unless the artifact's cubins run on ``device`` (``runs_on``)."""
    if not runs_on(artifact_arch, device.capability):
        raise CudaUnavailable(f"the artifact holds cubins for {artifact_arch}, but {device.name} is {device.arch}; "
                              f"recompile with: mlir-nn compile --target cuda --arch {device.arch}")


@dataclass
class _Bound:
    """Device state for one set of input shapes: buffers and packed launches."""

    plan: BoundPlan
    buffers: dict[str, int]  # buffer id -> device pointer (inputs, allocations)
    steps: list[Copy | tuple[Any, Launch, ctypes.Array, list[Any]]]  # copies and (function, launch, params, keep)
    updates: list[tuple[int, int, int, str]]  # (dst, src, bytes, what): results copied into parameter buffers
    updates_in_graph: bool  # False when an output lives in a buffer an update overwrites (read it first)
    checked: bool = False
    graph: Any = None  # the captured CUDA graph of ``steps`` (instantiated), from the second call


class CudaStep:
    """One artifact loaded on one device (see the module docstring).

    ``param_copies`` counts parameter arrays copied to the device and back to the host.
    """

    def __init__(self, artifact: Artifact, device: Device | None = None) -> None:
        self.artifact = artifact
        self.device = device or Device()
        check_arch(artifact.arch, self.device)
        sig = artifact.signature
        self.check = ArgumentCheck(sig)  # (inputs, params): refuses bad arguments before the device sees them
        self.graph = self.check.graph
        self.n_inputs, self.n_outputs = len(sig["inputs"]), len(sig["outputs"])
        plan_args = artifact.plan["args"]
        if len(plan_args) != self.n_inputs + len(sig["params"]):
            raise PlanError(f"{sig['name']}: the plan takes {len(plan_args)} buffers, the signature has "
                            f"{self.n_inputs} inputs and {len(sig['params'])} parameters")
        param_index = {p["name"]: i for i, p in enumerate(sig["params"])}
        self.update_slots = [param_index[name] for name in sig["updates"]]
        self.param_ids = [a["id"] for a in plan_args[self.n_inputs:]]
        self.param_shapes = [tuple(p["shape"]) for p in sig["params"]]
        self._param_templates = [np.empty(s, p["dtype"]) for s, p in zip(self.param_shapes, sig["params"])]
        self.param_ptrs: list[int] = []
        self._uploaded: set[int] = set()  # slots whose buffer holds a value
        self.param_copies = {"to_device": 0, "to_host": 0}
        self._bound: dict[tuple, _Bound] = {}
        self.modules = {name: self.device.load_module(image, name) for name, image in artifact.cubins.items()}
        self.functions: dict[tuple[str, str], Any] = {}
        self.stream: Any = None  # where graphs are captured and replayed

    # ------------------------------------------------------------------ parameters

    def upload_params(self, params: list[np.ndarray]) -> None:
        """Copy host parameter arrays to the device (allocating the buffers the first time)."""
        self.check([np.zeros(self._input_shape(i, 1), d["dtype"])
                    for i, d in enumerate(self.artifact.signature["inputs"])], params)
        for slot, p in enumerate(params):
            self.upload_param(slot, p)

    def upload_param(self, slot: int, array: np.ndarray) -> None:
        """Copy one checked parameter array to its device buffer."""
        self.device.activate()  # the calling thread may not have the context current
        self._alloc_params()
        self.device.upload(self.param_ptrs[slot], array, f"parameter {self.param_name(slot)}")
        self._uploaded.add(slot)
        self.param_copies["to_device"] += 1

    def download_params(self, params: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Device parameter values, written into ``params`` in place when given."""
        sig = self.artifact.signature["params"]
        out = params if params is not None else [np.empty(s, d["dtype"]) for s, d in zip(self.param_shapes, sig)]
        for slot, p in enumerate(out):
            self.download_param(slot, p)
        return out

    def download_param(self, slot: int, array: np.ndarray) -> None:
        """Copy one parameter's device buffer into ``array`` (writable, C-contiguous, its shape)."""
        name = self.param_name(slot)
        if slot not in self._uploaded:
            raise RuntimeError(f"{self.graph.name}: parameter {name} is not on the device yet; upload it first")
        if not array.flags.c_contiguous or not array.flags.writeable or array.shape != self.param_shapes[slot]:
            raise ValueError(f"{self.graph.name}: parameter {name} must be a writable C-contiguous array "
                             f"of shape {self.param_shapes[slot]}")
        self.device.activate()
        self.device.download(array, self.param_ptrs[slot], f"parameter {name}")
        self.param_copies["to_host"] += 1

    def _alloc_params(self) -> None:
        if not self.param_ptrs:
            self.param_ptrs = [self.device.alloc(p.nbytes, f"parameter {d['name']}")
                               for p, d in zip(self._param_templates, self.artifact.signature["params"])]

    def _require_params(self) -> None:
        if len(self._uploaded) < len(self.param_shapes):
            raise RuntimeError(f"{self.graph.name}: no parameters on the device yet; call upload_params first")

    def param_name(self, slot: int) -> str:
        return self.artifact.signature["params"][slot]["name"]

    # ------------------------------------------------------------------ running

    def run(self, inputs: list[np.ndarray], params: list[np.ndarray]) -> list[np.ndarray]:
        """Executable protocol: upload params, run the step, write the new values into ``params``."""
        self.check(inputs, params)  # once: the calls below take checked arguments
        bound = self.bind([tuple(a.shape) for a in inputs])
        for slot, p in enumerate(params):
            self.upload_param(slot, p)
        outputs = self.execute(bound, inputs)
        for slot in self.update_slots:
            self.download_param(slot, params[slot])
        return outputs

    def step(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One step on device-resident parameters; returns the outputs."""
        self._require_params()
        self.check(inputs, self._param_templates, layout=False)
        return self.execute(self.bind([tuple(a.shape) for a in inputs]), inputs)

    def execute(self, bound: _Bound, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run the step bound for these (checked) inputs on the parameters on the device.

        A failure here may leave parameter buffers half-updated; ``bind`` fails before any."""
        self._require_params()
        self.device.activate()
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
        if not bound.updates_in_graph:
            for dst, src, nbytes, update in bound.updates:
                self.device.copy(dst, src, nbytes, update)
        return outputs

    def _launch_all(self, bound: _Bound, stream: Any = None) -> None:
        """Enqueue the step's copies and launches, then the updates' copies into the parameter
        buffers when they belong to the graph (on ``stream`` while capturing it)."""
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
        if bound.updates_in_graph:
            for dst, src, nbytes, update in bound.updates:
                self.device.copy(dst, src, nbytes, update, stream)

    def _address(self, bound: _Bound, view: View) -> int:
        base = bound.buffers.get(view.buffer)
        if base is None:
            base = self.param_ptrs[self.param_ids.index(view.buffer)]
        return base + view.offset * ITEMSIZE[view.dtype]

    def _input_shape(self, i: int, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == "N" else d for d in self.artifact.signature["inputs"][i]["shape"])

    def bind(self, input_shapes: list[tuple[int, ...]]) -> _Bound:
        """The step for these input shapes: plan evaluated, buffers allocated, launches packed
        (cached per shapes). It writes no parameter buffer, so a failure here (e.g. out of
        device memory) leaves the device copies intact."""
        key = tuple(input_shapes)
        if key in self._bound:
            return self._bound[key]
        self.device.activate()
        self._alloc_params()
        plan = bind(self.artifact.plan, list(input_shapes) + self.param_shapes)
        _check_update_aliasing(plan, self.param_ids, self.update_slots, self.n_outputs)
        buffers = {}
        for view, d in zip(plan.args[:self.n_inputs], self.artifact.signature["inputs"]):
            buffers[view.buffer] = self.device.alloc(view.nbytes, f"input {d['name']}")
        for name, nbytes in plan.allocs.items():
            buffers[name] = self.device.alloc(nbytes, f"buffer {name} of {self.graph.name}")
        bound = _Bound(plan, buffers, [], [], True)
        for view, slot in zip(plan.results[self.n_outputs:], self.update_slots):
            dst, src = self.param_ptrs[slot], self._address(bound, view)
            if src != dst:
                bound.updates.append((dst, src, view.nbytes, f"update of parameter {self.param_name(slot)}"))
        overwritten = {self.param_ids[self.param_ptrs.index(dst)] for dst, *_ in bound.updates}
        bound.updates_in_graph = not any(v.buffer in overwritten for v in plan.results[:self.n_outputs])
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
        self._bound, self.param_ptrs, self.modules, self._uploaded = {}, [], {}, set()


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
