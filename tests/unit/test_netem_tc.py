"""tc error classification (netem/tc.py), pure."""

import pytest

from netem.profile import NAMED_PROFILES
from netem.tc import UNAVAILABLE_HINT, TcNetem, classify_error


@pytest.mark.parametrize(
    "stderr",
    [
        "Error: Specified qdisc kind is unknown.\n",
        'Unknown qdisc "netem", hence option "loss" is unparsable\n',
        "RTNETLINK answers: No such file or directory\nError: Specified qdisc not found.\n",
    ],
)
def test_missing_netem_is_recognised(stderr: str) -> None:
    assert classify_error(stderr) == UNAVAILABLE_HINT


def test_other_failures_get_their_own_sentence() -> None:
    assert "NET_ADMIN" in classify_error("RTNETLINK answers: Operation not permitted\n")
    assert "no such network device" in classify_error('Cannot find device "eth9"\n')
    assert classify_error("weird\n") == "tc failed: weird"
    assert classify_error("") == "tc failed: no error text"


def test_command_inside_a_namespace() -> None:
    cmd = TcNetem("veth0", netns="ns1").command_for(NAMED_PROFILES["lossy-1"])
    assert cmd == [
        "ip", "netns", "exec", "ns1", "tc", "qdisc", "replace", "dev", "veth0", "root", "netem",
        "limit", "1000", "loss", "random", "1%",
    ]  # fmt: skip
