"""The replay's flags are made from the option models' fields (stagefate/cli/model_options.py):
a flag's default, choices and bound are the field's, and the parsed flags fill the model."""

from __future__ import annotations

import argparse
from typing import get_args

import pytest

from stagefate.cli import build_parser
from stagefate.cli.model_options import add_field_flag
from stagefate.cli.replay_modes import FIELD_FLAGS, replay_options
from stagefate.sim.engine_model import EngineOptions
from stagefate.sim.replay import ReplayOptions


def test_every_flag_left_out_gives_the_model_s_default() -> None:
    args = build_parser().parse_args(["replay"])
    options = replay_options(args, speed=1.0)
    for flag in FIELD_FLAGS.values():
        built = options.engine if flag.model is EngineOptions else options
        assert getattr(built, flag.field) == flag.model.model_fields[flag.field].default, flag.flag


def test_a_flag_s_choices_and_bound_are_its_field_s() -> None:
    policy = add_field_flag(argparse.ArgumentParser(), FIELD_FLAGS["prefetch_policy"])
    field = EngineOptions.model_fields["prefetch_policy"]
    assert list(policy.choices or ()) == list(get_args(field.annotation))
    assert policy.default == field.default == "timeout"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["replay", "--seed", "-1"])  # ReplayOptions.seed: ge=0


def test_parsed_flags_fill_the_models() -> None:
    args = build_parser().parse_args(
        ["replay", "--schedule", "lpm", "--page-size", "32", "--prefetch-threshold", "64"]
    )
    options = replay_options(args, speed=2.0)
    assert options.engine.schedule == "lpm"
    assert (options.page_size, options.prefetch_threshold, options.speed) == (32, 64, 2.0)
    assert ReplayOptions(page_size=32, prefetch_threshold=64, speed=2.0).engine.schedule == "fcfs"
