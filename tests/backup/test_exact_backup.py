"""ExactBackupAndRestore in one process: arguments, input checks, backup files,
and runs that an exception interrupts (test_exact_resume.py kills processes)."""

import inspect
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import maskfit
from maskfit.backup import files, input_order, state

X = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
Y = np.random.default_rng(1).normal(size=(40, 2)).astype("float32")


def build(head_bias=True, optimizer_kwargs=None, **compile_kwargs):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(6, activation="tanh", name="hidden")(inputs)
    dropped = keras.layers.Dropout(0.2)(hidden)
    head = keras.layers.Dense(2, name="head", use_bias=head_bias)
    maskfit.set_mask(head, maskfit.OutputMask([1, 0]))
    model = maskfit.MaskedModel(inputs, head(dropped))
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, 3, 0.7)
    model.compile(
        optimizer=keras.optimizers.AdamW(
            schedule, weight_decay=0.05, **(optimizer_kwargs or {})
        ),
        loss="mse",
        metrics=["mae"],
        **compile_kwargs,
    )
    return model


class Interrupt(keras.callbacks.Callback):
    """Raises after the `step`-th batch of a fit that skips none."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise RuntimeError("interrupted on purpose")


def state_of(model):
    return [v.numpy() for v in list(model.weights) + list(model.optimizer.variables)]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def fit(model, callbacks=(), **kwargs):
    kwargs = dict(dict(x=X, y=Y, batch_size=4, epochs=3, verbose=0), **kwargs)
    return model.fit(callbacks=list(callbacks), **kwargs)


class Steps(keras.callbacks.Callback):
    """Records `(batch, optimizer step)` after each batch; stops after `stop` batches."""

    def __init__(self, stop=None):
        super().__init__()
        self.seen, self.stop = [], stop

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((batch, int(self.model.optimizer.iterations.numpy())))
        if self.stop is not None and len(self.seen) >= self.stop:
            self.model.stop_training = True


def interrupted_then_resumed(
    tmp_path, stop, build_kwargs=None, save_freq=3, callbacks=(), **fit_kwargs
):
    """Runs fit until `stop` raises, then a new model and callback resume; returns both."""
    folder = str(tmp_path / "backup")
    model = build(**(build_kwargs or {}))
    with pytest.raises(RuntimeError, match="on purpose"):
        backup = maskfit.ExactBackupAndRestore(folder, save_freq=save_freq)
        fit(model, [backup, Interrupt(stop)], **fit_kwargs)
    model = build(**(build_kwargs or {}))
    backup = maskfit.ExactBackupAndRestore(folder, save_freq=save_freq)
    history = fit(model, [backup] + list(callbacks), **fit_kwargs)
    return model, history


# --- arguments


def test_same_arguments_and_defaults_as_keras():
    ours = inspect.signature(maskfit.ExactBackupAndRestore).parameters
    stock = inspect.signature(keras.callbacks.BackupAndRestore).parameters
    assert [(p.name, p.default) for p in ours.values()] == [
        (p.name, p.default) for p in stock.values()
    ]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(backup_dir=""), "backup_dir"),
        (dict(backup_dir=None), "backup_dir"),
        (dict(backup_dir="gs://bucket/run"), "local file system"),
        (dict(backup_dir="b", save_freq=0), "save_freq=0"),
        (dict(backup_dir="b", save_freq=True), "save_freq=True"),
        (dict(backup_dir="b", save_freq=2.5), "save_freq=2.5"),
        (dict(backup_dir="b", save_freq="batch"), "save_freq='batch'"),
        (dict(backup_dir="b", double_checkpoint="yes"), "double_checkpoint='yes'"),
        (dict(backup_dir="b", delete_checkpoint=None), "delete_checkpoint=None"),
    ],
)
def test_bad_arguments_raise_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        maskfit.ExactBackupAndRestore(**kwargs)


# --- resuming inside an epoch


def _modes():
    """README's command runs one mode of each backend; .ci/run's slow tests the rest
    (test_exact_resume.py kills and resumes processes in every mode, JAX's too)."""
    slow = pytest.mark.slow
    if keras.backend.backend() == "jax":
        return ["jit", pytest.param("eager", marks=slow)]
    return ["graph", pytest.param("eager", marks=slow), pytest.param("jit", marks=slow)]


@pytest.mark.backends("tensorflow", "jax")
@pytest.mark.parametrize("mode", _modes(), indirect=True)
def test_resumes_inside_an_epoch_bit_identical(tmp_path, mode):
    reference = build(**mode)
    expected_history = fit(reference)
    # Backed up after step 15 (epoch 1, step 5 of 10); interrupted after 17.
    steps = Steps()
    model, history = interrupted_then_resumed(
        tmp_path, stop=17, build_kwargs=mode, callbacks=[steps]
    )
    assert_same(state_of(model), state_of(reference))
    # Epoch 1's batches 0-4 are read but not trained on (the optimizer stays
    # at step 15); training goes on with batch 5.
    assert steps.seen[:7] == [(b, 15) for b in range(5)] + [(5, 16), (6, 17)]
    assert steps.seen[-1] == (9, 30)
    # Epochs 1 and 2 ran again; the metrics of epoch 1 continued from step 15.
    assert len(history.history["loss"]) == 2
    for key in ("loss", "mae"):
        np.testing.assert_allclose(
            history.history[key], expected_history.history[key][1:], rtol=1e-6
        )
    assert not os.path.exists(tmp_path / "backup")  # delete_checkpoint=True
    assert model._initial_epoch is None  # a later fit starts at epoch 0


@pytest.mark.slow
def test_resumes_in_the_middle_of_gradient_accumulation_with_ema(tmp_path):
    # Backed up after batch 15: half of an accumulation of 2 (the optimizer
    # counts 7 updates), between two EMA overwrites.
    optimizer_kwargs = dict(
        use_ema=True, ema_overwrite_frequency=4, gradient_accumulation_steps=2
    )
    reference = build(optimizer_kwargs=optimizer_kwargs)
    fit(reference)
    model, _ = interrupted_then_resumed(
        tmp_path, stop=17, build_kwargs=dict(optimizer_kwargs=optimizer_kwargs)
    )
    assert_same(state_of(model), state_of(reference))


@pytest.mark.slow
@pytest.mark.parametrize(
    "input_kind, stop",
    [("repeated", 7), ("finite", 7), ("unknown_size", 25)],
)
def test_keras_epoch_bookkeeping_is_resumed_too(tmp_path, input_kind, stop):
    # With steps_per_epoch, Keras reads one iterator across epochs (until it
    # runs out): the resumed run skips what earlier epochs read too. An input
    # of unknown size ends its epochs where Keras learned they end (Keras
    # calls the train function once more on an exhausted input, and that call
    # still moves the weights: the resumed run must make the same calls).
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)
    kwargs = dict(x=dataset, y=None, batch_size=None, shuffle=False, epochs=3)
    if input_kind == "repeated":
        kwargs.update(x=dataset.repeat(), steps_per_epoch=4)
    elif input_kind == "finite":
        kwargs.update(steps_per_epoch=4)
    else:
        kwargs.update(x=dataset.filter(lambda x, y: True))
    reference = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras: "ran out of data"
        fit(reference, **kwargs)
        model, _ = interrupted_then_resumed(tmp_path, stop=stop, **kwargs)
    assert_same(state_of(model), state_of(reference))


def test_epoch_backups_resume_a_kept_iterator_where_it_was(tmp_path):
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(4).repeat()
    kwargs = dict(x=dataset, y=None, batch_size=None, shuffle=False)
    kwargs.update(steps_per_epoch=3, epochs=4)
    reference = build()
    fit(reference, **kwargs)
    model, history = interrupted_then_resumed(
        tmp_path, stop=8, save_freq="epoch", **kwargs
    )
    assert len(history.history["loss"]) == 2  # epochs 2 and 3
    assert_same(state_of(model), state_of(reference))


def test_double_checkpoint_falls_back_to_the_previous_backup(tmp_path):
    folder = str(tmp_path / "backup")
    with pytest.raises(RuntimeError):
        backup = maskfit.ExactBackupAndRestore(folder, 3, double_checkpoint=True)
        fit(build(), [backup, Interrupt(17)])
    newest, previous = files.complete(folder)
    with open(os.path.join(newest, state.WEIGHTS), "r+b") as f:
        f.truncate(100)  # a damaged disk
    damaged = "cannot read its backup: .*" + os.path.basename(newest)
    with pytest.raises(OSError, match=damaged):
        fit(build(), [maskfit.ExactBackupAndRestore(folder, 3)])
    steps = Steps(stop=1)
    fit(
        build(),
        [maskfit.ExactBackupAndRestore(folder, 3, double_checkpoint=True), steps],
    )
    assert steps.seen == [(0, 12)]  # skipping into epoch 1 from step 12, not 15


def test_a_backup_made_with_other_steps_per_execution_is_refused(tmp_path):
    folder = str(tmp_path / "backup")
    with pytest.raises(RuntimeError):
        fit(build(), [maskfit.ExactBackupAndRestore(folder, 3), Interrupt(5)])
    model = build(steps_per_execution=2)
    before = [w.numpy() for w in model.weights]
    with pytest.raises(
        ValueError, match="steps_per_execution=2, which does not divide"
    ):
        fit(model, [maskfit.ExactBackupAndRestore(folder, 3)])
    assert_same([w.numpy() for w in model.weights], before)


def test_a_backup_of_another_model_fails_and_changes_nothing(tmp_path):
    folder = str(tmp_path / "backup")
    with pytest.raises(RuntimeError):
        fit(build(), [maskfit.ExactBackupAndRestore(folder, 3), Interrupt(5)])
    # Keras loads the hidden layer, then fails on the head: nothing changes.
    model = build(head_bias=False)
    before = [w.numpy() for w in model.weights]
    with pytest.raises(ValueError):
        fit(model, [maskfit.ExactBackupAndRestore(folder, 3)])
    assert_same([w.numpy() for w in model.weights], before)


@pytest.mark.slow
def test_train_on_batch_after_an_interrupted_fit_trains(tmp_path):
    model = build()
    with pytest.raises(RuntimeError):
        fit(
            model, [maskfit.ExactBackupAndRestore(str(tmp_path / "b"), 3), Interrupt(5)]
        )
    # The wrapper that fit left on the model passes calls it did not announce.
    model.train_on_batch(X[:4], Y[:4])
    assert int(model.optimizer.iterations.numpy()) == 6


def test_a_keras_backup_is_refused(tmp_path):
    folder = tmp_path / "backup"
    model = build()
    with pytest.raises(RuntimeError):
        fit(model, [keras.callbacks.BackupAndRestore(str(folder)), Interrupt(12)])
    with pytest.raises(ValueError, match="keras.callbacks.BackupAndRestore"):
        fit(build(), [maskfit.ExactBackupAndRestore(str(folder))])


# --- inputs it cannot skip into exactly: one warning when fit starts


class Reshuffled(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return X[index * 4 : index * 4 + 4], Y[index * 4 : index * 4 + 4]

    def on_epoch_end(self):
        pass


def _warnings_of(tmp_path, unseeded=False, **kwargs):
    """The warnings of ExactBackupAndRestore in a fit of one batch."""
    model = build()
    if unseeded:
        tf.random.set_seed(None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backup = maskfit.ExactBackupAndRestore(str(tmp_path / "b"), 3)
        fit(model, [backup, Steps(stop=1)], epochs=1, **kwargs)
    return [str(w.message) for w in caught if "ExactBackupAndRestore" in str(w.message)]


@pytest.mark.parametrize(
    "make_input, match",
    [
        (
            lambda: dict(
                x=tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(40).batch(4),
                y=None,
                batch_size=None,
                shuffle=False,
            ),
            "reshuffle_each_iteration=False",
        ),
        (
            lambda: dict(x=Reshuffled(), y=None, batch_size=None),
            "Reshuffled.on_epoch_end",
        ),
        (
            lambda: dict(
                x=(b for b in [(X[:4], Y[:4])] * 20),
                y=None,
                batch_size=None,
                steps_per_epoch=3,
            ),
            "Python generator",
        ),
        pytest.param(
            lambda: dict(shuffle=True, unseeded=True),
            "no global seed",
            # JAX's trainer shuffles arrays from NumPy's global state (below).
            marks=pytest.mark.backends("tensorflow"),
        ),
    ],
)
def test_an_input_it_cannot_skip_exactly_warns_once(tmp_path, make_input, match):
    found = _warnings_of(tmp_path, **make_input())
    assert len(found) == 1, found
    assert match in found[0]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(shuffle=True),  # arrays, with the suite's global seed
        dict(shuffle=False),
        dict(
            x=tf.data.Dataset.from_tensor_slices((X, Y))
            .shuffle(40, seed=3, reshuffle_each_iteration=False)
            .batch(4),
            y=None,
            batch_size=None,
            shuffle=False,
        ),
    ],
)
def test_inputs_it_skips_exactly_do_not_warn(tmp_path, kwargs):
    assert _warnings_of(tmp_path, **kwargs) == []


@pytest.mark.slow
@pytest.mark.backends("jax")
def test_shuffled_arrays_need_no_global_seed_on_jax(tmp_path):
    """Keras's JAX trainer draws each epoch's permutation from NumPy's global
    random state, which the backup holds as it was when the epoch began: a
    process that starts from another state resumes the same batches."""
    reference = build()
    np.random.seed(123)
    fit(reference, shuffle=True)
    folder = str(tmp_path / "backup")
    model = build()
    np.random.seed(123)
    with pytest.raises(RuntimeError, match="on purpose"):
        fit(model, [maskfit.ExactBackupAndRestore(folder, 3), Interrupt(17)])
    model = build()
    np.random.seed(999)  # what a new process would draw from
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [maskfit.ExactBackupAndRestore(folder, 3)], shuffle=True)
    assert not [w for w in caught if "ExactBackupAndRestore" in str(w.message)]
    assert_same(state_of(model), state_of(reference))


def _with_generator(dataset):
    generator = tf.random.Generator.from_seed(1)
    return dataset.map(lambda x: x + generator.uniform((), 0, 3, tf.int64))


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda d: d.map(lambda x: x + 1, num_parallel_calls=2, deterministic=False),
            "deterministic=False",
        ),
        (lambda d: _with_generator(d), "tf.random.Generator"),
        (
            lambda d: d.map(lambda x: tf.py_function(lambda v: v, [x], tf.int64)),
            "Python code",
        ),
        (lambda d: d.shuffle(8, seed=None, reshuffle_each_iteration=False), "no seed"),
        (lambda d: tf.data.Dataset.sample_from_datasets([d, d]), "no seed"),
        (
            lambda d: d.map(lambda x: x + tf.random.uniform((), 0, 3, tf.int64)),
            "RandomUniformInt) has no seed",
        ),
    ],
)
def test_dataset_hazards_name_what_changes_the_order(make, match):
    tf.random.set_seed(None)
    found = input_order.dataset_hazards(make(tf.data.Dataset.range(8)))
    assert any(match in reason for reason in found), found


def test_seeded_datasets_have_no_hazards():
    base = tf.data.Dataset.range(8)
    for dataset in (
        base.shuffle(8, seed=1, reshuffle_each_iteration=False),
        base.map(lambda x: x + tf.random.uniform((), 0, 3, tf.int64, seed=2)),
        base.map(lambda x: x + 1, num_parallel_calls=2).batch(2).prefetch(1),
    ):
        assert input_order.dataset_hazards(dataset) == []


# --- backup files


def test_a_failed_write_leaves_the_backups_as_they_were(tmp_path):
    folder = str(tmp_path)

    def fill(text):
        def write(path):
            with open(os.path.join(path, "f.txt"), "w") as f:
                f.write(text)

        return write

    first = files.write(folder, fill("1"))
    with pytest.raises(ZeroDivisionError):
        files.write(folder, lambda path: (fill("2")(path), 1 / 0))
    assert files.complete(folder) == [first]
    second = files.write(folder, fill("3"), keep=2)
    third = files.write(folder, fill("4"), keep=2)
    assert files.complete(folder) == [third, second]
    assert not [n for n in os.listdir(folder) if n.startswith(".partial-")]
    with open(os.path.join(third, "f.txt")) as f:
        assert f.read() == "4"
