"""The ``.mlirnn`` artifact: one zip file holding a compiled CUDA step.

Layout::

    manifest.json        format, versions, arch, graph fingerprint, signature, plan,
                         and per binary its file and sha256
    cubin/<name>.cubin   one cubin per gpu.module (kernel module)
    ptx/<name>.ptx       the same kernels as PTX (for inspection and the ABI check)

The signature names the step's inputs and parameters (shapes with "N" for the batch;
label inputs with their number of classes), its outputs and which parameter each trailing
result updates. The plan is the host program of ``mlir_nn.runtime.plan``. Reading checks
the format, the arch and every binary's hash, so a truncated or edited file is an error,
never run.
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlir_nn.ir import Graph
from mlir_nn.ir.arguments import label_inputs

FORMAT = "mlirnn-cuda"
FORMAT_VERSION = 2  # 2: label inputs carry their class count, so the runtime checks them


class ArtifactError(ValueError):
    """The file is not a usable artifact (wrong format, version, arch or damaged)."""


@dataclass
class Artifact:
    arch: str
    graph_fingerprint: str
    signature: dict[str, Any]
    plan: dict[str, Any]
    cubins: dict[str, bytes]
    ptx: dict[str, str] = field(default_factory=dict)
    package_version: str = ""
    info: dict[str, Any] = field(default_factory=dict)  # free-form: compile timings, schedule counts

    def manifest(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "package_version": self.package_version,
            "arch": self.arch, "graph_fingerprint": self.graph_fingerprint, "signature": self.signature,
            "plan": self.plan, "info": self.info,
            "binaries": {name: {"cubin": f"cubin/{name}.cubin", "sha256": hashlib.sha256(data).hexdigest(),
                                "ptx": f"ptx/{name}.ptx" if name in self.ptx else None}
                         for name, data in sorted(self.cubins.items())},
        }

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(self.manifest(), indent=1, sort_keys=True))
            for name, data in sorted(self.cubins.items()):
                z.writestr(f"cubin/{name}.cubin", data)
            for name, text in sorted(self.ptx.items()):
                z.writestr(f"ptx/{name}.ptx", text)
        return buf.getvalue()

    def write(self, path: str | Path) -> None:
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "<bytes>") -> Artifact:
        try:
            z = zipfile.ZipFile(io.BytesIO(data))
            m = json.loads(z.read("manifest.json"))
        except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as e:
            raise ArtifactError(f"{where}: not an mlir-nn CUDA artifact ({e})") from None
        if m.get("format") != FORMAT:
            raise ArtifactError(f"{where}: format is {m.get('format')!r}, expected {FORMAT!r}")
        if m.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(
                f"{where}: format version {m.get('format_version')}, this runtime reads {FORMAT_VERSION}")
        cubins, ptx = {}, {}
        with z:
            for name, entry in m["binaries"].items():
                try:
                    blob = z.read(entry["cubin"])
                    if entry.get("ptx"):
                        ptx[name] = z.read(entry["ptx"]).decode()
                except KeyError as e:
                    raise ArtifactError(f"{where}: missing {e} for kernel module {name}") from None
                if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
                    raise ArtifactError(f"{where}: cubin of kernel module {name} is damaged (sha256 mismatch)")
                cubins[name] = blob
        missing = {r["binary"] for r in m["plan"]["program"] if r["op"] == "gpu.launch_func"} - set(cubins)
        if missing:
            raise ArtifactError(f"{where}: the plan launches kernel modules with no cubin: {sorted(missing)}")
        return cls(m["arch"], m["graph_fingerprint"], m["signature"], m["plan"], cubins, ptx,
                   m.get("package_version", ""), m.get("info", {}))

    @classmethod
    def read(cls, path: str | Path) -> Artifact:
        try:
            if not stat.S_ISREG(Path(path).stat().st_mode):  # /dev/zero would be read forever, a pipe waited on
                raise ArtifactError(f"cannot read artifact {path}: not a regular file (a folder, device or pipe)")
            data = Path(path).read_bytes()
        except OSError as e:
            raise ArtifactError(f"cannot read artifact {path}: {e.strerror}") from None
        return cls.from_bytes(data, str(path))


def signature_of(graph: Graph) -> dict[str, Any]:
    """What the runtime needs of a Graph: names, shapes ("N" = batch) and dtypes, and for
    inputs that are class labels their number of classes."""
    def leaf(n: Any) -> dict[str, Any]:
        return {"name": n.attr("name"), "shape": list(n.shape), "dtype": n.dtype}

    labels = label_inputs(graph)
    inputs = [leaf(n) | ({"classes": labels[i]} if i in labels else {}) for i, n in enumerate(graph.inputs)]
    return {
        "name": graph.name,
        "inputs": inputs,
        "params": [leaf(n) for n in graph.params],
        "outputs": [{"shape": list(n.shape), "dtype": n.dtype} for n in graph.outputs],
        "updates": [name for name, _ in graph.updates],
    }
