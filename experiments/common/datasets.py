"""Data sets that need no download: scikit-learn's digits and MNIST-1D, split once.

Every experiment and benchmark that trains on small offline data loads it
here, so that the same name means the same split everywhere:

- `digits`: scikit-learn's bundled 8x8 digits (1,797 images, 10 classes),
  scaled to [0, 1] and flattened to 64 features; a stratified split.
- `mnist1d`: MNIST-1D (Greydanus, 2024), generated offline by the PyPI
  package `mnist1d` (`make_dataset(get_dataset_args())`, never its
  downloading `get_dataset`): 4,000 training and 1,000 test sequences of
  length 40, 10 classes, standardised. Its reference accuracies are 68% for
  an MLP and 94% for a CNN, so sparsity and forgetting effects show where
  digits saturates.

Both return a `Split` of float32 features and int32 labels; the validation
part is carved out of the training part (stratified, by `SPLIT_SEED`).
"""

import dataclasses
import functools

import numpy as np

__all__ = ["SPLIT_SEED", "Split", "digits", "load", "mnist1d", "NAMES"]

# The split of each data set is the same for every run and seed.
SPLIT_SEED = 0
NAMES = ("digits", "mnist1d")


@dataclasses.dataclass(frozen=True)
class Split:
    """A data set split into train, validation and test arrays.

    Attributes:
      x_train, y_train, x_val, y_val, x_test, y_test: features (float32,
        `(n, features)`) and labels (int32, `(n,)`); the validation arrays
        are empty when no validation fraction was asked for.
      classes: the number of classes.
      name: the data set's name.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    name: str

    @property
    def features(self):
        """The number of features per example."""
        return int(self.x_train.shape[1])


def _need(module, extra):
    raise ImportError(
        f"This run needs the PyPI package `{module}`; install it with"
        f' `pip install ".[{extra}]"` (or `pip install {module}`).'
    )


def _split(x, y, test, validation_fraction, name, test_fraction=None):
    """Carves stratified validation (and, with `test_fraction`, test) parts out of `x`."""
    try:
        from sklearn import model_selection
    except ImportError:
        _need("scikit-learn", "experiments")
    if test is None:
        x, x_test, y, y_test = model_selection.train_test_split(
            x, y, test_size=test_fraction, stratify=y, random_state=SPLIT_SEED
        )
    else:
        x_test, y_test = test
    if validation_fraction:
        x, x_val, y, y_val = model_selection.train_test_split(
            x, y, test_size=validation_fraction, stratify=y, random_state=SPLIT_SEED
        )
    else:
        x_val, y_val = x[:0], y[:0]
    arrays = [a.astype(np.float32) for a in (x, x_val, x_test)]
    labels = [b.astype(np.int32) for b in (y, y_val, y_test)]
    return Split(
        arrays[0],
        labels[0],
        arrays[1],
        labels[1],
        arrays[2],
        labels[2],
        classes=int(np.max(y)) + 1,
        name=name,
    )


def digits(test_fraction=0.2, validation_fraction=0.0):
    """scikit-learn's digits, scaled to [0, 1], split (stratified) by `SPLIT_SEED`.

    Args:
      test_fraction: the share of all examples held out for testing.
      validation_fraction: the share of the remaining training examples held
        out for validation (0 for none).

    Returns:
      A `Split` with 64 features and 10 classes.

    Example:

    >>> data = digits()
    >>> data.features, data.classes, len(data.x_test)
    (64, 10, 360)
    """
    try:
        from sklearn import datasets
    except ImportError:
        _need("scikit-learn", "experiments")
    raw = datasets.load_digits()
    return _split(
        raw.data / 16.0,
        raw.target,
        None,
        validation_fraction,
        "digits",
        test_fraction=test_fraction,
    )


@functools.lru_cache(maxsize=4)
def _mnist1d_arrays(num_samples):
    try:
        from mnist1d import data as mnist1d_data
    except ImportError:
        _need("mnist1d", "experiments")
    args = mnist1d_data.get_dataset_args()
    if num_samples is not None:
        args.num_samples = num_samples
    made = mnist1d_data.make_dataset(args)  # offline; get_dataset downloads
    return made["x"], made["y"], made["x_test"], made["y_test"]


def mnist1d(validation_fraction=0.0, num_samples=None):
    """MNIST-1D generated offline: 4,000 train / 1,000 test sequences of length 40.

    Generating it takes a few seconds; the arrays are cached per process.

    Args:
      validation_fraction: the share of the training examples held out for
        validation (0 for none).
      num_samples: generate this many examples in all instead of the
        package's 5,000 (80% train, 20% test), for quick tests.

    Returns:
      A `Split` with 40 features and 10 classes.
    """
    x, y, x_test, y_test = _mnist1d_arrays(num_samples)
    return _split(x, y, (x_test, y_test), validation_fraction, "mnist1d")


def load(name, **kwargs):
    """`digits(**kwargs)` or `mnist1d(**kwargs)` by name.

    Raises:
      ValueError: for a name not in `NAMES`.
    """
    loaders = {"digits": digits, "mnist1d": mnist1d}
    if name not in loaders:
        raise ValueError(
            f"Received an unknown data set, expected one of {', '.join(NAMES)}."
            f" Received: dataset={name!r}"
        )
    return loaders[name](**kwargs)
