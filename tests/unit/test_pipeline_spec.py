"""The pipeline's run description refuses what it cannot run (kafka_diode/pipeline.py)."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from kafka_diode.pipeline import MAX_RECEIVER_PORTS, PipelineSpec


@pytest.mark.parametrize("ports", [0, MAX_RECEIVER_PORTS + 1])
def test_receiver_ports_out_of_range_name_the_key(ports: int) -> None:
    with pytest.raises(ConfigError, match="receiver_ports"):
        PipelineSpec(receiver_ports=ports, profile=None)


def test_several_ports_through_the_one_port_relay_are_refused() -> None:
    with pytest.raises(ConfigError, match="relay forwards one port"):
        PipelineSpec(receiver_ports=2, profile="clean")
    assert PipelineSpec(receiver_ports=2, profile=None).receiver_ports == 2
