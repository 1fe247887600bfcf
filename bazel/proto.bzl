"""cc_grpc_proto: protoc + grpc_cpp_plugin from Debian, run as a genrule (no rules_proto offline)."""

def cc_grpc_proto(name, srcs, deps = [], grpc = True, proto_root = "proto", **kwargs):
    """Generates C++ messages (and gRPC stubs when grpc=True) for srcs and wraps them in a cc_library.

    srcs are paths relative to this package; imports resolve against `proto_root` (the package folder
    that holds the `dattn/...` tree) and Debian's /usr/include (google/protobuf/*.proto).
    """
    pkg = native.package_name()
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    root = pkg if proto_root == "." else proto_root
    cmd = ("/usr/bin/protoc -I{root} -I/usr/include --cpp_out=$(GENDIR)/{root} ".format(root = root))
    if grpc:
        cmd += "--grpc_out=$(GENDIR)/{root} --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin ".format(root = root)
    cmd += " ".join(["$(location %s)" % s for s in srcs])
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        includes = ["."],
        deps = deps + ["//third_party:grpc"],
        **kwargs
    )
