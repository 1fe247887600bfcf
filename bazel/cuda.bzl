"""cuda_library: .cu files compiled by nvcc in a genrule, wrapped in a cc_library.

Bazel 4 has no CUDA rules offline, so each .cu becomes one genrule that calls the toolkit's nvcc and
produces a position-independent object file; a cc_library then carries the objects, the headers and
the CUDA runtime. The objects are compiled for Hopper (sm_90a machine code, plus compute_90 PTX so
that other Hopper-compatible parts can JIT it). No GPU is needed to build: CI compiles everything.
"""

NVCC = "/usr/local/cuda/bin/nvcc"

NVCC_FLAGS = [
    "-c",
    "-Xcompiler",
    "-fPIC",
    "-std=c++17",
    "-O3",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=compute_90",
    # Host-side warnings of our own code are errors, as in DATTN_COPTS.
    "-Xcompiler",
    "-Wall,-Wextra",
    "--Werror",
    "all-warnings",
]

def cuda_library(name, srcs, hdrs = [], cu_deps_hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    """A cc_library of nvcc-compiled .cu files.

    Args:
      name: the cc_library's name.
      srcs: .cu files, one genrule (and one object) each.
      hdrs: public headers of the library (also visible to nvcc).
      cu_deps_hdrs: other headers the .cu files include (labels), made visible to nvcc.
      deps: cc deps of the library (the CUDA runtime is added).
      nvcc_flags: extra nvcc flags.
      **kwargs: passed to the cc_library (visibility, testonly, ...).
    """
    objs = []
    for src in srcs:
        if not src.endswith(".cu"):
            fail("cuda_library srcs must be .cu files, got " + src)
        base = src[:-len(".cu")].replace("/", "_")
        obj = "_nvcc_%s/%s.pic.o" % (name, base)
        # nvcc names its temporary files after its process id; in Bazel's sandbox every action has
        # its own PID namespace, so two nvcc runs in parallel would share names in /tmp. Each run
        # gets a private temporary folder.
        cmd = "tmp=$$(mktemp -d) && TMPDIR=$$tmp " + " ".join(
            [NVCC] + NVCC_FLAGS + nvcc_flags + [
                "-I.",
                "-I$(GENDIR)",
                "-I/usr/local/cuda/include",
                "-o $@",
                "$(location %s)" % src,
            ],
        ) + "; status=$$?; rm -rf $$tmp; exit $$status"
        native.genrule(
            name = "%s_%s_nvcc" % (name, base),
            srcs = [src] + hdrs + cu_deps_hdrs,
            outs = [obj],
            cmd = cmd,
            message = "nvcc %s" % src,
            testonly = kwargs.get("testonly", False),
            visibility = ["//visibility:private"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart_static"],
        **kwargs
    )
