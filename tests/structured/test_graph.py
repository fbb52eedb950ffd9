"""DependencyGraph: groups, what stays and why (explain), refusals, custom couplings."""

import keras
import numpy as np
import pytest

import maskfit
from maskfit.structured.graph import keras_graph
from tests.helpers import structured_models as models

pruning = maskfit.pruning
L = keras.layers


@pytest.fixture(autouse=True)
def _fresh_keras():
    keras.backend.clear_session(free_memory=False)
    keras.utils.set_random_seed(0)
    yield


def test_keras_private_members_it_reads_exist():
    assert keras_graph.missing_members() == []


def test_residual_adds_join_the_filters_of_every_branch():
    model, _ = models.residual_bn()
    graph = pruning.DependencyGraph(model)

    layers = sorted(tuple(sorted(g.layers)) for g in graph.groups)

    assert layers == [("block_a",), ("block_b", "stem")]
    assert "together with block_b" in graph.explain("stem")


def test_output_units_and_what_is_joined_to_them_stay():
    x = keras.Input((4,))
    h = L.Dense(5, name="hidden")(x)
    out = L.Dense(5, name="head")(h)
    model = keras.Model(x, [L.Add()([h, out]), L.Dense(2, name="other")(h)])
    graph = pruning.DependencyGraph(model)

    assert graph.groups == ()
    text = graph.explain("hidden")
    assert "0 removable, 5 stay" in text and "output 0 of model" in text
    with pytest.raises(ValueError, match="Unit 1 of layer 'head' cannot be removed"):
        pruning.UnitSelection.removing(graph, {"head": [1]})


def test_removing_units_by_hand_checks_them():
    model, _ = models.mlp()
    with pytest.raises(ValueError, match="layer 'hidden' has 8 units, numbered from 0"):
        pruning.UnitSelection.removing(model, {"hidden": [8]})
    with pytest.raises(ValueError, match="would remove every unit of layers"):
        pruning.UnitSelection.removing(model, {"hidden": list(range(8))})
    with pytest.raises(ValueError, match="has no units of a layer 'nope'"):
        pruning.UnitSelection.removing(model, {"nope": [0]})


def test_a_lambda_on_a_pruned_path_keeps_the_units_it_reads():
    x = keras.Input((4,))
    h = L.Dense(6, name="hidden")(x)
    h = L.Lambda(lambda t: t[:, ::-1], name="reverse")(h)
    model = keras.Model(x, L.Dense(2, name="head")(h))
    graph = pruning.DependencyGraph(model)

    assert graph.groups == ()
    text = graph.explain("hidden")
    assert "6 stay" in text and "'reverse'" in text and "Lambda" in text
    assert "refused" in graph.explain("reverse")
    assert pruning.select_units(model, 0.9).removed() == {}


def test_layer_normalization_over_the_units_keeps_them():
    x = keras.Input((3, 4))
    h = L.Dense(6, name="hidden")(x)
    h = L.LayerNormalization(name="ln")(h)
    model = keras.Model(x, L.Dense(2, name="head")(h))
    graph = pruning.DependencyGraph(model)

    assert graph.groups == ()
    assert "normalized together by 'ln'" in graph.explain("hidden")


def test_softmax_activation_fails_the_gradient_check_and_keeps_its_units():
    x = keras.Input((4,))
    h = L.Dense(6, activation="softmax", name="attention_like")(x)
    model = keras.Model(x, L.Dense(2, name="head")(h))
    graph = pruning.DependencyGraph(model)

    assert graph.groups == ()
    assert "gradient check" in graph.explain("attention_like")


def test_subclassed_and_unbuilt_models_are_refused_with_the_reason():
    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = L.Dense(3)

        def call(self, x):
            return self.dense(x)

    net = Net()
    net(np.zeros((1, 2), "float32"))
    for model in (net, keras.Sequential([L.Dense(2)])):
        with pytest.raises(ValueError, match="functional model or a built Sequential"):
            pruning.prune_units(model)
        with pytest.raises(ValueError, match="functional model or a built Sequential"):
            pruning.DependencyGraph(model)


def test_a_subclassed_model_nested_in_a_functional_one_keeps_what_it_reads():
    class Block(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = L.Dense(3)

        def call(self, x):
            return self.dense(x)

    x = keras.Input((4,))
    h = L.Dense(5, name="hidden")(x)
    model = keras.Model(x, L.Dense(2, name="head")(Block(name="block")(h)))
    graph = pruning.DependencyGraph(model)

    assert graph.groups == ()
    assert "declares no unit coupling" in graph.explain("hidden")


def test_a_layer_with_its_own_rule_is_an_error():
    model, _ = models.mlp()
    pruning.prune_low_magnitude([model.get_layer("hidden")])
    with pytest.raises(ValueError, match="has its own mask rule"):
        pruning.prune_units(model)


def test_ignored_layers_keep_their_units_but_read_fewer():
    model, x = models.mlp()
    selection = pruning.select_units(model, 0.5, ignored_layers=["hidden2"])

    assert set(selection.removed()) == {"hidden"}
    small = pruning.shrink(model, selection)
    assert small.get_layer("hidden2").kernel.shape == (4, 6)
    with pytest.raises(ValueError, match="ignored_layers names 'nope'"):
        pruning.select_units(model, 0.5, ignored_layers=["nope"])


def test_bad_arguments_are_one_error_each():
    model, _ = models.mlp()
    with pytest.raises(ValueError, match="round_to must be None or a positive integer"):
        pruning.prune_units(model, round_to=0)
    with pytest.raises(ValueError, match="min_units must be an integer >= 1"):
        pruning.prune_units(model, min_units=0)
    with pytest.raises(TypeError, match="pruning_schedule must be"):
        pruning.prune_units(model, pruning_schedule=0.5)
    with pytest.raises(TypeError, match="importance must be"):
        pruning.prune_units(model, importance=3)
    with pytest.raises(ValueError, match="pruning_ratio must be a number in"):
        pruning.select_units(model, 1.0)
    other, _ = models.mlp()
    with pytest.raises(ValueError, match="selection was made for model"):
        pruning.shrink(model, pruning.select_units(other, 0.5))


class Scale(L.Layer):
    """A learned scale per channel."""

    def build(self, shape):
        self.scale = self.add_weight(shape=(shape[-1],), name="scale")

    def call(self, x):
        return x * self.scale

    def maskfit_unit_coupling(self):
        return pruning.UnitCoupling(passes=True, per_channel={"scale": 0})


class MyDense(L.Layer):
    """A dense layer of its own, declaring its output units and what it reads."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], self.units), name="w")
        self.b = self.add_weight(shape=(self.units,), name="b", initializer="ones")

    def call(self, x):
        return keras.ops.matmul(x, self.w) + self.b

    def get_config(self):
        return {**super().get_config(), "units": self.units}

    def maskfit_output_units(self):
        return maskfit.OutputUnits(
            self.units, {"w": maskfit.units_along(-1), "b": maskfit.units_along(0)}
        )

    def maskfit_unit_coupling(self):
        return pruning.UnitCoupling(reads={"w": 0}, units_config="units")


def test_custom_layers_declare_their_coupling():
    x = keras.Input((4,))
    h = MyDense(6, name="mine")(x)
    h = Scale(name="scale")(h)
    h = L.Dense(5, name="dense")(h)
    h = MyDense(3, name="mine2")(h)
    model = models.functional(x, L.Dense(2, name="head")(h))

    selection = pruning.select_units(model, 0.5)

    assert {k: len(v["units"]) for k, v in selection.removed().items()} == {
        "mine": 3,
        "dense": 3,
        "mine2": 2,
    }
    small = pruning.shrink(model, selection)
    assert small.get_layer("scale").scale.shape == (3,)
    expected = models.masked_outputs(model, selection, models._x((3, 4)))
    np.testing.assert_allclose(
        np.asarray(small(models._x((3, 4)))), expected, rtol=1e-5, atol=1e-6
    )


class Reverse(L.Layer):
    """Reverses its channels, but declares that they pass straight through."""

    def call(self, x):
        return keras.ops.flip(x, axis=-1)  # x[..., ::-1]: torch has no negative step

    def maskfit_unit_coupling(self):
        return pruning.UnitCoupling(passes=True)


class Wrong(MyDense):
    def maskfit_unit_coupling(self):
        return pruning.UnitCoupling(reads={"w": 1}, units_config="units")


# Under both backends: the check must see the computation it checks.
@pytest.mark.backends("tensorflow", "jax", "torch")
def test_a_wrong_declaration_fails_its_gradient_check():
    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(2)(Reverse(name="reverse")(L.Dense(6)(x))))
    with pytest.raises(
        ValueError, match="'reverse'.*output channel 0 depends on input channels"
    ):
        pruning.DependencyGraph(model)
    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(2)(Wrong(4, name="wrong")(L.Dense(4)(x))))
    with pytest.raises(ValueError, match="'wrong'.*still depends on it"):
        pruning.DependencyGraph(model)


def test_register_coupling_for_a_subclass_of_a_keras_layer():
    class Plain(L.Dense):
        pass

    x = keras.Input((4,))
    model = keras.Model(x, L.Dense(2)(Plain(6, name="plain")(x)))
    assert "subclasses keras.layers.Dense" in pruning.DependencyGraph(model).explain(
        "plain"
    )
    # Its output units (checked against its gradients) and its coupling.
    maskfit.register_output_units(Plain, L.Dense)
    pruning.register_coupling(Plain, pruning.coupling_of(L.Dense(1)))
    try:
        assert [g.layers for g in pruning.DependencyGraph(model).groups] == [("plain",)]
    finally:
        pruning.register_coupling(Plain, None)
        maskfit.register_output_units(Plain, None)


def test_the_docstring_examples_run():
    import doctest
    import importlib

    names = (
        "kinds.couplings.base kinds.couplings.lookup structured.scoring.importance"
        " structured.shrinking structured.sizes structured.prune"
        " structured.scoring.choice structured.graph.dependency"
    )
    for name in names.split():
        module = importlib.import_module(f"maskfit.{name}")
        results = doctest.testmod(module)
        assert results.attempted and not results.failed, module.__name__
