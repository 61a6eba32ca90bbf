"""The modeled GPU peak of a real FLUX.1-dev run (512 px, fp8 explorer): its training-activation
coefficient agrees with what autograd saves on tiny FLUX instances, reward models count only in
the stages that score, and the run fits an 80 GB card."""

from __future__ import annotations

import pytest

from solrl_core.models.memory import REWARD_PARAMETERS, TRAIN_SAVED, flux_dev_run_peak, tiny_flux_train_coefficient


@pytest.mark.parametrize("heads, head_dim, image_tokens, text_tokens", [(4, 32, 64, 32), (6, 64, 96, 32)])
def test_training_activation_coefficient_is_what_autograd_saves(heads, head_dim, image_tokens, text_tokens):
    measured = tiny_flux_train_coefficient(heads, head_dim, image_tokens, text_tokens)
    assert measured <= TRAIN_SAVED <= 1.03 * measured


def test_flux_dev_run_fits_80_gb_with_rewards_resident_only_while_scoring():
    peak = flux_dev_run_peak("fp8")
    assert peak["tokens"] == 1024 + 512 and peak["peak_bytes"] < 80e9
    stages = peak["stages"]
    assert "rewards_fp32" not in stages["explore"]["parts"] and "rewards_fp32" not in stages["update"]["parts"]
    assert stages["score"]["parts"]["rewards_fp32"] == REWARD_PARAMETERS["imagereward"] * 4
    assert stages["evaluate"]["parts"]["rewards_fp32"] == sum(REWARD_PARAMETERS.values()) * 4
    resident = flux_dev_run_peak("fp8", offload_rewards=False, offload_encoders=False)
    assert resident["stages"]["update"]["bytes"] - stages["update"]["bytes"] > sum(REWARD_PARAMETERS.values()) * 4
