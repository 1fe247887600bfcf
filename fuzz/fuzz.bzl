"""One libFuzzer target: its harness, its binary and the replay of its checked-in corpus."""

load("//bazel:copts.bzl", "DATTN_COPTS")

def dattn_fuzz_target(name, srcs, deps):
    """Declares the fuzzer `name` and `name + "_corpus_test"`, the replay of its corpus.

    The harness (LLVMFuzzerTestOneInput in `srcs`) is compiled like any project code. Under
    --config=fuzz (.bazelrc: --define=dattn_fuzz=1) the binary links libFuzzer's main
    (-fsanitize=fuzzer) and scripts/fuzz.sh runs it. In every other build it links replay_main.cc,
    which runs the harness once on each file it is given, so `name + "_corpus_test"` replays
    fuzz/corpus/<name>/ (the seeds and every input that once failed) in plain `bazel test //...` and
    under --config=sanitize.
    """
    harness = name + "_harness"
    native.cc_library(
        name = harness,
        srcs = srcs,
        copts = DATTN_COPTS,
        deps = deps,
        alwayslink = True,
    )
    main = select({
        "//fuzz:fuzzing": [],
        "//conditions:default": ["//fuzz:replay_main"],
    })
    linkopts = select({
        "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
        "//conditions:default": [],
    })
    native.cc_binary(
        name = name,
        deps = [":" + harness] + main,
        linkopts = linkopts,
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        deps = [":" + harness] + main,
        linkopts = linkopts,
        data = native.glob(["corpus/" + name + "/*"]),
        # libFuzzer's main, given -runs=0 and a folder, runs each input once too.
        args = ["-runs=0", "fuzz/corpus/" + name],
    )
