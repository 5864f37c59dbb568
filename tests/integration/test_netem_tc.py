"""The tc backend against this machine's real kernel, inside a throwaway network namespace.

Where the kernel has sch_netem, apply/show/clear must work; where it does not (this project's
build machines), ``apply`` must say so in one line and exit 1.
"""

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from netem import cli
from netem.profile import NAMED_PROFILES
from netem.tc import UNAVAILABLE_HINT, NetemUnavailableError, TcNetem


@pytest.fixture
def veth_netns() -> Iterator[str]:
    if shutil.which("tc") is None or shutil.which("ip") is None:
        pytest.skip("tc/ip not installed (apt-get install iproute2)")
    name = f"kdnetem{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    try:
        link = subprocess.run(
            ["ip", "netns", "exec", name, "ip", "link", "add", "kdA", "type", "veth", "peer",
             "name", "kdB"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if link.returncode != 0:
            pytest.skip(f"cannot create a veth pair: {link.stderr.strip()}")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _kernel_has_netem(netns: str) -> bool:
    try:
        TcNetem("kdA", netns=netns).apply(NAMED_PROFILES["lossy-1"])
    except NetemUnavailableError:
        return False
    return True


def test_apply_show_clear_or_report_unavailable(
    veth_netns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tc = TcNetem("kdA", netns=veth_netns)
    if _kernel_has_netem(veth_netns):
        assert "netem" in tc.show()
        assert "loss 1%" in tc.show()
        assert tc.clear() is True
        assert "netem" not in tc.show()
        assert tc.clear() is False
        return
    code = cli.main(["apply", "--dev", "kdA", "--netns", veth_netns, "--profile", "lossy-5"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == UNAVAILABLE_HINT
    assert len(err.strip().splitlines()) == 1
    # clear/show still work on such a kernel: there is simply no netem to remove.
    assert cli.main(["clear", "--dev", "kdA", "--netns", veth_netns]) == 0
    assert cli.main(["show", "--dev", "kdA", "--netns", veth_netns]) == 0


def test_unknown_device_is_a_clear_failure(
    veth_netns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["apply", "--dev", "nosuch0", "--netns", veth_netns, "--profile", "lossy-5"])
    err = capsys.readouterr().err
    assert code == 1
    assert "nosuch0" in err or "netem is not available" in err
