"""The one warning every unpaced sender gets: a diode cannot push back.

A sender that emits faster than the link (or the receiver) carries loses datagrams on any real
diode, silently at send time; they only surface later as gaps. Pacing (``rate_bytes``, or
``rate_datagrams``) is therefore the safe choice, and its absence is said out loud by
``--check-config`` (on stderr, beside the JSON) and at start-up (a WARNING), for ``send`` and
``resend`` alike. Pure: it looks at the configuration only.
"""

from __future__ import annotations

from sender.config import SenderConfig


def pacing_warning(config: SenderConfig) -> str | None:
    """One line when neither ``rate_bytes`` nor ``rate_datagrams`` is set, else ``None``."""
    if config.rate_bytes > 0 or config.rate_datagrams > 0:
        return None
    return (
        "pacing is off (rate_bytes = 0): the sender sends as fast as it can read, and a diode "
        "cannot push back, so anything beyond the link's or receiver's capacity is lost (as "
        "gaps). Set --rate-bytes (DIODE_SENDER_RATE_BYTES, TOML rate_bytes) to about 80 % of "
        "the link's bytes/s, e.g. --rate-bytes 100000000 for a 1 Gbit/s diode"
    )
