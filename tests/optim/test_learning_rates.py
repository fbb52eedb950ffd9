"""A learning-rate multiplier m steps a variable as its own optimizer at learning rate x m.

At the optimizer level: variables updated by one optimizer under
`scaled_learning_rates` against the same variables updated by separate
optimizers of the same class at a learning-rate schedule x m, with weight
decay on, over the same gradients (fixed, so entries never couple through
a loss). Variables without a multiplier, and with m = 1, are bit-identical
to stock Keras.
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from maskfit.optim import rate_modes as optimizer_rates
from maskfit.optim import rates as learning_rates
from maskfit.optim.rates import scaled_learning_rates
from tests.helpers.keras_versions import param_if_shipped
from tests.step.test_exactness import OPTIMIZERS

STEPS = 20
MULTIPLIERS = (0.1, 0.5, 3.0)
# Per column of a (3, 4) variable; column 3 runs at m = 1, as stock.
COLUMNS = (0.1, 0.5, 3.0, 1.0)
# Whose update couples a variable's entries through its weights (Lamb's trust
# ratio, Adafactor's RMS): a per-entry multiplier is not a per-entry optimizer.
COUPLED = ("Lamb", "Adafactor")
# Graph first: it computes the references the others compare with.
EXECUTIONS = ("graph", "eager", "jit")
# For the every-optimizer matrix: its eager and jit cases run with the slow
# tests (.ci/run runs them); the tests below keep every mode with AdamW.
EXECUTIONS_GRAPH_FAST = ("graph",) + tuple(
    pytest.param(name, marks=pytest.mark.slow) for name in ("eager", "jit")
)
# Two computations of one value (the references run in graph mode).
TOLERANCE = dict(rtol=2e-5, atol=1e-6)

RNG = np.random.default_rng(0)
INIT = RNG.normal(size=(3, 4)).astype("float32")
GRADS = tf.constant(RNG.normal(size=(STEPS, 3, 4)).astype("float32"))


class ScaledDecay(keras.optimizers.schedules.LearningRateSchedule):
    """`ExponentialDecay(base, 4, 0.8)`, times `m` (not at all when m is None)."""

    def __init__(self, base, m=None):
        self.m = m
        self.decay = keras.optimizers.schedules.ExponentialDecay(base, 4, 0.8)

    def __call__(self, step):
        rate = self.decay(step)
        return rate if self.m is None else rate * self.m


def make(name, m=None, schedule=ScaledDecay, **kwargs):
    """`OPTIMIZERS[name]` with weight decay and its learning rate on a schedule (x m)."""
    optimizer = OPTIMIZERS[name](**{"weight_decay": 0.1, **kwargs})
    base = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    optimizer.learning_rate = schedule(base, m)
    return optimizer


def train(step, execution, steps=STEPS):
    """Calls `step(i)` for i in range(steps): eagerly, or in one tf.function loop."""
    if execution == "eager":
        for i in range(steps):
            step(tf.constant(i))
        return

    def body(i):
        step(i)  # stateful: the loop runs it (automatic control dependencies)
        return i + 1

    # Without autograph, which would convert Keras's optimizer code too.
    loop = tf.function(
        lambda: tf.while_loop(lambda i: i < steps, body, [tf.constant(0)]),
        jit_compile=execution == "jit",
        autograph=False,
    )
    loop()


def apply(optimizer, grads, variables, pairs=None):
    """`optimizer.apply`, under `scaled_learning_rates(optimizer, pairs)` if given."""
    if pairs is None:
        return optimizer.apply(grads, variables)
    with scaled_learning_rates(optimizer, pairs):
        optimizer.apply(grads, variables)


def built(optimizer, variables):
    optimizer.build(variables)
    return optimizer


def values(variables):
    return {k: v.numpy() for k, v in variables.items()}


# The references: INIT trained by an optimizer at its schedule x m.
REFERENCE_MS = (*MULTIPLIERS, 1.0)
_references = {}


def reference_steps(name):
    """`(step, values)`: a step applying one optimizer per m in REFERENCE_MS to its
    own copy of INIT, and a function returning `{m: value}` afterwards."""
    variables = {m: keras.Variable(INIT) for m in REFERENCE_MS}
    optimizers = {m: built(make(name, m), [v]) for m, v in variables.items()}

    def step(i):
        for m, optimizer in optimizers.items():
            optimizer.apply([tf.gather(GRADS, i)], [variables[m]])

    return step, lambda: values(variables)


def references(name):
    """`{m: value}` for m in REFERENCE_MS (graph mode, cached)."""
    if name not in _references:
        step, found = reference_steps(name)
        train(step, "graph")
        _references[name] = found()
    return _references[name]


@pytest.mark.parametrize("execution", EXECUTIONS_GRAPH_FAST)
@pytest.mark.parametrize(
    "name", [param_if_shipped(name) for name in sorted(OPTIMIZERS)]
)
def test_multiplier_is_the_optimizer_at_learning_rate_times_m(name, execution):
    # Every case in graph mode, which also computes the references. Eager
    # and jit (slow per variable, and per compiled op) run one variable with
    # m per column, and one variable per m only where the optimizer couples
    # a variable's entries (one without a multiplier, and in eager, stock).
    graph = execution == "graph"
    scalars = graph or name in COUPLED
    scaled = {m: keras.Variable(INIT) for m in MULTIPLIERS} if scalars else {}
    one = keras.Variable(INIT) if graph else None
    free, entries = keras.Variable(INIT), keras.Variable(INIT)
    variables = [*scaled.values(), *([one] if graph else []), free, entries]
    # Per column; under the coupled optimizers, 0.5 on every entry.
    per_entry = np.full((3, 4), 0.5, "float32") if name in COUPLED else [COLUMNS]
    per_entry = tf.constant(per_entry, tf.float32)
    pairs = [(v, m) for m, v in scaled.items()] + [(entries, lambda: per_entry)]
    pairs += [(one, 1.0)] if graph else []
    ours = built(make(name), variables)
    grads = lambda i: [tf.gather(GRADS, i)] * len(variables)  # noqa: E731
    steps = [lambda i: apply(ours, grads(i), variables, pairs)]
    if execution == "eager":
        stock = keras.Variable(INIT)
        plain = built(make(name), [stock])
        steps.append(lambda i: plain.apply([tf.gather(GRADS, i)], [stock]))
    if graph and name not in _references:
        reference_step, found = reference_steps(name)
        steps.append(reference_step)

    train(lambda i: [step(i) for step in steps], execution)

    if graph and name not in _references:
        _references[name] = found()
    expected = references(name)
    for m, variable in scaled.items():
        assert np.any(expected[m] != INIT), f"{name} at x{m} did not move"
        np.testing.assert_allclose(
            variable.numpy(), expected[m], **TOLERANCE, err_msg=f"x{m}"
        )
    if name in COUPLED:
        np.testing.assert_allclose(entries.numpy(), expected[0.5], **TOLERANCE)
    else:
        for column, m in enumerate(COLUMNS):
            np.testing.assert_allclose(
                entries.numpy()[:, column],
                expected[m][:, column],
                **TOLERANCE,
                err_msg=f"x{m}",
            )
    if graph:  # m = 1 takes the stock path: bit for bit
        np.testing.assert_array_equal(one.numpy(), free.numpy())
    if execution == "eager":
        np.testing.assert_array_equal(free.numpy(), stock.numpy())
    else:
        # TF's graph optimizer may round a learning rate read by several
        # variables and one read by one variable apart (seen: Adagrad, 1 ulp).
        np.testing.assert_allclose(free.numpy(), expected[1.0], **TOLERANCE)


def scaled_and_references(name, multipliers, **settings):
    """Variables under one optimizer with `multipliers`, and each one's reference.

    Returns `(ours, variables, pairs, references)`: `references` maps each
    multiplier to `(optimizer at x m, its variable)`.
    """
    variables = [keras.Variable(INIT) for _ in multipliers]
    ours = built(make(name, **settings), variables)
    pairs = list(zip(variables, multipliers))
    refs = {}
    for m in multipliers:
        variable = keras.Variable(INIT)
        refs[m] = (built(make(name, m, **settings), [variable]), variable)
    return ours, variables, pairs, refs


SETTINGS = {
    "ema": dict(use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=3),
    "accumulation": dict(gradient_accumulation_steps=2),
}


# AdamW in every mode, SGD with Nesterov momentum in graph mode.
CASES = [("AdamW", e) for e in EXECUTIONS] + [("SGD_nesterov", "graph")]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("name, execution", CASES)
def test_multipliers_compose_with_ema_and_gradient_accumulation(
    name, setting, execution
):
    ours, variables, pairs, refs = scaled_and_references(
        name, (0.5, 3.0), **SETTINGS[setting]
    )

    def step(i):
        apply(ours, [tf.gather(GRADS, i)] * len(variables), variables, pairs)
        for optimizer, variable in refs.values():
            optimizer.apply([tf.gather(GRADS, i)], [variable])

    train(step, execution)
    ours.finalize_variable_values(variables)  # the EMA averages, with EMA
    for (_m, (optimizer, variable)), mine in zip(refs.items(), variables):
        optimizer.finalize_variable_values([variable])
        assert np.any(variable.numpy() != INIT)
        np.testing.assert_allclose(mine.numpy(), variable.numpy(), **TOLERANCE)


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_multipliers_reach_the_optimizer_inside_a_loss_scale_optimizer(execution):
    variables = [keras.Variable(INIT) for _ in range(2)]
    ours = built(keras.optimizers.LossScaleOptimizer(make("AdamW")), variables)
    per_column = tf.constant([[0.5, 3.0, 3.0, 0.5]])
    pairs = [(variables[0], 0.5), (variables[1], lambda: per_column)]
    reference = {m: keras.Variable(INIT) for m in (0.5, 3.0)}
    plain = {m: built(make("AdamW", m), [v]) for m, v in reference.items()}
    skipped = 7  # a step whose gradient is not finite: skipped by all

    def step(i):
        finite = tf.not_equal(i, skipped)
        grad = tf.where(finite, tf.gather(GRADS, i), np.inf) * ours.dynamic_scale
        apply(ours, [grad, grad], variables, pairs)  # as after scale_loss
        for m, optimizer in plain.items():
            keras.ops.cond(
                finite,
                lambda o=optimizer, v=reference[m]: o.apply([tf.gather(GRADS, i)], [v]),
                lambda: None,
            )

    train(step, execution)
    assert float(ours.dynamic_scale) == 2.0**14  # halved once, at the skipped step
    np.testing.assert_allclose(
        variables[0].numpy(), reference[0.5].numpy(), **TOLERANCE
    )
    for column, m in enumerate([0.5, 3.0, 3.0, 0.5]):
        np.testing.assert_allclose(
            variables[1].numpy()[:, column],
            reference[m].numpy()[:, column],
            **TOLERANCE,
        )


needs_multi_optimizer = pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason=f"Keras {keras.__version__} has no keras.optimizers.MultiOptimizer (3.15+)",
)


@needs_multi_optimizer
@pytest.mark.parametrize(
    "loss_scaled, execution",
    [(False, e) for e in EXECUTIONS] + [(True, "graph")],
    ids=[f"plain-{e}" for e in EXECUTIONS] + ["loss_scaled-graph"],
)
def test_multipliers_scale_each_sub_optimizer_of_a_multi_optimizer(
    loss_scaled, execution
):
    names = ("adam_scaled", "adam_stock", "sgd_scaled", "sgd_stock")
    variables = [keras.Variable(INIT, name=n) for n in names]
    optimizer_map = keras.optimizers.OptimizerMap(
        make("SGD_nesterov"), {"adam_.*": make("AdamW")}
    )
    ours = keras.optimizers.MultiOptimizer(optimizer_map)
    if loss_scaled:
        ours = keras.optimizers.LossScaleOptimizer(ours)
    built(ours, variables)
    pairs = [(variables[0], 0.5), (variables[2], 3.0)]
    reference = {
        n: (built(make(kind, m), [v]), v)
        for n, kind, m in [
            ("adam_scaled", "AdamW", 0.5),
            ("adam_stock", "AdamW", None),
            ("sgd_scaled", "SGD_nesterov", 3.0),
            ("sgd_stock", "SGD_nesterov", None),
        ]
        for v in [keras.Variable(INIT)]
    }

    def step(i):
        grad = tf.gather(GRADS, i)
        grad = grad * ours.dynamic_scale if loss_scaled else grad
        apply(ours, [grad] * len(variables), variables, pairs)
        for optimizer, variable in reference.values():
            optimizer.apply([tf.gather(GRADS, i)], [variable])

    train(step, execution)
    for name, variable in zip(names, variables):
        expected = reference[name][1].numpy()
        assert np.any(expected != INIT)
        np.testing.assert_allclose(
            variable.numpy(), expected, **TOLERANCE, err_msg=name
        )


# Rows of a (6, 3) embedding table: a sparse gradient touches rows 0, 2 (twice) and 5.
TABLE = RNG.normal(size=(6, 3)).astype("float32")
ROWS = [0.1, 0.5, 3.0, 1.0, 0.1, 0.5]
INDICES = tf.constant([0, 2, 2, 5])
SPARSE = tf.constant(RNG.normal(size=(STEPS, 4, 3)).astype("float32"))


# Every optimizer in graph mode; in eager and jit Adagrad, whose sparse path
# (scatter-add, IndexedSlices divided by a dense tensor) is the longest.
@pytest.mark.parametrize(
    "name, execution",
    [(n, "graph") for n in ("SGD", "Adagrad", "AdamW")]
    + [("Adagrad", "eager"), ("Adagrad", "jit")],
)
def test_multipliers_apply_to_sparse_gradients(name, execution):
    scalar, rows = keras.Variable(TABLE), keras.Variable(TABLE)
    ours = built(make(name), [scalar, rows])
    pairs = [(scalar, 0.5), (rows, lambda: tf.constant(ROWS)[:, None])]
    reference = {m: keras.Variable(TABLE) for m in (0.1, 0.5, 3.0, 1.0)}
    plain = {m: built(make(name, m), [v]) for m, v in reference.items()}

    def step(i):
        grad = tf.IndexedSlices(tf.gather(SPARSE, i), INDICES, tf.constant([6, 3]))
        apply(ours, [grad, grad], [scalar, rows], pairs)
        for m, optimizer in plain.items():
            optimizer.apply([grad], [reference[m]])

    train(step, execution)
    np.testing.assert_allclose(scalar.numpy(), reference[0.5].numpy(), **TOLERANCE)
    for row, m in enumerate(ROWS):
        np.testing.assert_allclose(
            rows.numpy()[row],
            reference[m].numpy()[row],
            **TOLERANCE,
            err_msg=f"row {row}",
        )


def unfreezing(step):
    """Gradual unfreezing: m = 0, then 0.1 from step 5, then 1 from step 12."""
    step = tf.cast(step, tf.float32)
    return tf.where(step < 5, 0.0, tf.where(step < 12, 0.1, 1.0))


class Unfreezing(ScaledDecay):
    def __call__(self, step):
        return self.decay(step) * unfreezing(step)


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_a_multiplier_read_in_the_step_follows_a_schedule_without_a_retrace(execution):
    variable, expected = keras.Variable(INIT), keras.Variable(INIT)
    ours = built(make("AdamW"), [variable])
    reference = built(make("AdamW", schedule=Unfreezing), [expected])
    # The mask a schedule selects, as a training step would hold it.
    current = tf.Variable(0.0, trainable=False)

    def step(i):
        current.assign(unfreezing(ours.iterations))
        apply(ours, [tf.gather(GRADS, i)], [variable], [(variable, lambda: current)])
        reference.apply([tf.gather(GRADS, i)], [expected])

    if execution != "eager":
        step = tf.function(step, jit_compile=execution == "jit")
    for i in range(STEPS):
        step(tf.constant(i))
    if execution != "eager":
        assert step.experimental_get_tracing_count() == 1
    np.testing.assert_allclose(variable.numpy(), expected.numpy(), **TOLERANCE)


def test_zero_takes_no_step_and_ftrl_keeps_finite_state():
    """m = 0 is a frozen entry: no step (Ftrl, which divides by its learning
    rate, runs it at m = 1; the training step puts such entries back)."""
    zeros = tf.constant([[0.0, 0.5, 1.0, 3.0]])
    adamw, ftrl = keras.Variable(INIT), keras.Variable(INIT)
    ours = {"AdamW": built(make("AdamW"), [adamw]), "Ftrl": built(make("Ftrl"), [ftrl])}
    stock_ftrl = keras.Variable(INIT)
    plain = built(make("Ftrl"), [stock_ftrl])

    def step(i):
        apply(ours["AdamW"], [tf.gather(GRADS, i)], [adamw], [(adamw, zeros)])
        apply(ours["Ftrl"], [tf.gather(GRADS, i)], [ftrl], [(ftrl, zeros)])
        plain.apply([tf.gather(GRADS, i)], [stock_ftrl])

    train(step, "graph")
    np.testing.assert_array_equal(adamw.numpy()[:, 0], INIT[:, 0])
    assert np.all(adamw.numpy()[:, 1:] != INIT[:, 1:])
    for state in ours["Ftrl"].variables:
        assert np.all(np.isfinite(keras.ops.convert_to_numpy(state))), state.path
    np.testing.assert_allclose(
        ftrl.numpy()[:, 0], stock_ftrl.numpy()[:, 0], **TOLERANCE
    )


class PlainDescent(keras.optimizers.Optimizer):
    """A user's optimizer with its own `update_step`: maskfit scales its steps."""

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = keras.ops.cast(learning_rate, variable.dtype)
        self.assign_sub(variable, keras.ops.multiply(gradient, learning_rate))


def plain_descent(m=None):
    return PlainDescent(learning_rate=ScaledDecay(0.1, m), weight_decay=0.1)


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_an_optimizer_with_its_own_update_step_gets_its_steps_scaled(execution):
    variable, entries = keras.Variable(INIT), keras.Variable(INIT)
    ours = built(plain_descent(), [variable, entries])
    assert optimizer_rates.multiplier_mode(ours) == optimizer_rates.STEP
    per_entry = tf.constant([[0.0, 0.5, 1.0, 3.0]])
    pairs = [(variable, 0.5), (entries, lambda: per_entry)]
    reference = {m: keras.Variable(INIT) for m in (0.5, 1.0, 3.0)}
    plain = {m: built(plain_descent(m), [v]) for m, v in reference.items()}

    def step(i):
        apply(ours, [tf.gather(GRADS, i)] * 2, [variable, entries], pairs)
        for m, optimizer in plain.items():
            optimizer.apply([tf.gather(GRADS, i)], [reference[m]])

    train(step, execution)
    np.testing.assert_allclose(variable.numpy(), reference[0.5].numpy(), **TOLERANCE)
    np.testing.assert_array_equal(entries.numpy()[:, 0], INIT[:, 0])
    for column, m in ((1, 0.5), (2, 1.0), (3, 3.0)):
        np.testing.assert_allclose(
            entries.numpy()[:, column], reference[m].numpy()[:, column], **TOLERANCE
        )


def shipped_optimizers():
    return [
        cls
        for name, cls in sorted(vars(keras.optimizers).items())
        if inspect.isclass(cls)
        and issubclass(cls, keras.optimizers.Optimizer)
        and name not in ("Optimizer", "LossScaleOptimizer", "MultiOptimizer")
    ]


def test_every_keras_optimizer_is_classified_and_takes_the_learning_rate_times_m():
    for cls in shipped_optimizers():
        assert cls.__name__ in optimizer_rates.KERAS_OPTIMIZERS, cls.__name__
        assert optimizer_rates.multiplier_mode(cls()) == optimizer_rates.LEARNING_RATE


def test_user_optimizer_classes_get_what_they_declare():
    class QuietAdam(keras.optimizers.Adam):  # Adam's own update_step
        pass

    class DeclaredDescent(PlainDescent):
        maskfit_multiplier_mode = "learning_rate"

    class OwnDecay(keras.optimizers.SGD):
        def _apply_weight_decay(self, variables):
            pass

    class Misdeclared(keras.optimizers.SGD):
        maskfit_multiplier_mode = "fast"

    mode = optimizer_rates.multiplier_mode
    assert mode(QuietAdam()) == optimizer_rates.LEARNING_RATE
    assert mode(plain_descent()) == optimizer_rates.STEP
    assert mode(DeclaredDescent(learning_rate=0.1)) == optimizer_rates.LEARNING_RATE
    variable = keras.Variable(INIT)
    with pytest.raises(TypeError, match="OwnDecay overrides the weight decay"):
        with scaled_learning_rates(built(OwnDecay(), [variable]), [(variable, 0.5)]):
            pass
    with pytest.raises(TypeError, match="must be 'learning_rate' or 'step'.*'fast'"):
        mode(Misdeclared())


def test_nothing_stays_on_the_optimizers_even_after_an_error():
    variables = [keras.Variable(INIT) for _ in range(2)]
    ours = built(keras.optimizers.LossScaleOptimizer(make("AdamW")), variables)
    within = [ours, ours.inner_optimizer]
    attributes = [dict(vars(o)) for o in within]
    with pytest.raises(ZeroDivisionError):
        with scaled_learning_rates(ours, [(variables[0], 0.5)]):
            assert "update_step" in vars(ours.inner_optimizer)
            raise ZeroDivisionError("inside the context")
    assert [dict(vars(o)) for o in within] == attributes
    stock = keras.Variable(INIT)
    plain = built(make("AdamW"), [stock])
    ours.apply([GRADS[0] * ours.dynamic_scale] * 2, variables)
    plain.apply([GRADS[0]], [stock])
    np.testing.assert_array_equal(variables[0].numpy(), stock.numpy())


def test_bad_multipliers_are_refused_before_anything_moves():
    variable = keras.Variable(INIT, name="head_kernel")
    optimizer = built(make("AdamW"), [variable])
    with pytest.raises(ValueError, match=r"'head_kernel' has shape \(5,\).*\(3, 4\)"):
        with scaled_learning_rates(optimizer, [(variable, np.ones(5))]):
            optimizer.apply([GRADS[0]], [variable])
    np.testing.assert_array_equal(variable.numpy(), INIT)
    with scaled_learning_rates(optimizer, [(variable, 0.5)]):
        with pytest.raises(RuntimeError, match="already active"):
            with scaled_learning_rates(optimizer, [(variable, 0.5)]):
                pass


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    multiplier=st.lists(st.integers(1, 3), min_size=0, max_size=4),
)
def test_a_multiplier_is_accepted_iff_it_broadcasts_to_its_variable(shape, multiplier):
    variable = keras.Variable(np.zeros(shape, "float32"))
    optimizer = keras.optimizers.SGD()
    try:
        fits = np.broadcast_shapes(tuple(multiplier), tuple(shape)) == tuple(shape)
    except ValueError:
        fits = False
    pairs = [(variable, np.ones(multiplier, "float32"))]
    if fits:
        with scaled_learning_rates(optimizer, pairs):
            pass
    else:
        with pytest.raises(ValueError, match="does not broadcast"):
            with scaled_learning_rates(optimizer, pairs):
                pass


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-1e3, 1e3, width=32),
            st.floats(-1e3, 1e3, width=32),
            st.sampled_from([0.0, 0.25, 1.0, 3.0]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_scale_step_is_exact_at_zero_and_one(entries):
    old, updated, m = (np.array(x, "float32") for x in zip(*entries))
    poisoned = np.where(m == 0, np.nan, updated).astype("float32")
    result = learning_rates.scale_step(old, tf.constant(poisoned), m).numpy()
    np.testing.assert_array_equal(result[m == 0], old[m == 0])
    np.testing.assert_array_equal(result[m == 1], updated[m == 1])
    between = (m != 0) & (m != 1)
    np.testing.assert_allclose(
        result[between], (old + m * (updated - old))[between], rtol=1e-6, atol=1e-3
    )


def test_the_docstring_examples_run():
    import doctest

    for module in (learning_rates, optimizer_rates):
        results = doctest.testmod(module, extraglobs=dict(keras=keras, tf=tf))
        assert results.failed == 0
    assert doctest.testmod(
        learning_rates, extraglobs=dict(keras=keras, tf=tf)
    ).attempted


@pytest.fixture(scope="module")
def mirrored_runs(tmp_path_factory):
    """Runs learning_rate_runs.py (MirroredStrategy over 2 logical CPUs) once."""
    from tests.helpers import checkout, learning_rate_runs

    out = tmp_path_factory.mktemp("mirrored_rates")
    done = checkout.run(learning_rate_runs.__file__, out, TF_CPP_MIN_LOG_LEVEL="2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("run", ["adamw", "adamw_eager", "loss_scaled_sgd"])
def test_mirrored_replicas_step_at_the_learning_rate_times_m(mirrored_runs, run):
    result = np.load(mirrored_runs / f"{run}.npz")
    for name in ("scaled", "columns", "free"):
        replicas = [result[f"replica{k}/{name}"] for k in range(2)]
        np.testing.assert_array_equal(replicas[0], replicas[1], err_msg=name)
        np.testing.assert_allclose(
            replicas[0], result[f"reference/{name}"], **TOLERANCE, err_msg=name
        )
