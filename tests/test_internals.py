"""Every private Keras member maskfit uses still exists in the installed Keras."""

from maskfit import internals


def test_every_private_member_maskfit_uses_exists():
    missing = internals.missing_members()
    assert not missing, (
        "This Keras/TensorFlow release lacks private members maskfit relies on"
        f" (see maskfit/internals/ for what each is for): {missing}"
    )
