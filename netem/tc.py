"""The kernel backend: ``tc qdisc ... netem`` on a network device.

``apply`` runs ``tc qdisc replace dev DEV root netem <Profile.to_tc_args()>``, ``clear`` deletes
the root qdisc (no root qdisc is not an error), ``show`` prints ``tc qdisc show dev DEV``. Each can
run inside a network namespace (``ip netns exec NS tc ...``).

Kernels without ``sch_netem`` (this project's build machines, many minimal container hosts) are
recognised from tc's error text and reported as :class:`NetemUnavailableError` with one sentence
saying what to use instead; missing privileges and unknown devices get their own sentence.
"""

from __future__ import annotations

import shutil
import subprocess

from common.errors import ServiceError
from netem.profile import Profile

TIMEOUT_S = 15.0

UNAVAILABLE_HINT = (
    "netem is not available in this kernel (no sch_netem): use 'kafka-diode netem relay', "
    "or a host with sch_netem and NET_ADMIN"
)

# tc's words for "this kernel has no such qdisc" across iproute2/kernel versions.
_NO_NETEM = (
    "specified qdisc kind is unknown",
    "specified qdisc not found",
    'unknown qdisc "netem"',
    "qdisc 'netem' not supported",
)
_NOT_PERMITTED = ("operation not permitted", "permission denied")
_NO_DEVICE = ("cannot find device", "no such device")
_NOTHING_TO_DELETE = (
    "cannot delete qdisc with handle of zero",
    "no such file or directory",
    "invalid handle",
)


class NetemUnavailableError(ServiceError):
    """The kernel has no netem qdisc; the relay is the way to impair traffic here."""

    retriable = False


def classify_error(stderr: str) -> str:
    """One sentence for a failed tc call, from its stderr (pure; unit-tested)."""
    text = stderr.lower()
    if any(s in text for s in _NO_NETEM):
        return UNAVAILABLE_HINT
    if any(s in text for s in _NOT_PERMITTED):
        return "tc needs root or the NET_ADMIN capability: " + stderr.strip().splitlines()[0]
    if any(s in text for s in _NO_DEVICE):
        return "no such network device: " + stderr.strip().splitlines()[0]
    lines = stderr.strip().splitlines()
    return "tc failed: " + (lines[0] if lines else "no error text")


class TcNetem:
    """Apply, clear and show netem on one device, optionally inside a network namespace."""

    def __init__(self, dev: str, *, netns: str | None = None, tc: str = "tc") -> None:
        self.dev = dev
        self.netns = netns
        self._tc = tc

    def _command(self, *args: str) -> list[str]:
        base = [self._tc, *args]
        return ["ip", "netns", "exec", self.netns, *base] if self.netns else base

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        if shutil.which(self._tc) is None:
            raise ServiceError(f"'{self._tc}' is not installed (apt-get install iproute2)")
        try:
            return subprocess.run(
                self._command(*args),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServiceError(f"cannot run tc: {exc}") from exc

    def command_for(self, profile: Profile, *, include_seed: bool = False) -> list[str]:
        """The exact command ``apply`` runs (for ``--dry-run`` and docs)."""
        args = profile.to_tc_args(include_seed=include_seed)
        return self._command("qdisc", "replace", "dev", self.dev, "root", "netem", *args)

    def apply(self, profile: Profile, *, include_seed: bool = False) -> None:
        """Install ``profile`` as the device's root qdisc (``seed`` only when asked: tc 6.3+).

        Raises:
            NetemUnavailableError: the kernel lacks sch_netem.
            ServiceError: any other tc failure, with tc's reason.
        """
        args = profile.to_tc_args(include_seed=include_seed)
        done = self._run("qdisc", "replace", "dev", self.dev, "root", "netem", *args)
        if done.returncode != 0:
            message = classify_error(done.stderr)
            if message == UNAVAILABLE_HINT:
                raise NetemUnavailableError(message)
            raise ServiceError(message)

    def clear(self) -> bool:
        """Remove the root qdisc; returns False when there was none.

        Raises:
            ServiceError: when tc fails for another reason.
        """
        done = self._run("qdisc", "del", "dev", self.dev, "root")
        if done.returncode == 0:
            return True
        if any(s in done.stderr.lower() for s in _NOTHING_TO_DELETE):
            return False
        raise ServiceError(classify_error(done.stderr))

    def show(self) -> str:
        """``tc qdisc show dev DEV`` output.

        Raises:
            ServiceError: when tc fails.
        """
        done = self._run("qdisc", "show", "dev", self.dev)
        if done.returncode != 0:
            raise ServiceError(classify_error(done.stderr))
        return done.stdout
