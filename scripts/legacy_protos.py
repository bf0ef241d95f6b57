"""Rebuilds proto/legacy/*.proto (TensorRT Inference Server 1.x, package nvidia.inferenceserver)
from the descriptors in the generated modules of the `tensorrtserver` 1.11.0 wheel, and writes
those descriptors as a FileDescriptorSet for the test that compares them with ours.

    pip download --no-deps tensorrtserver==1.11.0 -d /tmp/trt
    python scripts/legacy_protos.py /tmp/trt/tensorrtserver-1.11.0-py3-none-any.whl
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[1]
FILES = ["model_config", "request_status", "server_status", "api", "grpc_service"]

SCALARS = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def serialized(source: str) -> bytes:
    """The serialized_pb argument of the module's FileDescriptor(...) call."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "serialized_pb":
            value = node.value
            if isinstance(value, ast.Call):  # _b('...')
                value = value.args[0]
            return ast.literal_eval(value).encode("latin1")
    raise ValueError("no serialized_pb")


def type_name(field: descriptor_pb2.FieldDescriptorProto, package: str) -> str:
    if field.type in SCALARS:
        return SCALARS[field.type]
    name = field.type_name.lstrip(".")
    return name[len(package) + 1 :] if name.startswith(package + ".") else name


def emit_enum(e: descriptor_pb2.EnumDescriptorProto, indent: str, out: list[str]) -> None:
    out.append(f"{indent}enum {e.name} {{")
    for v in e.value:
        out.append(f"{indent}  {v.name} = {v.number};")
    out.append(f"{indent}}}")


def emit_message(m: descriptor_pb2.DescriptorProto, package: str, indent: str, out: list[str]) -> None:
    out.append(f"{indent}message {m.name} {{")
    maps = {n.name: n for n in m.nested_type if n.options.map_entry}
    for e in m.enum_type:
        emit_enum(e, indent + "  ", out)
    for n in m.nested_type:
        if not n.options.map_entry:
            emit_message(n, package, indent + "  ", out)
    oneof_open = None
    for f in m.field:
        inner = indent + "  "
        in_oneof = f.HasField("oneof_index")
        if oneof_open is not None and (not in_oneof or f.oneof_index != oneof_open):
            out.append(f"{indent}  }}")
            oneof_open = None
        if in_oneof and oneof_open is None:
            out.append(f"{indent}  oneof {m.oneof_decl[f.oneof_index].name} {{")
            oneof_open = f.oneof_index
        if in_oneof:
            inner += "  "
        entry = maps.get(f.type_name.rsplit(".", 1)[-1]) if f.type == f.TYPE_MESSAGE else None
        if entry is not None and f.label == f.LABEL_REPEATED:
            k, v = entry.field
            out.append(f"{inner}map<{type_name(k, package)}, {type_name(v, package)}> {f.name} = {f.number};")
            continue
        label = "repeated " if f.label == f.LABEL_REPEATED else ""
        out.append(f"{inner}{label}{type_name(f, package)} {f.name} = {f.number};")
    if oneof_open is not None:
        out.append(f"{indent}  }}")
    out.append(f"{indent}}}")


def emit_file(fd: descriptor_pb2.FileDescriptorProto) -> str:
    out = [
        "// Rebuilt by scripts/legacy_protos.py from the descriptors in the generated modules of",
        "// the tensorrtserver 1.11.0 wheel (TensorRT Inference Server 1.x). Field names and",
        "// numbers are theirs; do not edit by hand.",
        "",
        f'syntax = "{fd.syntax or "proto2"}";',
        "",
        f"package {fd.package};",
        "",
    ]
    for dep in fd.dependency:
        out.append(f'import "{dep}";')
    if fd.dependency:
        out.append("")
    for e in fd.enum_type:
        emit_enum(e, "", out)
        out.append("")
    for m in fd.message_type:
        emit_message(m, fd.package, "", out)
        out.append("")
    for s in fd.service:
        out.append(f"service {s.name} {{")
        for r in s.method:
            cs = "stream " if r.client_streaming else ""
            ss = "stream " if r.server_streaming else ""
            i, o = (n.lstrip(".")[len(fd.package) + 1 :] for n in (r.input_type, r.output_type))
            out.append(f"  rpc {r.name}({cs}{i}) returns ({ss}{o}) {{}}")
        out.append("}")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def main(wheel: str) -> None:
    files = descriptor_pb2.FileDescriptorSet()
    with zipfile.ZipFile(wheel) as z:
        names = {Path(n).name: n for n in z.namelist()}
        for name in FILES:
            fd = descriptor_pb2.FileDescriptorProto.FromString(serialized(z.read(names[f"{name}_pb2.py"]).decode()))
            files.file.append(fd)
            (ROOT / "proto" / "legacy" / fd.name).write_text(emit_file(fd))
    (ROOT / "tests" / "data").mkdir(exist_ok=True)
    (ROOT / "tests" / "data" / "tensorrtserver-1.11.0.descriptors.pb").write_bytes(files.SerializeToString())


if __name__ == "__main__":
    main(sys.argv[1])
