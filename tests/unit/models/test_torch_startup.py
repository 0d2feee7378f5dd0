"""The start-up patches apply to the installed releases: an upgrade of torch or TensorBoard fails here,
until the patches are checked against it (their own pin tests: test_launch, test_decks,
test_model_builders) and the release is added to tasks/core/models/torch_startup.py."""

from tasks.core.models.torch_startup import CHECKED_TENSORBOARD, CHECKED_TORCH, checked, release


def test_the_installed_torch_is_a_release_the_patches_were_checked_against():
    assert checked("torch", CHECKED_TORCH), f"torch {release('torch')} is not in {CHECKED_TORCH}"


def test_the_installed_tensorboard_is_a_release_the_patch_was_checked_against():
    assert checked("tensorboard", CHECKED_TENSORBOARD), (
        f"tensorboard {release('tensorboard')} is not in {CHECKED_TENSORBOARD}"
    )


def test_an_unknown_release_or_package_is_not_checked():
    assert not checked("torch", ("0.1",))
    assert not checked("no-such-package-installed", ("1.0",))
