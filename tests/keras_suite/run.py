"""Runs Keras's own model, saving and trainer tests on `MaskedModel` and `MaskedSequential`.

The installed `keras` package ships its test files. This script copies the ones
below from the installed version, rewrites every reference to `keras.Model` in
them (and only in them: Keras itself is untouched) to `maskfit.MaskedModel`,
and every reference to `keras.Sequential` to `maskfit.MaskedSequential`,
runs the stock copies and the rewritten copies with pytest, each set in a
process of its own (the two side by side) in the files' normal order, and fails when a test that passes with
stock Keras does not pass with `MaskedModel`, unless it is listed in
`INCOMPATIBLE` with the reason it cannot pass by construction.

Usage:

    python tests/keras_suite/run.py [--workdir DIR] [-k EXPR]
"""

import argparse
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FILES = (
    "models/model_test.py",
    "models/functional_test.py",
    "models/sequential_test.py",
    "saving/saving_lib_test.py",
    "saving/saving_api_test.py",
    "trainers/trainer_test.py",
)

# Tests that cannot pass with MaskedModel by construction: node id -> reason.
INCOMPATIBLE = {
    "models__functional_test::FunctionalTest::test_basic_flow_multi_input": (
        "builds `Functional(inputs, outputs)` directly and asserts that it is an"
        " instance of `Model`, which is MaskedModel here: a plain Functional is"
        " not a MaskedModel, as intended."
    ),
}
if os.environ.get("KERAS_BACKEND") == "torch":
    INCOMPATIBLE[
        "saving__saving_lib_test::SavingTest::test_saved_module_paths_and_class_names"
    ] = (
        "asserts that the saved optimizer is serialized as Keras's torch subclass"
        " (module keras.src.backend.torch.optimizers...); MaskedModel saves the"
        " public class (keras.optimizers), so that the file loads under"
        " TensorFlow and JAX without importing torch."
    )

# Rewrites of the test sources: (pattern, replacement). Word boundaries keep
# other names (`keras.models.model_from_json`, `Functional`) as they are.
MASKED_REWRITES = (
    (
        r"^from keras\.src\.models\.model import Model$",
        "from maskfit import MaskedModel as Model",
    ),
    (
        r"^from keras\.src\.models import Model$",
        "from maskfit import MaskedModel as Model",
    ),
    (
        r"^from keras\.src\.models(\.sequential)? import Sequential$",
        "from maskfit import MaskedSequential as Sequential",
    ),
    (r"(?<![\w.])keras\.(models\.)?Sequential\b", "maskfit.MaskedSequential"),
    (r"(?<![\w.])keras\.models\.Model\b", "maskfit.MaskedModel"),
    (r"(?<![\w.])keras\.Model\b", "maskfit.MaskedModel"),
    (r"(?<![\w.])models\.Model\b", "maskfit.MaskedModel"),
)

# Both copies: `trainer_test.py` imports jax at the top for its jax-only tests.
COMMON_REWRITES = (
    (r"^import jax$", "try:\n    import jax\nexcept ImportError:\n    jax = None"),
)


def _keras_src():
    # Found without importing keras, so this process loads no TensorFlow.
    spec = importlib.util.find_spec("keras")
    return os.path.join(spec.submodule_search_locations[0], "src")


def _rewrite(source, rewrites):
    for pattern, replacement in rewrites:
        source = re.sub(pattern, replacement, source, flags=re.MULTILINE)
    return source


def _copy_tests(target, masked):
    os.makedirs(target, exist_ok=True)
    rewrites = COMMON_REWRITES + (MASKED_REWRITES if masked else ())
    names = []
    for relative in FILES:
        with open(os.path.join(_keras_src(), relative)) as f:
            source = f.read()
        source = _rewrite(source, rewrites)
        if masked:
            if "maskfit" not in source:
                raise RuntimeError(
                    f"No reference to keras.Model was rewritten in {relative}."
                )
            source = "import maskfit  # noqa: F401\n" + source
        name = relative.replace("/", "__")
        with open(os.path.join(target, name), "w") as f:
            f.write(source)
        names.append(name)
    return names


def _outcomes(report):
    """Maps `file::Class::test` to "passed", "failed" or "skipped" from a JUnit XML."""
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        node = module.replace(".", "::") + "::" + case.get("name")
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[node] = "failed"
        elif case.find("skipped") is not None:
            outcomes[node] = "skipped"
        else:
            outcomes[node] = "passed"
    return outcomes


def _start(folder, names, extra):
    """Starts pytest on the copies in `folder`; returns the process and its report's path."""
    report = os.path.join(folder, "report.xml")
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore",
        "--junitxml",
        report,
        "-o",
        "junit_family=xunit1",
        "--rootdir",
        folder,
        *extra,
        *names,
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir", help="where to write the copies (default: a temp dir)"
    )
    parser.add_argument(
        "-k", dest="keyword", help="pytest -k expression, to run a subset"
    )
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="keras_suite_")
    extra = ["-k", args.keyword] if args.keyword else []
    # The two sets run side by side, each in its own process (one core each
    # on a 2-core machine): about half the time of one after the other.
    started = {}
    for kind in ("stock", "masked"):
        folder = os.path.join(workdir, kind)
        shutil.rmtree(folder, ignore_errors=True)
        names = _copy_tests(folder, masked=kind == "masked")
        started[kind] = _start(folder, names, extra)
    results = {}
    for kind, (process, report) in started.items():
        process.wait()
        results[kind] = _outcomes(report)
    stock, masked = results["stock"], results["masked"]
    passed = sorted(n for n, o in stock.items() if o == "passed")
    both = [n for n in passed if masked.get(n) == "passed"]
    listed = [n for n in passed if n not in both and n in INCOMPATIBLE]
    broken = [n for n in passed if n not in both and n not in INCOMPATIBLE]
    print(
        f"Keras {importlib.metadata.version('keras')}: {len(passed)} tests pass"
        f" with keras.Model; {len(both)} of them pass with MaskedModel."
    )
    for node in listed:
        print(f"incompatible by construction: {node}: {INCOMPATIBLE[node]}")
    for node in broken:
        print(f"FAILED with MaskedModel (passes with keras.Model): {node}")
    print(f"{len(both)} passed, {len(broken)} failed, {len(listed)} skipped")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
